/* options — the node's command-line flags and environment variables, parsed into one struct.
 * `exo` (start a node) is configured only through this; subcommands parse their own flags. */
#ifndef EXO_OPTIONS_H
#define EXO_OPTIONS_H

#include <stddef.h>

#define OPTIONS_MAX_PEERS 64

typedef struct exo_options {
    int api_port;             /* --api-port, default 52415 */
    char models_dir[1024];    /* --models-dir / EXO_MODELS_DIR, default $XDG_DATA_HOME/exo/models */
    char models_path[4096];   /* --models-path / EXO_MODELS_PATH: read-only dirs, colon-separated */
    char data_dir[1024];      /* --data-dir: identity, logs, event log; default $XDG_DATA_HOME/exo */
    int offline;              /* --offline / EXO_OFFLINE */
    char namespace_name[128]; /* --namespace, default "default" */
    int no_worker;            /* --no-worker: this node runs no models */
    int no_api;               /* --no-api: serve no HTTP */
    const char *peers[OPTIONS_MAX_PEERS]; /* --peer HOST:PORT, repeatable (points into argv) */
    int n_peers;
    int listen_port;          /* --listen-port, cluster traffic, default 52414 */
    int discovery_port;       /* --discovery-port, UDP beacons, default 52413 */
    int verbosity;            /* -v raises, -q lowers; 0 = info */
    char api_key[256];        /* --api-key / EXO_API_KEY: when set, the API requires it */
    char cluster_key_file[1024]; /* --cluster-key FILE: secret for cluster traffic */
    char default_model[1024]; /* --model ID|DIR: a model to place at start (used by `make run`) */
    size_t max_body_bytes;    /* --max-body-size BYTES, default 32 MiB */
    size_t kv_cache_bytes;    /* --kv-cache-mem BYTES (suffix K/M/G allowed), 0 = automatic */
    char kv_cache_dtype[8];   /* --kv-cache-dtype f16|bf16|f32, "" = the engine's default (f16) */
    char device[8];           /* --device cpu|cuda|auto (EXO_DEVICE), what runners compute on */
    int max_runners;          /* --max-runners N: runner processes this node starts, default 8 */
    int max_connections_per_ip; /* --max-connections-per-ip N: 0 = no limit, default 512 */
    char speculative[1100];   /* --speculative ngram|mtp|draft:DIR|off: runners' speculative decoding */
    int spec_tokens;          /* --spec-k N: most drafted tokens per step, 0 = the engine's 4 */
} exo_options;

enum options_result {
    OPTIONS_OK = 0,     /* start the node */
    OPTIONS_EXIT = 1,   /* --help or --version was printed; exit 0 */
    OPTIONS_ERROR = 2,  /* bad usage; message in err; exit 2 */
};

void options_defaults(exo_options *o);
/* Parses argv[1..] (node flags only). Environment variables are read first, flags override. */
enum options_result options_parse(exo_options *o, int argc, char **argv, char *err, size_t errlen);
void options_print_help(const char *prog);
/* Parses "123", "64K", "512M", "2G" into bytes. Returns 0 or -1. */
int options_parse_size(const char *s, size_t *out);

#endif
