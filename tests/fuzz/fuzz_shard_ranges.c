/* libFuzzer target: planning a pipeline stage's byte ranges from a safetensors header a server
 * sent (download_shard_ranges). Every input is either rejected, asks for more bytes than it has,
 * or yields sorted, disjoint ranges inside the file that start with the header. */
#include "download/download.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 4) return 0;
    /* the first 4 bytes pick the file size slack and the stage; the rest is the file's head */
    uint64_t slack = (uint64_t)data[0] << 12 | data[1];
    int start = data[2] % 8, end = start + 1 + data[3] % 8, tie = data[3] >> 7;
    data += 4;
    size -= 4;
    uint64_t file_size = size + slack, need = 0;
    download_range r[8];
    char err[256];
    int n = download_shard_ranges(data, size, file_size, 8, tie, start, end, r, 8, &need, err, sizeof err);
    if (n == -2) {
        if (need <= size || need > file_size) abort();
        return 0;
    }
    if (n == -1) return 0;
    if (n < 1 || n > 8 || r[0].start != 0) abort();
    for (int i = 0; i < n; i++) {
        if (r[i].start >= r[i].end || r[i].end > file_size) abort();
        if (i && r[i].start <= r[i - 1].end) abort();
    }
    return 0;
}
