#include "cmd/options.h"

#include "base/paths.h"
#include "compute/device.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void options_defaults(exo_options *o) {
    memset(o, 0, sizeof *o);
    o->api_port = 52415;
    o->listen_port = 52414;
    o->discovery_port = 52413;
    snprintf(o->namespace_name, sizeof o->namespace_name, "default");
    if (paths_default_data_dir(o->data_dir, sizeof o->data_dir) != 0) o->data_dir[0] = 0;
    o->max_body_bytes = 32u << 20;
    o->max_runners = 8;
    o->max_connections_per_ip = 512;
}

static int env_true(const char *name) {
    const char *v = getenv(name);
    return v && v[0] && strcmp(v, "0") != 0 && strcasecmp(v, "false") != 0;
}

static int copy_value(char *dst, size_t n, const char *v, const char *flag, char *err, size_t errlen) {
    if (strlen(v) >= n) {
        snprintf(err, errlen, "%s: value too long (max %zu bytes)", flag, n - 1);
        return -1;
    }
    memcpy(dst, v, strlen(v) + 1);
    return 0;
}

static int options_set_device(exo_options *o, const char *v, char *err, size_t errlen) {
    compute_device d;
    if (compute_device_check(v, &d, err, errlen)) return -1;
    snprintf(o->device, sizeof o->device, "%s", compute_device_name(d));
    return 0;
}

static int parse_port(const char *v, int *out, const char *flag, char *err, size_t errlen) {
    char *end;
    errno = 0;
    long p = strtol(v, &end, 10);
    if (errno || *end || end == v || p < 0 || p > 65535) {
        snprintf(err, errlen, "%s: '%s' is not a port number (0-65535)", flag, v);
        return -1;
    }
    *out = (int)p;
    return 0;
}

static int parse_count(const char *v, int min, int *out, const char *flag, char *err,
                       size_t errlen) {
    char *end;
    errno = 0;
    long n = strtol(v, &end, 10);
    if (errno || *end || end == v || n < min || n > 1000000) {
        snprintf(err, errlen, "%s: '%s' is not a whole number from %d to 1000000", flag, v, min);
        return -1;
    }
    *out = (int)n;
    return 0;
}

int options_parse_size(const char *s, size_t *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || s[0] == '-') return -1;
    unsigned long long mul = 1;
    if (*end) {
        switch (*end) {
        case 'k': case 'K': mul = 1ull << 10; break;
        case 'm': case 'M': mul = 1ull << 20; break;
        case 'g': case 'G': mul = 1ull << 30; break;
        default: return -1;
        }
        end++;
        if (*end == 'i' || *end == 'I') end++;
        if (*end == 'b' || *end == 'B') end++;
        if (*end) return -1;
    }
    if (v > (~0ull) / mul) return -1;
    *out = (size_t)(v * mul);
    return 0;
}

void options_print_help(const char *prog) {
    printf("exo — turn the computers on a network into one AI cluster\n\n"
           "Usage:\n"
           "  %s [flags]                 start a node (API and dashboard on port 52415)\n"
           "  %s run MODEL [PROMPT]      run a model in this terminal (see `%s run --help`)\n"
           "  %s bench [flags]           measure this machine and the engine (see `%s bench --help`)\n"
           "  %s runner ...              internal: a model runner process started by the node\n\n"
           "Node flags:\n"
           "  --api-port N          HTTP API and dashboard port (default 52415)\n"
           "  --models-dir DIR      writable models directory (env EXO_MODELS_DIR;\n"
           "                        default $XDG_DATA_HOME/exo/models)\n"
           "  --models-path DIRS    read-only model directories, colon-separated (env EXO_MODELS_PATH)\n"
           "  --data-dir DIR        identity, logs and event log (default $XDG_DATA_HOME/exo)\n"
           "  --offline             never download; use local files only (env EXO_OFFLINE)\n"
           "  --namespace NAME      cluster namespace: nodes join only their own (default \"default\")\n"
           "  --cluster-key FILE    secret for cluster traffic (default: derived from the namespace)\n"
           "  --no-worker           this node serves the API but runs no models\n"
           "  --no-api              this node runs models but serves no HTTP\n"
           "  --peer HOST:PORT      a peer to connect to where broadcast does not reach (repeatable)\n"
           "  --listen-port N       cluster traffic port (default 52414)\n"
           "  --discovery-port N    UDP discovery beacon port (default 52413)\n"
           "  --api-key KEY         require `Authorization: Bearer KEY` (env EXO_API_KEY)\n"
           "  --model ID|DIR        place this model when the node starts (a DIR must sit in a\n"
           "                        models directory: --models-dir or --models-path)\n"
           "  --max-body-size SIZE  largest accepted HTTP request body (default 32M)\n"
           "  --kv-cache-mem SIZE   KV cache budget per runner (default: automatic)\n"
           "  --kv-cache-dtype T    f16 (default), bf16 or f32: how runners store K/V (f32\n"
           "                        doubles the memory; tensor-parallel logprobs then match\n"
           "                        one node's to ~1e-6 instead of ~1e-3)\n"
           "  --device DEV          cpu, cuda or auto: what runners compute on (env EXO_DEVICE;\n"
           "                        default auto: the GPU when this build has CUDA and one is present)\n"
           "  --max-runners N       runner processes (placed models) this node starts (default 8)\n"
           "  --speculative M       runners' speculative decoding: ngram (prompt lookup),\n"
           "                        mtp (the checkpoint's MTP head: Qwen3-Next / Qwen3.5 models\n"
           "                        that have one), draft:DIR (a small model of the same\n"
           "                        tokenizer) or off (default; one-process instances only)\n"
           "  --spec-k N            most tokens drafted per step (default 4, at most 16)\n"
           "  --max-connections-per-ip N\n"
           "                        open HTTP connections from one address; more are refused\n"
           "                        (default 512; 0 = no limit, e.g. behind a proxy)\n"
           "  -v, --verbose         more logging (repeat for debug)\n"
           "  -q, --quiet           less logging\n"
           "  -h, --help            this help\n"
           "  --version             print the version\n",
           prog, prog, prog, prog, prog, prog);
}

/* Flags that take a value accept both "--flag VALUE" and "--flag=VALUE". */
static const char *flag_value(int argc, char **argv, int *i, const char *arg, const char *name) {
    size_t n = strlen(name);
    if (strncmp(arg, name, n) != 0) return NULL;
    if (arg[n] == '=') return arg + n + 1;
    if (arg[n] != 0) return NULL;
    if (*i + 1 >= argc) return "";
    return argv[++*i];
}

enum options_result options_parse(exo_options *o, int argc, char **argv, char *err, size_t errlen) {
    const char *env;
    if ((env = getenv("EXO_MODELS_DIR")) && env[0] &&
        copy_value(o->models_dir, sizeof o->models_dir, env, "EXO_MODELS_DIR", err, errlen))
        return OPTIONS_ERROR;
    if ((env = getenv("EXO_MODELS_PATH")) && env[0] &&
        copy_value(o->models_path, sizeof o->models_path, env, "EXO_MODELS_PATH", err, errlen))
        return OPTIONS_ERROR;
    if ((env = getenv("EXO_API_KEY")) && env[0] &&
        copy_value(o->api_key, sizeof o->api_key, env, "EXO_API_KEY", err, errlen))
        return OPTIONS_ERROR;
    if (env_true("EXO_OFFLINE")) o->offline = 1;
    if ((env = getenv("EXO_DEVICE")) && env[0] && options_set_device(o, env, err, errlen))
        return OPTIONS_ERROR;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v;
#define VALUE(name)                                                                                \
    ((v = flag_value(argc, argv, &i, a, name)) != NULL)
#define REQUIRE_VALUE(name)                                                                        \
    do {                                                                                           \
        if (!v[0]) {                                                                               \
            snprintf(err, errlen, "%s needs a value", name);                                       \
            return OPTIONS_ERROR;                                                                  \
        }                                                                                          \
    } while (0)
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            options_print_help("exo");
            return OPTIONS_EXIT;
        } else if (!strcmp(a, "--version")) {
            printf("exo %s\n", EXO_VERSION);
            return OPTIONS_EXIT;
        } else if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) {
            o->verbosity++;
        } else if (!strcmp(a, "-vv")) {
            o->verbosity += 2;
        } else if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) {
            o->verbosity--;
        } else if (!strcmp(a, "--offline")) {
            o->offline = 1;
        } else if (!strcmp(a, "--no-worker")) {
            o->no_worker = 1;
        } else if (!strcmp(a, "--no-api")) {
            o->no_api = 1;
        } else if (VALUE("--api-port")) {
            REQUIRE_VALUE("--api-port");
            if (parse_port(v, &o->api_port, "--api-port", err, errlen)) return OPTIONS_ERROR;
        } else if (VALUE("--listen-port")) {
            REQUIRE_VALUE("--listen-port");
            if (parse_port(v, &o->listen_port, "--listen-port", err, errlen)) return OPTIONS_ERROR;
        } else if (VALUE("--discovery-port")) {
            REQUIRE_VALUE("--discovery-port");
            if (parse_port(v, &o->discovery_port, "--discovery-port", err, errlen))
                return OPTIONS_ERROR;
        } else if (VALUE("--models-dir")) {
            REQUIRE_VALUE("--models-dir");
            if (copy_value(o->models_dir, sizeof o->models_dir, v, "--models-dir", err, errlen))
                return OPTIONS_ERROR;
        } else if (VALUE("--models-path")) {
            REQUIRE_VALUE("--models-path");
            if (copy_value(o->models_path, sizeof o->models_path, v, "--models-path", err, errlen))
                return OPTIONS_ERROR;
        } else if (VALUE("--data-dir")) {
            REQUIRE_VALUE("--data-dir");
            if (copy_value(o->data_dir, sizeof o->data_dir, v, "--data-dir", err, errlen))
                return OPTIONS_ERROR;
        } else if (VALUE("--namespace")) {
            REQUIRE_VALUE("--namespace");
            if (copy_value(o->namespace_name, sizeof o->namespace_name, v, "--namespace", err,
                           errlen))
                return OPTIONS_ERROR;
        } else if (VALUE("--cluster-key")) {
            REQUIRE_VALUE("--cluster-key");
            if (copy_value(o->cluster_key_file, sizeof o->cluster_key_file, v, "--cluster-key",
                           err, errlen))
                return OPTIONS_ERROR;
        } else if (VALUE("--api-key")) {
            REQUIRE_VALUE("--api-key");
            if (copy_value(o->api_key, sizeof o->api_key, v, "--api-key", err, errlen))
                return OPTIONS_ERROR;
        } else if (VALUE("--model")) {
            REQUIRE_VALUE("--model");
            if (copy_value(o->default_model, sizeof o->default_model, v, "--model", err, errlen))
                return OPTIONS_ERROR;
        } else if (VALUE("--max-body-size")) {
            REQUIRE_VALUE("--max-body-size");
            if (options_parse_size(v, &o->max_body_bytes) || o->max_body_bytes == 0) {
                snprintf(err, errlen, "--max-body-size: '%s' is not a size (e.g. 32M)", v);
                return OPTIONS_ERROR;
            }
        } else if (VALUE("--device")) {
            REQUIRE_VALUE("--device");
            if (options_set_device(o, v, err, errlen)) return OPTIONS_ERROR;
        } else if (VALUE("--kv-cache-mem")) {
            REQUIRE_VALUE("--kv-cache-mem");
            if (options_parse_size(v, &o->kv_cache_bytes)) {
                snprintf(err, errlen, "--kv-cache-mem: '%s' is not a size (e.g. 4G)", v);
                return OPTIONS_ERROR;
            }
        } else if (VALUE("--kv-cache-dtype")) {
            REQUIRE_VALUE("--kv-cache-dtype");
            if (strcmp(v, "f16") && strcmp(v, "bf16") && strcmp(v, "f32")) {
                snprintf(err, errlen, "--kv-cache-dtype: '%s' is not f16, bf16 or f32", v);
                return OPTIONS_ERROR;
            }
            snprintf(o->kv_cache_dtype, sizeof o->kv_cache_dtype, "%s", v);
        } else if (VALUE("--speculative")) {
            REQUIRE_VALUE("--speculative");
            if (strcmp(v, "off") && strcmp(v, "ngram") && strcmp(v, "mtp") &&
                (strncmp(v, "draft:", 6) || !v[6])) {
                snprintf(err, errlen,
                         "--speculative: '%.64s' is not one of off, ngram, mtp, draft:DIR", v);
                return OPTIONS_ERROR;
            }
            snprintf(o->speculative, sizeof o->speculative, "%s", v);
        } else if (VALUE("--spec-k")) {
            REQUIRE_VALUE("--spec-k");
            if (parse_count(v, 1, &o->spec_tokens, "--spec-k", err, errlen) || o->spec_tokens > 16) {
                snprintf(err, errlen, "--spec-k: '%.32s' is not a count in 1..16", v);
                return OPTIONS_ERROR;
            }
        } else if (VALUE("--max-runners")) {
            REQUIRE_VALUE("--max-runners");
            if (parse_count(v, 1, &o->max_runners, "--max-runners", err, errlen))
                return OPTIONS_ERROR;
        } else if (VALUE("--max-connections-per-ip")) {
            REQUIRE_VALUE("--max-connections-per-ip");
            if (parse_count(v, 0, &o->max_connections_per_ip, "--max-connections-per-ip", err,
                            errlen))
                return OPTIONS_ERROR;
        } else if (VALUE("--peer")) {
            REQUIRE_VALUE("--peer");
            const char *colon = strrchr(v, ':');
            int port;
            if (!colon || colon == v || parse_port(colon + 1, &port, "--peer", err, errlen) ||
                port == 0) {
                snprintf(err, errlen, "--peer: '%s' is not HOST:PORT", v);
                return OPTIONS_ERROR;
            }
            if (o->n_peers >= OPTIONS_MAX_PEERS) {
                snprintf(err, errlen, "--peer: at most %d peers", OPTIONS_MAX_PEERS);
                return OPTIONS_ERROR;
            }
            o->peers[o->n_peers++] = v;
        } else {
            snprintf(err, errlen, "unknown flag or argument '%s' (see exo --help)", a);
            return OPTIONS_ERROR;
        }
#undef VALUE
#undef REQUIRE_VALUE
    }
    if (!o->models_dir[0]) {
        int w = snprintf(o->models_dir, sizeof o->models_dir, "%s/models", o->data_dir);
        if (w < 0 || (size_t)w >= sizeof o->models_dir) {
            snprintf(err, errlen, "--data-dir too long");
            return OPTIONS_ERROR;
        }
    }
    return OPTIONS_OK;
}
