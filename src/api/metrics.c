/* metrics — see metrics.h. Histograms use fixed buckets chosen for LLM serving latencies. */
#include "api/metrics.h"

#include <stdatomic.h>
#include <string.h>

#define N_APIS 6
#define N_STATUS 6
static const char *API_NAMES[N_APIS] = {"openai", "completions", "responses", "claude", "ollama",
                                        "other"};
static const int STATUS_CLASSES[N_STATUS] = {200, 400, 401, 404, 413, 500};

static atomic_ullong requests[N_APIS][N_STATUS];
static atomic_ullong prompt_tokens_total, completion_tokens_total;

typedef struct histogram {
    const double *bounds;
    int n;
    atomic_ullong counts[16];
    atomic_ullong count;
    atomic_ullong sum_us;
} histogram;

static const double TTFT_BOUNDS[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
static const double ITL_BOUNDS[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                    0.05,   0.1,   0.25,   0.5,   1};
static histogram ttft = {TTFT_BOUNDS, 12, {0}, 0, 0};
static histogram itl = {ITL_BOUNDS, 11, {0}, 0, 0};

static int api_index(const char *api) {
    for (int i = 0; i < N_APIS - 1; i++)
        if (!strcmp(api, API_NAMES[i])) return i;
    return N_APIS - 1;
}

static int status_index(int status) {
    for (int i = 0; i < N_STATUS; i++)
        if (status == STATUS_CLASSES[i]) return i;
    return status < 400 ? 0 : status < 500 ? 1 : 5;
}

void metrics_request(const char *api, int status) {
    atomic_fetch_add(&requests[api_index(api)][status_index(status)], 1);
}

const char *metrics_api_of_path(const char *path) {
    static const char *routes[][2] = {
        {"/v1/chat/completions", "openai"},  {"/bench/chat/completions", "openai"},
        {"/v1/completions", "completions"},  {"/v1/responses", "responses"},
        {"/v1/messages", "claude"},          {"/ollama/api/chat", "ollama"},
        {"/ollama/api/generate", "ollama"},
    };
    for (size_t i = 0; path && i < sizeof routes / sizeof routes[0]; i++) {
        size_t n = strlen(routes[i][0]);
        if (!strncmp(path, routes[i][0], n) && (path[n] == 0 || !strcmp(path + n, "/")))
            return routes[i][1];
    }
    return "other";
}

void metrics_tokens(uint64_t p, uint64_t c) {
    atomic_fetch_add(&prompt_tokens_total, p);
    atomic_fetch_add(&completion_tokens_total, c);
}

static void observe(histogram *h, double v) {
    for (int i = 0; i < h->n; i++)
        if (v <= h->bounds[i]) atomic_fetch_add(&h->counts[i], 1);
    atomic_fetch_add(&h->count, 1);
    atomic_fetch_add(&h->sum_us, (unsigned long long)(v * 1e6));
}

void metrics_ttft(double s) { observe(&ttft, s); }
void metrics_inter_token(double s) { observe(&itl, s); }

static void render_histogram(strbuf *out, const char *name, const char *help, histogram *h) {
    strbuf_appendf(out, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    for (int i = 0; i < h->n; i++)
        strbuf_appendf(out, "%s_bucket{le=\"%g\"} %llu\n", name, h->bounds[i],
                       atomic_load(&h->counts[i]));
    strbuf_appendf(out, "%s_bucket{le=\"+Inf\"} %llu\n", name, atomic_load(&h->count));
    strbuf_appendf(out, "%s_sum %.6f\n%s_count %llu\n", name, atomic_load(&h->sum_us) / 1e6, name,
                   atomic_load(&h->count));
}

void metrics_render(strbuf *out, int queue_depth, int open_connections,
                    unsigned long long request_timeouts) {
    strbuf_appendf(out, "# HELP exo_requests_total Generation requests by API and HTTP status.\n"
                        "# TYPE exo_requests_total counter\n");
    for (int a = 0; a < N_APIS; a++)
        for (int s = 0; s < N_STATUS; s++)
            strbuf_appendf(out, "exo_requests_total{api=\"%s\",status=\"%d\"} %llu\n",
                           API_NAMES[a], STATUS_CLASSES[s], atomic_load(&requests[a][s]));
    strbuf_appendf(out,
                   "# HELP exo_prompt_tokens_total Prompt tokens processed.\n"
                   "# TYPE exo_prompt_tokens_total counter\nexo_prompt_tokens_total %llu\n"
                   "# HELP exo_generated_tokens_total Tokens generated.\n"
                   "# TYPE exo_generated_tokens_total counter\nexo_generated_tokens_total %llu\n",
                   atomic_load(&prompt_tokens_total), atomic_load(&completion_tokens_total));
    render_histogram(out, "exo_time_to_first_token_seconds",
                     "Time from request arrival to the first generated token.", &ttft);
    render_histogram(out, "exo_inter_token_seconds", "Time between consecutive streamed tokens.",
                     &itl);
    strbuf_appendf(out,
                   "# HELP exo_queue_depth Generations in flight (queued or running).\n"
                   "# TYPE exo_queue_depth gauge\nexo_queue_depth %d\n"
                   "# HELP exo_open_connections Open HTTP connections.\n"
                   "# TYPE exo_open_connections gauge\nexo_open_connections %d\n"
                   "# HELP exo_http_request_timeouts_total Connections closed because their "
                   "request did not arrive in time (slow or stalled clients).\n"
                   "# TYPE exo_http_request_timeouts_total counter\n"
                   "exo_http_request_timeouts_total %llu\n",
                   queue_depth, open_connections, request_timeouts);
}
