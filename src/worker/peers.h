/* peers — private to worker/: which other nodes can serve a model's files, as State says. A
 * node holds a model when State's downloads list a completed download of the whole model for it
 * (a pipeline stage's download, with startLayer/endLayer, holds only some files: it is never
 * served to peers and does not count). Used by the downloads (peers first, then the Hub) and by
 * placement (nodes holding the files come first).
 *
 * It refuses: deciding whether a peer's copy is good (the download verifies every file and
 * falls back to the Hub). */
#ifndef EXO_WORKER_PEERS_H
#define EXO_WORKER_PEERS_H

#include <jansson.h>

/* 1 when downloads (State's downloads object) lists a completed whole download of model_id on
 * node. */
int peers_node_holds(json_t *downloads, const char *node, const char *model_id);

/* Live peers holding model_id, as base URLs of their API ("http://addr:apiPort"; a peer that
 * publishes no apiPort is taken to use default_api_port). Returns how many (at most max). */
int peers_find(const char *model_id, int default_api_port, char urls[][96], int max);

#endif
