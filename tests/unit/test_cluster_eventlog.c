/* The on-disk event log: round trip, reopen, torn writes, checksum damage, ordering, truncation. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "cluster/eventlog.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char path[256];

static int setup(void **unused) {
    (void)unused;
    snprintf(path, sizeof path, "/tmp/exo-test-eventlog-%d.log", (int)getpid());
    unlink(path);
    return 0;
}

static int teardown(void **unused) {
    (void)unused;
    unlink(path);
    return 0;
}

static eventlog *open_log(uint64_t *dropped) {
    eventlog *log = NULL;
    char err[256];
    uint64_t d = 0;
    assert_int_equal(eventlog_open(path, &log, &d, err, sizeof err), 0);
    if (dropped) *dropped = d;
    return log;
}

static void fill(eventlog *log, int n) {
    char err[256], text[64];
    for (int i = 1; i <= n; i++) {
        snprintf(text, sizeof text, "{\"n\":%d}", i);
        assert_int_equal(eventlog_append(log, (uint64_t)i, text, strlen(text), err, sizeof err), 0);
    }
}

static void expect_record(eventlog *log, int i) {
    char want[64];
    snprintf(want, sizeof want, "{\"n\":%d}", i);
    size_t len;
    char *got = eventlog_read(log, (uint64_t)i, &len);
    assert_non_null(got);
    assert_string_equal(got, want);
    assert_int_equal(len, strlen(want));
    free(got);
}

static off_t file_size(void) {
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    return st.st_size;
}

static void test_round_trip_and_reopen(void **unused) {
    (void)unused;
    eventlog *log = open_log(NULL);
    fill(log, 50);
    assert_int_equal(eventlog_sync(log), 0);
    eventlog_close(log);
    uint64_t dropped = 1;
    log = open_log(&dropped);
    assert_int_equal(dropped, 0);
    assert_int_equal(eventlog_count(log), 50);
    for (int i = 1; i <= 50; i++) expect_record(log, i);
    assert_null(eventlog_read(log, 0, NULL));
    assert_null(eventlog_read(log, 51, NULL));
    eventlog_close(log);
}

static void test_out_of_order_append_refused(void **unused) {
    (void)unused;
    eventlog *log = open_log(NULL);
    char err[256];
    assert_int_equal(eventlog_append(log, 2, "x", 1, err, sizeof err), -1);
    assert_non_null(strstr(err, "append of record 2"));
    fill(log, 1);
    assert_int_equal(eventlog_append(log, 1, "x", 1, err, sizeof err), -1);
    assert_int_equal(eventlog_count(log), 1);
    eventlog_close(log);
}

/* A crash mid-append leaves a partial record: reopening cuts exactly that record. */
static void test_torn_write_is_cut(void **unused) {
    (void)unused;
    eventlog *log = open_log(NULL);
    fill(log, 10);
    eventlog_close(log);
    off_t full = file_size();
    for (off_t cut = 1; cut < 30; cut += 3) {
        /* Rebuild 10 records, then chop `cut` bytes off the last one. */
        unlink(path);
        log = open_log(NULL);
        fill(log, 10);
        eventlog_close(log);
        assert_int_equal(truncate(path, full - cut), 0);
        uint64_t dropped = 0;
        log = open_log(&dropped);
        assert_int_equal(eventlog_count(log), 9);
        assert_true(dropped > 0);
        for (int i = 1; i <= 9; i++) expect_record(log, i);
        /* The log keeps working after the repair. */
        char err[256];
        assert_int_equal(eventlog_append(log, 10, "{\"n\":10}", 8, err, sizeof err), 0);
        eventlog_close(log);
        log = open_log(&dropped);
        assert_int_equal(dropped, 0);
        assert_int_equal(eventlog_count(log), 10);
        expect_record(log, 10);
        eventlog_close(log);
    }
}

/* A flipped byte anywhere in record k (header or payload) ends the log before k. */
static void test_checksum_damage_ends_log(void **unused) {
    (void)unused;
    eventlog *log = open_log(NULL);
    fill(log, 5);
    eventlog_close(log);
    off_t size = file_size();
    off_t record = size / 5; /* every record here has the same size */
    for (off_t at = 3 * record; at < 4 * record; at++) {
        int fd = open(path, O_RDWR);
        unsigned char b;
        assert_int_equal(pread(fd, &b, 1, at), 1);
        unsigned char flipped = b ^ 0x40;
        assert_int_equal(pwrite(fd, &flipped, 1, at), 1);
        close(fd);
        eventlog *damaged = NULL;
        char err[256];
        uint64_t dropped;
        /* Reopen a copy so the original can be restored for the next position. */
        assert_int_equal(eventlog_open(path, &damaged, &dropped, err, sizeof err), 0);
        assert_int_equal(eventlog_count(damaged), 3);
        assert_int_equal(dropped, 2 * record);
        eventlog_close(damaged);
        /* Restore: rewrite records 4 and 5. */
        unlink(path);
        log = open_log(NULL);
        fill(log, 5);
        eventlog_close(log);
    }
}

static void test_garbage_file_yields_empty_log(void **unused) {
    (void)unused;
    FILE *f = fopen(path, "wb");
    fputs("this is not an event log at all, just text", f);
    fclose(f);
    uint64_t dropped;
    eventlog *log = open_log(&dropped);
    assert_int_equal(eventlog_count(log), 0);
    assert_int_equal(dropped, 42);
    eventlog_close(log);
}

static void test_truncate(void **unused) {
    (void)unused;
    eventlog *log = open_log(NULL);
    fill(log, 8);
    assert_int_equal(eventlog_truncate(log, 9), -1);
    assert_int_equal(eventlog_truncate(log, 5), 0);
    assert_int_equal(eventlog_count(log), 5);
    assert_null(eventlog_read(log, 6, NULL));
    char err[256];
    assert_int_equal(eventlog_append(log, 6, "{\"n\":6}", 7, err, sizeof err), 0);
    eventlog_close(log);
    log = open_log(NULL);
    assert_int_equal(eventlog_count(log), 6);
    for (int i = 1; i <= 6; i++) expect_record(log, i);
    eventlog_close(log);
}

static void test_crc32_known_value(void **unused) {
    (void)unused;
    /* The standard check value of CRC-32/IEEE. */
    assert_int_equal(eventlog_crc32(0, "123456789", 9), 0xCBF43926u);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_round_trip_and_reopen, setup, teardown),
        cmocka_unit_test_setup_teardown(test_out_of_order_append_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_torn_write_is_cut, setup, teardown),
        cmocka_unit_test_setup_teardown(test_checksum_damage_ends_log, setup, teardown),
        cmocka_unit_test_setup_teardown(test_garbage_file_yields_empty_log, setup, teardown),
        cmocka_unit_test_setup_teardown(test_truncate, setup, teardown),
        cmocka_unit_test(test_crc32_known_value),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
