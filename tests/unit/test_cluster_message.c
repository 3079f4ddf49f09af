/* Cluster wire messages and beacons: what the decoder admits and what it drops; identity files
 * and secret derivation; /proc/meminfo parsing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "cluster/identity.h"
#include "cluster/message.h"
#include "cluster/nodeinfo.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static enum cluster_decode_result decode(const char *text, cluster_message *m) {
    char err[256];
    return cluster_message_decode(text, strlen(text), m, err, sizeof err);
}

#define HB "\"ver\":\"1\",\"name\":\"n\",\"port\":5,\"sess\":\"s\",\"sa\":1,\"term\":0,\"lt\":0,\"li\":0,\"m\":false,\"ts\":9"

static void test_heartbeat_round_trip(void **unused) {
    (void)unused;
    cluster_message m;
    assert_int_equal(decode("{\"v\":1,\"t\":\"hb\",\"f\":\"node-1\"," HB "}", &m), CLUSTER_DECODE_OK);
    assert_int_equal(m.type, CLUSTER_MSG_HEARTBEAT);
    assert_string_equal(m.from, "node-1");
    cluster_message_free(&m);
    json_t *built = cluster_message_new(CLUSTER_MSG_SYNC, "me");
    json_object_set_new(built, "since", json_integer(0));
    json_object_set_new(built, "epochs", json_array());
    char *text = json_dumps(built, JSON_COMPACT);
    assert_int_equal(decode(text, &m), CLUSTER_DECODE_OK);
    assert_int_equal(m.type, CLUSTER_MSG_SYNC);
    cluster_message_free(&m);
    free(text);
    json_decref(built);
}

static void test_rejections(void **unused) {
    (void)unused;
    cluster_message m;
    struct {
        const char *text;
        enum cluster_decode_result want;
    } cases[] = {
        {"", CLUSTER_DECODE_MALFORMED},
        {"not json", CLUSTER_DECODE_MALFORMED},
        {"[1,2]", CLUSTER_DECODE_MALFORMED},
        {"{\"t\":\"hb\",\"f\":\"a\"}", CLUSTER_DECODE_MALFORMED},
        {"{\"v\":2,\"t\":\"hb\",\"f\":\"a\"}", CLUSTER_DECODE_VERSION},
        {"{\"v\":1,\"t\":\"zz\",\"f\":\"a\"}", CLUSTER_DECODE_MALFORMED},
        {"{\"v\":1,\"t\":\"hb\",\"f\":\"a b\"," HB "}", CLUSTER_DECODE_MALFORMED},
        {"{\"v\":1,\"t\":\"hb\",\"f\":\"\"," HB "}", CLUSTER_DECODE_MALFORMED},
        {"{\"v\":1,\"t\":\"hb\",\"f\":\"a\"}", CLUSTER_DECODE_MALFORMED},
        {"{\"v\":1,\"t\":\"hb\",\"f\":\"a\"," HB ",\"port\":0}", CLUSTER_DECODE_MALFORMED},
        {"{\"v\":1,\"v\":1,\"t\":\"hb\",\"f\":\"a\"," HB "}", CLUSTER_DECODE_MALFORMED},
        {"{\"v\":1,\"t\":\"hb\",\"f\":\"a\"," HB ",\"ets\":3}", CLUSTER_DECODE_MALFORMED},
        {"{\"v\":1,\"t\":\"sub\",\"f\":\"a\",\"sess\":\"s\",\"ev\":[{\"seq\":0,\"e\":{}}]}",
         CLUSTER_DECODE_MALFORMED},
        {"{\"v\":1,\"t\":\"sub\",\"f\":\"a\",\"sess\":\"s\",\"ev\":[{\"seq\":1,\"e\":3}]}",
         CLUSTER_DECODE_MALFORMED},
        {"{\"v\":1,\"t\":\"sync\",\"f\":\"a\",\"since\":3,\"epochs\":[[1,\"a\",5],[2,\"b\",5]]}",
         CLUSTER_DECODE_MALFORMED},
        {"{\"v\":1,\"t\":\"bwa\",\"f\":\"a\",\"ts\":1,\"n\":-1}", CLUSTER_DECODE_MALFORMED},
        {"{\"v\":1,\"t\":\"peers\",\"f\":\"a\",\"peers\":[{\"id\":\"x\",\"addr\":\"h\"}]}",
         CLUSTER_DECODE_MALFORMED},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        enum cluster_decode_result r = decode(cases[i].text, &m);
        if (r != cases[i].want) fail_msg("case %zu (%s): got %d", i, cases[i].text, r);
        assert_null(m.root);
    }
}

static const char *entry_json(int idx) {
    static char buf[512];
    snprintf(buf, sizeof buf,
             "{\"idx\":%d,\"term\":1,\"master\":\"m\",\"time\":5,\"origin\":\"o\",\"sess\":\"s\","
             "\"seq\":%d,\"event\":{\"X\":{}}}",
             idx, idx);
    return buf;
}

static void test_entries_must_follow_prev(void **unused) {
    (void)unused;
    cluster_message m;
    char text[2048];
    snprintf(text, sizeof text, "{\"v\":1,\"t\":\"ents\",\"f\":\"m\",\"prev\":null,\"ents\":[%s]}",
             entry_json(1));
    assert_int_equal(decode(text, &m), CLUSTER_DECODE_OK);
    cluster_message_free(&m);
    char e4[512];
    strcpy(e4, entry_json(4));
    snprintf(text, sizeof text,
             "{\"v\":1,\"t\":\"ents\",\"f\":\"m\",\"prev\":[3,1,\"m\"],\"ents\":[%s,%s]}", e4,
             entry_json(5));
    assert_int_equal(decode(text, &m), CLUSTER_DECODE_OK);
    cluster_message_free(&m);
    /* A gap inside the batch, a batch not following prev, and a bad prev. */
    snprintf(text, sizeof text,
             "{\"v\":1,\"t\":\"ents\",\"f\":\"m\",\"prev\":[3,1,\"m\"],\"ents\":[%s,%s]}", e4,
             entry_json(6));
    assert_int_equal(decode(text, &m), CLUSTER_DECODE_MALFORMED);
    snprintf(text, sizeof text, "{\"v\":1,\"t\":\"ents\",\"f\":\"m\",\"prev\":null,\"ents\":[%s]}",
             e4);
    assert_int_equal(decode(text, &m), CLUSTER_DECODE_MALFORMED);
    snprintf(text, sizeof text,
             "{\"v\":1,\"t\":\"ents\",\"f\":\"m\",\"prev\":[3,0,\"m\"],\"ents\":[%s]}", e4);
    assert_int_equal(decode(text, &m), CLUSTER_DECODE_MALFORMED);
    /* An entry missing a field. */
    snprintf(text, sizeof text,
             "{\"v\":1,\"t\":\"ents\",\"f\":\"m\",\"prev\":null,\"ents\":[{\"idx\":1,\"term\":1}]}");
    assert_int_equal(decode(text, &m), CLUSTER_DECODE_MALFORMED);
}

static void test_oversized_is_dropped_before_parsing(void **unused) {
    (void)unused;
    size_t n = CLUSTER_MESSAGE_MAX_BYTES + 1;
    char *big = malloc(n);
    memset(big, ' ', n);
    cluster_message m;
    char err[256];
    assert_int_equal(cluster_message_decode(big, n, &m, err, sizeof err), CLUSTER_DECODE_OVERSIZED);
    free(big);
}

static void test_beacon(void **unused) {
    (void)unused;
    cluster_beacon b = {.protocol = 1, .port = 52414}, out;
    memcpy(b.namespace_hash, "abcdefgh", 8);
    strcpy(b.node_id, "1b4e28ba-2fa1-11d2-883f-0016d3cca427");
    unsigned char buf[CLUSTER_BEACON_MAX_BYTES];
    size_t n = cluster_beacon_encode(&b, buf);
    assert_int_equal(cluster_beacon_decode(buf, n, &out), 0);
    assert_int_equal(out.port, 52414);
    assert_string_equal(out.node_id, b.node_id);
    assert_memory_equal(out.namespace_hash, "abcdefgh", 8);
    assert_int_equal(cluster_beacon_decode(buf, 15, &out), -1);     /* no node id */
    assert_int_equal(cluster_beacon_decode(buf, n + 60, &out), -1); /* too long */
    buf[0] = 'X';
    assert_int_equal(cluster_beacon_decode(buf, n, &out), -1);
    buf[0] = 'E';
    buf[13] = buf[14] = 0; /* port 0 */
    assert_int_equal(cluster_beacon_decode(buf, n, &out), -1);
}

static void test_identity_persists(void **unused) {
    (void)unused;
    char dir[128], cmd[256], err[256];
    snprintf(dir, sizeof dir, "/tmp/exo-test-identity-%d", (int)getpid());
    cluster_identity a, b;
    assert_int_equal(cluster_identity_load(dir, &a, err, sizeof err), 0);
    assert_int_equal(strlen(a.node_id), 36);
    assert_int_equal(strlen(a.public_key), 40);
    assert_true(a.friendly_name[0] != 0);
    assert_int_equal(cluster_identity_load(dir, &b, err, sizeof err), 0);
    assert_string_equal(a.node_id, b.node_id);
    assert_string_equal(a.public_key, b.public_key);
    assert_memory_equal(a.secret_key, b.secret_key, 32);
    /* A damaged id file is reported, not silently replaced. */
    snprintf(cmd, sizeof cmd, "echo 'bad id!' > %s/node_id", dir);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(cluster_identity_load(dir, &b, err, sizeof err), -1);
    assert_non_null(strstr(err, "node_id"));
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

static void test_secret_derivation(void **unused) {
    (void)unused;
    cluster_secret a, b, c, d;
    char err[256], key[128], cmd[256];
    assert_int_equal(cluster_secret_derive("default", "", &a, err, sizeof err), 0);
    assert_int_equal(cluster_secret_derive("default", "", &b, err, sizeof err), 0);
    assert_memory_equal(a.secret_key, b.secret_key, 32);
    assert_memory_equal(a.beacon_hash, b.beacon_hash, 8);
    assert_int_equal(cluster_secret_derive("other", "", &c, err, sizeof err), 0);
    assert_memory_not_equal(a.secret_key, c.secret_key, 32);
    assert_memory_not_equal(a.beacon_hash, c.beacon_hash, 8);
    snprintf(key, sizeof key, "/tmp/exo-test-key-%d", (int)getpid());
    snprintf(cmd, sizeof cmd, "printf 'a real secret of enough bytes' > %s", key);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(cluster_secret_derive("default", key, &d, err, sizeof err), 0);
    assert_memory_not_equal(a.secret_key, d.secret_key, 32);
    assert_memory_equal(a.beacon_hash, d.beacon_hash, 8); /* same namespace: beacons match */
    snprintf(cmd, sizeof cmd, "printf short > %s", key);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(cluster_secret_derive("default", key, &d, err, sizeof err), -1);
    assert_non_null(strstr(err, "at least 16"));
    unlink(key);
    assert_int_equal(cluster_secret_derive("default", key, &d, err, sizeof err), -1);
}

static void test_meminfo(void **unused) {
    (void)unused;
    nodeinfo_memory m;
    assert_int_equal(nodeinfo_parse_meminfo("MemTotal:       16384 kB\nMemFree: 1 kB\n"
                                            "MemAvailable:    8192 kB\nSwapTotal: 4 kB\n"
                                            "SwapFree: 2 kB\n",
                                            &m),
                     0);
    assert_int_equal(m.total, 16384ull * 1024);
    assert_int_equal(m.available, 8192ull * 1024);
    assert_int_equal(m.swap_total, 4096);
    assert_int_equal(m.swap_free, 2048);
    assert_int_equal(nodeinfo_parse_meminfo("MemTotal: 5 kB\n", &m), -1);
    assert_int_equal(nodeinfo_parse_meminfo("", &m), -1);
    json_t *live = nodeinfo_memory_json(0);
    assert_non_null(live);
    assert_true(json_integer_value(json_object_get(json_object_get(live, "ramTotal"), "inBytes")) > 0);
    json_decref(live);
}

/* What a node says it computes on: a CPU node publishes its device and its measured bandwidth
 * (placement weighs it beside a GPU node); without a device (a member without runners) neither;
 * a GPU node's bandwidth is its GPU's (none here: not published rather than the CPU's). */
static void test_system_device(void **unused) {
    (void)unused;
    json_t *cpu = nodeinfo_system_json("cpu", 12.34);
    assert_string_equal(json_string_value(json_object_get(cpu, "device")), "cpu");
    assert_true(json_number_value(json_object_get(cpu, "memoryBandwidthGBs")) == 12.3);
    assert_true(json_integer_value(json_object_get(cpu, "cpuCores")) >= 1);
    json_decref(cpu);
    json_t *none = nodeinfo_system_json(NULL, 12.34);
    assert_null(json_object_get(none, "device"));
    assert_null(json_object_get(none, "memoryBandwidthGBs"));
    json_decref(none);
    json_t *unmeasured = nodeinfo_system_json("cpu", 0);
    assert_null(json_object_get(unmeasured, "memoryBandwidthGBs"));
    json_decref(unmeasured);
    if (nodeinfo_gpus(NULL, 0) == 0) {
        json_t *gpu = nodeinfo_system_json("cuda", 12.34);
        assert_string_equal(json_string_value(json_object_get(gpu, "device")), "cuda");
        assert_null(json_object_get(gpu, "memoryBandwidthGBs"));
        json_decref(gpu);
        json_t *mem = nodeinfo_memory_json(1);
        assert_null(json_object_get(mem, "gpuAvailable"));
        json_decref(mem);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_system_device),
        cmocka_unit_test(test_heartbeat_round_trip),
        cmocka_unit_test(test_rejections),
        cmocka_unit_test(test_entries_must_follow_prev),
        cmocka_unit_test(test_oversized_is_dropped_before_parsing),
        cmocka_unit_test(test_beacon),
        cmocka_unit_test(test_identity_persists),
        cmocka_unit_test(test_secret_derivation),
        cmocka_unit_test(test_meminfo),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
