/* download — plan and run a model download (see download.h): list the files, choose the ones
 * this plan needs, then fetch them (transfer.c for whole files, ranges.c for a stage's byte
 * ranges) in one or two phases. The pieces live beside it behind download_internal.h: engine.c
 * (the run's shared state), hashing.c (receive ring and running hashes), transfer.c, ranges.c
 * and plan.c. This file only sequences them and reports. */
#include "download/download.h"

#include "base/paths.h"
#include "download/download_internal.h"
#include "model/store.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum download_error download_model(const download_request *req, download_result *res) {
    memset(res, 0, sizeof *res);
    engine e = {.req = req, .res = res};
    hf_config env_hf;
    if (!req->hf) hf_config_from_env(&env_hf);
    e.hf = req->hf ? req->hf : &env_hf;
    e.parallel = req->parallel > 0 ? req->parallel : 8;
    e.max_retries = req->max_retries > 0 ? req->max_retries : 5;
    e.backoff_ms = req->backoff_ms > 0 ? req->backoff_ms : 1000;
    e.interval_ms = req->progress_interval_ms > 0 ? req->progress_interval_ms : 1000;
    char why[1024];
    if (store_id_valid(req->model_id, why, sizeof why) < 0) {
        engine_set_result(&e, DOWNLOAD_ERR_BAD_INPUT, "invalid model id '%s': %s", req->model_id,
                          why);
        return res->error;
    }
    model_store st;
    if (store_init(&st, req->models_dir, NULL, why, sizeof why) < 0 ||
        store_write_dir(&st, req->model_id, e.dir, sizeof e.dir) < 0) {
        engine_set_result(&e, DOWNLOAD_ERR_BAD_INPUT, "bad models dir: %s", why);
        return res->error;
    }
    snprintf(res->model_dir, sizeof res->model_dir, "%s", e.dir);
    download_curl_init();

    hf_file_list list = {0};
    int have_local = plan_read_local_manifest(e.dir, &list) == 0;
    int whole = req->layer_end <= 0;
    if (have_local && whole && store_dir_state(e.dir) == STORE_COMPLETE) goto done_ok;
    if (req->offline) {
        if (!have_local) {
            engine_set_result(
                &e, DOWNLOAD_ERR_OFFLINE,
                "offline mode: %s is not in %s and cannot be downloaded; run once online or "
                "copy it there",
                req->model_id, e.dir);
            return res->error;
        }
    } else {
        if (have_local) hf_file_list_free(&list);
        if (plan_list_files(&e, &list) != DOWNLOAD_OK) return res->error;
    }
    e.n = 0;
    e.files = calloc(list.n ? list.n : 1, sizeof *e.files);
    if (!e.files) abort();
    int has_safetensors = 0;
    for (size_t i = 0; i < list.n; i++)
        has_safetensors |= plan_is_weight_file(list.files[i].path, 1);
    /* a GGUF repository: one quantization's file and nothing else (it holds the tokenizer and
     * the chat template); a pipeline stage needs all of it too */
    int gguf_pick = -1;
    if (plan_is_gguf_choice(&list, req->model_id)) {
        if ((gguf_pick = plan_pick_gguf(&list, req->model_id, why, sizeof why)) < 0) {
            engine_set_result(&e, DOWNLOAD_ERR_NOT_FOUND, "%s", why);
            hf_file_list_free(&list);
            goto out;
        }
        whole = 1;
    }
    for (size_t i = 0; i < list.n; i++) {
        /* never wanted: git metadata, and other weight formats when safetensors exist */
        if (!strcmp(list.files[i].path, ".gitattributes") ||
            (has_safetensors && plan_is_weight_file(list.files[i].path, 0) &&
             !plan_is_weight_file(list.files[i].path, 1)) ||
            (gguf_pick >= 0 && i != (size_t)gguf_pick))
            continue;
        plan_file *pf = &e.files[e.n++];
        pf->f = list.files[i];
        pf->fd = -1;
        pf->eng = &e;
        pf->use_peer = 0;
        if (e.peer_base)
            for (int k = 0; k < req->n_peers; k++)
                if (req->peers[k] == e.peer_base) pf->use_peer = k + 1;
        /* phase 1 of a shard: everything but the weights */
        pf->needed = whole || !plan_is_weight_file(pf->f.path, 0);
    }
    hf_file_list_free(&list);
    if (paths_mkdir_p(e.dir) < 0) {
        engine_set_result(&e, errno == ENOSPC ? DOWNLOAD_ERR_DISK_FULL : DOWNLOAD_ERR_IO,
                          "cannot create %s: %s", e.dir, strerror(errno));
        goto out;
    }
    if (!req->offline && plan_manifest_write(&e) < 0) {
        engine_set_result(&e, DOWNLOAD_ERR_IO, "cannot write the manifest in %s: %s", e.dir,
                          strerror(errno));
        goto out;
    }
    plan_mark_present(&e);
    e.started = engine_now_s();
    for (int phase = whole ? 1 : 0; phase < 2; phase++) {
        if (phase == 1 && !whole && plan_select_shard(&e) < 0) goto out;
        if (phase == 1 && !whole) plan_mark_present(&e);
        for (size_t i = 0; i < e.n; i++)
            res->files_planned += phase == 1 && e.files[i].needed;
        if (req->offline) {
            for (size_t i = 0; i < e.n; i++)
                if (e.files[i].needed && !e.files[i].done) {
                    engine_set_result(&e, DOWNLOAD_ERR_OFFLINE,
                                      "offline mode: %s of %s is missing and cannot be downloaded",
                                      e.files[i].f.path, req->model_id);
                    goto out;
                }
            continue;
        }
        if (plan_check_space(&e) < 0) goto out;
        engine_report(&e, DOWNLOAD_ONGOING, 1);
        if (!e.ring) e.ring = ring_start();
        int erc = transfer_run(&e);
        ring_drain(e.ring);
        if (transfer_write_error(&e, NULL)) goto out; /* a write failed after its transfer ended */
        if (erc < 0) goto out;
        if (phase == 1 && !whole) {
            int any_whole = 0;
            if (ranges_fetch_files(&e) < 0) goto out;
            for (size_t i = 0; i < e.n; i++)
                any_whole |= e.files[i].needed && !e.files[i].done;
            if (any_whole && (plan_check_space(&e) < 0 || transfer_run(&e) < 0)) goto out;
        }
    }
    engine_report(&e, DOWNLOAD_COMPLETED, 1);
out:
    if (res->error) engine_report(&e, DOWNLOAD_FAILED, 1);
    ring_stop(e.ring);
    for (size_t i = 0; i < e.n; i++)
        EVP_MD_CTX_free(e.files[i].md);
    free(e.files);
    return res->error;
done_ok:
    if (req->progress) {
        download_progress p = {
            .model_id = req->model_id, .status = DOWNLOAD_COMPLETED, .eta_seconds = 0};
        for (size_t i = 0; i < list.n; i++)
            p.total_bytes += list.files[i].size;
        p.downloaded_bytes = p.total_bytes;
        p.files_done = p.files_total = (int)list.n;
        req->progress(&p, req->progress_ud);
    }
    res->files_planned = (int)list.n;
    hf_file_list_free(&list);
    return DOWNLOAD_OK;
}

int download_model_blocking(const char *model_id, download_progress_fn progress, void *ud,
                            char *model_dir, size_t model_dir_len, char *err, size_t errlen) {
    char models[1024];
    const char *env = getenv("EXO_MODELS_DIR");
    if (env && *env)
        snprintf(models, sizeof models, "%s", env);
    else {
        char data[900];
        if (paths_default_data_dir(data, sizeof data) < 0) {
            snprintf(err, errlen, "cannot find a data directory (set EXO_MODELS_DIR)");
            return -1;
        }
        snprintf(models, sizeof models, "%s/models", data);
    }
    const char *off = getenv("EXO_OFFLINE");
    download_request req = {.model_id = model_id,
                            .models_dir = models,
                            .offline = off && *off && strcmp(off, "0"),
                            .progress = progress,
                            .progress_ud = ud};
    download_result res;
    if (download_model(&req, &res) != DOWNLOAD_OK) {
        snprintf(err, errlen, "%s", res.message);
        return -1;
    }
    if (model_dir) snprintf(model_dir, model_dir_len, "%s", res.model_dir);
    return 0;
}

static void human(char *out, size_t n, double bytes) {
    const char *u[] = {"B", "KB", "MB", "GB", "TB"};
    int i = 0;
    while (bytes >= 1000 && i < 4)
        bytes /= 1000, i++;
    snprintf(out, n, i ? "%.1f %s" : "%.0f %s", bytes, u[i]);
}

void download_progress_bar(const download_progress *p, void *ud) {
    FILE *f = ud ? ud : stderr;
    char done[32], total[32], speed[32];
    human(done, sizeof done, (double)p->downloaded_bytes);
    human(total, sizeof total, (double)p->total_bytes);
    human(speed, sizeof speed, p->speed);
    double frac = p->total_bytes ? (double)p->downloaded_bytes / (double)p->total_bytes : 1;
    char bar[31];
    int fill = (int)(frac * 30);
    for (int i = 0; i < 30; i++)
        bar[i] = i < fill ? '#' : '.';
    bar[30] = 0;
    int tty = isatty(fileno(f));
    if (p->status == DOWNLOAD_FAILED) {
        fprintf(f, "%sdownload failed: %s\n", tty ? "\r\033[K" : "", p->message ? p->message : "");
        return;
    }
    char eta[32] = "--";
    if (p->eta_seconds >= 0)
        snprintf(eta, sizeof eta, "%dm%02ds", (int)p->eta_seconds / 60, (int)p->eta_seconds % 60);
    fprintf(f, "%s%s [%s] %5.1f%% %s/%s %s/s ETA %s files %d/%d%s", tty ? "\r\033[K" : "",
            p->model_id, bar, frac * 100, done, total, speed, eta, p->files_done, p->files_total,
            tty && p->status == DOWNLOAD_ONGOING ? "" : "\n");
    fflush(f);
}
