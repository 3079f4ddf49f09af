/* cluster/identity — persistent node id and keypair; cluster secret derivation (identity.h). */
#include "cluster/identity.h"

#include "base/paths.h"

#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

static int write_file_atomic(const char *path, const char *text, char *err, size_t errlen) {
    char tmp[1200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        snprintf(err, errlen, "cannot create %s: %s", tmp, strerror(errno));
        return -1;
    }
    size_t n = strlen(text);
    int ok = write(fd, text, n) == (ssize_t)n && fsync(fd) == 0;
    close(fd);
    if (!ok || rename(tmp, path)) {
        snprintf(err, errlen, "cannot write %s: %s", path, strerror(errno));
        unlink(tmp);
        return -1;
    }
    return 0;
}

static void trim(char *s) {
    size_t n = strlen(s);
    while (n && (s[n - 1] == '\n' || s[n - 1] == '\r' || s[n - 1] == ' ')) s[--n] = 0;
}

static int load_node_id(const char *data_dir, cluster_identity *id, char *err, size_t errlen) {
    char path[1100];
    snprintf(path, sizeof path, "%s/node_id", data_dir);
    if (paths_is_file(path)) {
        size_t len;
        char *text = paths_read_file(path, 256, &len);
        if (!text) {
            snprintf(err, errlen, "cannot read %s: %s", path, strerror(errno));
            return -1;
        }
        trim(text);
        size_t n = strlen(text);
        int ok = n >= 8 && n < sizeof id->node_id;
        for (size_t i = 0; ok && i < n; i++)
            ok = (text[i] >= '0' && text[i] <= '9') || (text[i] >= 'a' && text[i] <= 'z') ||
                 (text[i] >= 'A' && text[i] <= 'Z') || text[i] == '-' || text[i] == '_';
        if (!ok) {
            snprintf(err, errlen, "%s does not hold a node id; remove it to get a new one", path);
            free(text);
            return -1;
        }
        memcpy(id->node_id, text, n + 1);
        free(text);
        return 0;
    }
    unsigned char b[16];
    randombytes_buf(b, sizeof b);
    b[6] = (unsigned char)((b[6] & 0x0f) | 0x40); /* UUID version 4 */
    b[8] = (unsigned char)((b[8] & 0x3f) | 0x80);
    snprintf(id->node_id, sizeof id->node_id,
             "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
             b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14],
             b[15]);
    char text[64];
    snprintf(text, sizeof text, "%s\n", id->node_id);
    return write_file_atomic(path, text, err, errlen);
}

static int load_node_key(const char *data_dir, cluster_identity *id, char *err, size_t errlen) {
    char path[1100];
    snprintf(path, sizeof path, "%s/node_key", data_dir);
    unsigned char pk[32];
    if (paths_is_file(path)) {
        size_t len;
        char *text = paths_read_file(path, 4096, &len);
        char pub[64] = "", sec[64] = "";
        int ok = text && sscanf(text, "public %45s secret %45s", pub, sec) == 2 &&
                 strlen(pub) == 40 && strlen(sec) == 40 && zmq_z85_decode(pk, pub) &&
                 zmq_z85_decode(id->secret_key, sec);
        free(text);
        if (!ok) {
            snprintf(err, errlen, "%s is not a node key file; remove it to get a new key", path);
            return -1;
        }
        memcpy(id->public_key, pub, 41);
        return 0;
    }
    crypto_box_keypair(pk, id->secret_key);
    char sec[41];
    zmq_z85_encode(id->public_key, pk, 32);
    zmq_z85_encode(sec, id->secret_key, 32);
    char text[160];
    snprintf(text, sizeof text, "public %s\nsecret %s\n", id->public_key, sec);
    sodium_memzero(sec, sizeof sec);
    int rc = write_file_atomic(path, text, err, errlen);
    sodium_memzero(text, sizeof text);
    return rc;
}

int cluster_identity_load(const char *data_dir, cluster_identity *id, char *err, size_t errlen) {
    memset(id, 0, sizeof *id);
    if (sodium_init() < 0) {
        snprintf(err, errlen, "libsodium failed to initialise");
        return -1;
    }
    if (paths_mkdir_p(data_dir)) {
        snprintf(err, errlen, "cannot create data dir %s: %s", data_dir, strerror(errno));
        return -1;
    }
    if (load_node_id(data_dir, id, err, errlen) || load_node_key(data_dir, id, err, errlen))
        return -1;
    if (gethostname(id->friendly_name, sizeof id->friendly_name - 1) || !id->friendly_name[0])
        snprintf(id->friendly_name, sizeof id->friendly_name, "exo-%.8s", id->node_id);
    return 0;
}

int cluster_secret_derive(const char *namespace_name, const char *key_file, cluster_secret *out,
                          char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    if (sodium_init() < 0) {
        snprintf(err, errlen, "libsodium failed to initialise");
        return -1;
    }
    crypto_generichash_state h;
    crypto_generichash_init(&h, NULL, 0, 32);
    static const char domain[] = "exo-cluster-secret-v1";
    crypto_generichash_update(&h, (const unsigned char *)domain, sizeof domain);
    crypto_generichash_update(&h, (const unsigned char *)namespace_name,
                              strlen(namespace_name) + 1);
    if (key_file && key_file[0]) {
        size_t len = 0;
        char *key = paths_read_file(key_file, 1 << 20, &len);
        if (!key) {
            snprintf(err, errlen, "--cluster-key %s: cannot read it: %s", key_file,
                     strerror(errno));
            return -1;
        }
        if (len < 16) {
            snprintf(err, errlen,
                     "--cluster-key %s: holds %zu bytes; use at least 16 random bytes "
                     "(e.g. head -c 32 /dev/urandom | base64 > FILE)",
                     key_file, len);
            sodium_memzero(key, len);
            free(key);
            return -1;
        }
        crypto_generichash_update(&h, (const unsigned char *)key, len);
        sodium_memzero(key, len);
        free(key);
    }
    unsigned char seed[32];
    crypto_generichash_final(&h, seed, sizeof seed);
    crypto_box_seed_keypair(out->public_key, out->secret_key, seed);
    sodium_memzero(seed, sizeof seed);
    static const char beacon_domain[] = "exo-beacon-v1";
    crypto_generichash_init(&h, NULL, 0, sizeof out->beacon_hash);
    crypto_generichash_update(&h, (const unsigned char *)beacon_domain, sizeof beacon_domain);
    crypto_generichash_update(&h, (const unsigned char *)namespace_name,
                              strlen(namespace_name) + 1);
    crypto_generichash_final(&h, out->beacon_hash, sizeof out->beacon_hash);
    return 0;
}
