/* Stop strings: text is cut before the first match, also across token boundaries, and nothing
 * that could still become a stop string is released early. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "runner/stop_strings.h"

#include <string.h>

/* Feeds pieces one by one; returns everything released, and whether a stop matched. */
static int run(char *const *stops, int n, const char *const *pieces, int n_pieces, strbuf *out) {
    stop_strings s;
    stop_strings_init(&s, stops, n);
    int hit = 0;
    for (int i = 0; i < n_pieces && !hit; i++) hit = stop_strings_push(&s, pieces[i], strlen(pieces[i]), out);
    if (!hit) stop_strings_flush(&s, out);
    stop_strings_free(&s);
    return hit;
}

static void test_match_across_pieces(void **state) {
    (void)state;
    char *stops[] = {"END"};
    const char *pieces[] = {"hello E", "N", "D world"};
    strbuf out = {0};
    assert_int_equal(run(stops, 1, pieces, 3, &out), 1);
    assert_string_equal(out.data, "hello ");
    strbuf_free(&out);
}

static void test_partial_prefix_is_released_when_it_diverges(void **state) {
    (void)state;
    char *stops[] = {"END"};
    const char *pieces[] = {"a E", "Nx", " b"};
    strbuf out = {0};
    assert_int_equal(run(stops, 1, pieces, 3, &out), 0);
    assert_string_equal(out.data, "a ENx b");
    strbuf_free(&out);
}

static void test_held_text_is_not_released_early(void **state) {
    (void)state;
    char *stops[] = {"</stop>"};
    stop_strings s;
    stop_strings_init(&s, stops, 1);
    strbuf out = {0};
    assert_int_equal(stop_strings_push(&s, "text </st", 9, &out), 0);
    assert_string_equal(out.data, "text ");
    assert_int_equal(stop_strings_push(&s, "op> more", 8, &out), 1);
    assert_string_equal(out.data, "text ");
    assert_int_equal(s.matched, 0);
    stop_strings_free(&s);
    strbuf_free(&out);
}

static void test_earliest_of_several(void **state) {
    (void)state;
    char *stops[] = {"world", "lo w"};
    const char *pieces[] = {"hello world"};
    strbuf out = {0};
    assert_int_equal(run(stops, 2, pieces, 1, &out), 1);
    assert_string_equal(out.data, "hel");
    strbuf_free(&out);
}

static void test_no_stops_passes_through(void **state) {
    (void)state;
    const char *pieces[] = {"a", "b"};
    strbuf out = {0};
    assert_int_equal(run(NULL, 0, pieces, 2, &out), 0);
    assert_string_equal(out.data, "ab");
    strbuf_free(&out);
}

static void test_utf8_stop(void **state) {
    (void)state;
    char *stops[] = {"\xc3\xa9t\xc3\xa9"}; /* "été" */
    const char *pieces[] = {"un \xc3", "\xa9t", "\xc3\xa9 chaud"};
    strbuf out = {0};
    assert_int_equal(run(stops, 1, pieces, 3, &out), 1);
    assert_string_equal(out.data, "un ");
    strbuf_free(&out);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_match_across_pieces),
        cmocka_unit_test(test_partial_prefix_is_released_when_it_diverges),
        cmocka_unit_test(test_held_text_is_not_released_early),
        cmocka_unit_test(test_earliest_of_several),
        cmocka_unit_test(test_no_stops_passes_through),
        cmocka_unit_test(test_utf8_stop),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
