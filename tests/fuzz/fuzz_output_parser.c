/* libFuzzer target for the output parser: the first byte picks format/flags and the piece
 * size; the rest is model output fed in pieces. Must never crash or leak. */
#include <stddef.h>
#include <stdint.h>

#include "text/output_parser.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!size) return 0;
    uint8_t k = data[0];
    output_parser *p = output_parser_new((output_format)(k % 3), (k >> 2) & 1, (k >> 3) & 1);
    size_t step = (size_t)(k >> 4) + 1;
    output_delta d;
    for (size_t i = 1; i < size; i += step) {
        size_t n = size - i < step ? size - i : step;
        output_parser_feed(p, (const char *)data + i, n, &d);
        output_delta_free(&d);
    }
    output_parser_finish(p, &d);
    output_delta_free(&d);
    output_parser_free(p);
    return 0;
}
