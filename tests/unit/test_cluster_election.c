/* Election ranking and log fork points (pure functions). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "cluster/election.h"

#include <string.h>

static cluster_rank_key key(uint64_t lt, uint64_t li, int m, int64_t sa, const char *id) {
    return (cluster_rank_key){lt, li, m, sa, id};
}

static void test_log_position_decides_first(void **unused) {
    (void)unused;
    cluster_rank_key newer_term = key(5, 10, 0, 900, "a");
    cluster_rank_key longer_log = key(4, 99, 1, 100, "z");
    assert_true(cluster_rank_compare(&newer_term, &longer_log) > 0);
    cluster_rank_key more = key(5, 11, 0, 900, "a"), less = key(5, 10, 1, 100, "z");
    assert_true(cluster_rank_compare(&more, &less) > 0);
    assert_true(cluster_rank_compare(&less, &more) < 0);
}

static void test_incumbent_then_seniority_then_id(void **unused) {
    (void)unused;
    cluster_rank_key master = key(3, 7, 1, 500, "a"), senior = key(3, 7, 0, 100, "z");
    assert_true(cluster_rank_compare(&master, &senior) > 0);
    cluster_rank_key older = key(3, 7, 0, 100, "a"), younger = key(3, 7, 0, 200, "z");
    assert_true(cluster_rank_compare(&older, &younger) > 0);
    cluster_rank_key high = key(3, 7, 0, 100, "b"), low = key(3, 7, 0, 100, "a");
    assert_true(cluster_rank_compare(&high, &low) > 0);
    assert_int_equal(cluster_rank_compare(&high, &high), 0);
}

/* Every node that sees the same members picks the same master, whatever order it lists them. */
static void test_best_is_order_independent(void **unused) {
    (void)unused;
    cluster_rank_key k[5] = {key(2, 9, 0, 300, "c"), key(2, 9, 0, 100, "e"), key(2, 8, 0, 50, "a"),
                             key(2, 9, 0, 100, "d"), key(1, 20, 1, 10, "b")};
    assert_string_equal(k[cluster_rank_best(k, 5)].node_id, "e");
    for (int r = 0; r < 5; r++) {
        cluster_rank_key rot[5];
        for (int i = 0; i < 5; i++) rot[i] = k[(i + r) % 5];
        assert_string_equal(rot[cluster_rank_best(rot, 5)].node_id, "e");
    }
    assert_int_equal(cluster_rank_best(k, 1), 0);
}

static cluster_epoch ep(uint64_t term, const char *m, uint64_t first) {
    cluster_epoch e = {.term = term, .first = first};
    strcpy(e.master, m);
    return e;
}

static void test_epoch_at(void **unused) {
    (void)unused;
    cluster_epoch e[3] = {ep(1, "a", 1), ep(2, "b", 10), ep(4, "a", 20)};
    assert_null(cluster_epoch_at(e, 3, 0));
    assert_int_equal(cluster_epoch_at(e, 3, 1)->term, 1);
    assert_int_equal(cluster_epoch_at(e, 3, 9)->term, 1);
    assert_int_equal(cluster_epoch_at(e, 3, 10)->term, 2);
    assert_int_equal(cluster_epoch_at(e, 3, 1000)->term, 4);
    assert_null(cluster_epoch_at(e, 0, 5));
}

static void test_fork_points(void **unused) {
    (void)unused;
    cluster_epoch a[2] = {ep(1, "a", 1), ep(2, "b", 10)};
    /* Identical histories: the shorter log is a prefix. */
    assert_int_equal(cluster_fork_point(a, 2, 15, a, 2, 12), 12);
    assert_int_equal(cluster_fork_point(a, 2, 15, a, 2, 15), 15);
    /* A partition: both sides continued from 14 under different masters. */
    cluster_epoch b[3] = {ep(1, "a", 1), ep(2, "b", 10), ep(3, "c", 15)};
    cluster_epoch c[3] = {ep(1, "a", 1), ep(2, "b", 10), ep(3, "d", 15)};
    assert_int_equal(cluster_fork_point(b, 3, 30, c, 3, 18), 14);
    /* Same term number, different master: still a fork. */
    assert_int_equal(cluster_fork_point(c, 3, 16, b, 3, 16), 14);
    /* Divergence in the middle of an epoch of the other log. */
    cluster_epoch d[2] = {ep(1, "a", 1), ep(5, "x", 7)};
    assert_int_equal(cluster_fork_point(a, 2, 15, d, 2, 15), 6);
    /* An empty log shares nothing. */
    assert_int_equal(cluster_fork_point(a, 2, 15, NULL, 0, 0), 0);
    /* Completely different first epoch. */
    cluster_epoch e[1] = {ep(1, "z", 1)};
    assert_int_equal(cluster_fork_point(a, 2, 15, e, 1, 4), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_log_position_decides_first),
        cmocka_unit_test(test_incumbent_then_seniority_then_id),
        cmocka_unit_test(test_best_is_order_independent),
        cmocka_unit_test(test_epoch_at),
        cmocka_unit_test(test_fork_points),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
