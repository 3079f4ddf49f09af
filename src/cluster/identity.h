/* cluster/identity — who this node is, and the cluster secret it proves membership with.
 *
 * Node identity lives in --data-dir: `node_id` (a UUID, created on first start) and `node_key`
 * (a CURVE keypair, mode 0600). Both are reused after a restart; the friendly name is the host
 * name. The cluster secret is one CURVE keypair every member derives from the same material:
 * the namespace by default (zero-config, as exo), or the contents of --cluster-key FILE.
 * Holding it is what admits a node; a node without it can neither read nor inject traffic.
 * The beacon hash (8 bytes, derived from the namespace only) lets clusters in different
 * namespaces ignore each other's beacons; it is not a secret. */
#ifndef EXO_CLUSTER_IDENTITY_H
#define EXO_CLUSTER_IDENTITY_H

#include <stddef.h>
#include <stdint.h>

typedef struct cluster_identity {
    char node_id[40];
    char friendly_name[256];
    char public_key[41]; /* Z85 */
    unsigned char secret_key[32];
} cluster_identity;

typedef struct cluster_secret {
    unsigned char public_key[32];
    unsigned char secret_key[32];
    unsigned char beacon_hash[8];
} cluster_secret;

/* Loads data_dir/node_id and data_dir/node_key, creating them when absent. Refuses (returns -1
 * with err set) when a file exists but is unreadable or malformed, rather than replacing it. */
int cluster_identity_load(const char *data_dir, cluster_identity *id, char *err, size_t errlen);

/* Derives the cluster keypair from the namespace and, when key_file is non-empty, the file's
 * contents (at least 16 bytes). Returns 0 or -1 with err set. */
int cluster_secret_derive(const char *namespace_name, const char *key_file, cluster_secret *out,
                          char *err, size_t errlen);

#endif
