/* metrics — process-wide counters and histograms for GET /metrics (Prometheus text format 0.0.4):
 * requests by API and status, generated tokens, time to first token, inter-token latency, and
 * generations in flight. Lock-free counters; safe from any thread.
 *
 * It refuses: labels beyond api/status, and anything that needs a registry of metric objects. */
#ifndef EXO_API_METRICS_H
#define EXO_API_METRICS_H

#include "base/strbuf.h"

#include <stdint.h>

void metrics_request(const char *api, int status);
/* The api label of a generation route's path ("openai" for /v1/chat/completions, ...), "other"
 * for any other path: for answers given before a route runs (413 for a body over the limit). */
const char *metrics_api_of_path(const char *path);
void metrics_tokens(uint64_t prompt_tokens, uint64_t completion_tokens);
void metrics_ttft(double seconds);
void metrics_inter_token(double seconds);
/* Appends the exposition text; the connection figures are sampled by the caller. */
void metrics_render(strbuf *out, int queue_depth, int open_connections,
                    unsigned long long request_timeouts);

#endif
