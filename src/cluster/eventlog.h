/* cluster/eventlog — the on-disk replica of the event log: an append-only file of checksummed
 * records, one per log entry, with consecutive indexes starting at 1.
 *
 * Record layout (little-endian): magic "EXL1" (4) | payload length u32 | index u64 |
 * CRC-32 of (index bytes + payload) u32 | reserved u32 (0) | payload (JSON text).
 * Opening a file scans every record; the first record that is short, has a bad magic, a bad
 * checksum, an oversized length or an unexpected index ends the log, and the file is truncated
 * there (a torn write from a crash loses only the record being written). It knows nothing of
 * JSON or State; it refuses appends out of order. It is not thread-safe: one owner. */
#ifndef EXO_CLUSTER_EVENTLOG_H
#define EXO_CLUSTER_EVENTLOG_H

#include <stddef.h>
#include <stdint.h>

#define EVENTLOG_MAX_RECORD (4u << 20)

typedef struct eventlog eventlog;

/* Opens (creating) the log at path. On success *out is set and, when the tail was damaged,
 * *dropped_bytes says how many bytes were cut (0 otherwise). Returns 0 or -1 with err set. */
int eventlog_open(const char *path, eventlog **out, uint64_t *dropped_bytes, char *err,
                  size_t errlen);
void eventlog_close(eventlog *log);
uint64_t eventlog_count(const eventlog *log);
/* Appends record idx (must be count + 1). Returns 0 or -1 with err set. */
int eventlog_append(eventlog *log, uint64_t idx, const char *payload, size_t len, char *err,
                    size_t errlen);
/* Makes appended records durable (fdatasync). */
int eventlog_sync(eventlog *log);
/* The payload of record idx (1..count), malloc'd and NUL-terminated; NULL if absent or unreadable. */
char *eventlog_read(eventlog *log, uint64_t idx, size_t *len_out);
/* Drops every record after keep (keep <= count). Returns 0 or -1. */
int eventlog_truncate(eventlog *log, uint64_t keep);

uint32_t eventlog_crc32(uint32_t crc, const void *bytes, size_t n);

#endif
