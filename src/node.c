#include "cmd.h"

#include "base/log.h"

int node_main(const exo_options *options) {
    log_error("the node (API port %d) is not built yet", options->api_port);
    return 1;
}
