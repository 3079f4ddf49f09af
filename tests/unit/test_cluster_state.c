/* cluster State: apply() for every event kind, ordering, bad events, determinism, lookups. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "cluster/message.h"
#include "cluster/state.h"

#include <string.h>

static json_t *entry(int idx, const char *event_json) {
    json_t *ev = json_loads(event_json, 0, NULL);
    assert_non_null(ev);
    return json_pack("{s:i, s:i, s:s, s:I, s:s, s:s, s:i, s:o}", "idx", idx, "term", 3, "master",
                     "node-m", "time", (json_int_t)1700000000123LL, "origin", "node-a", "sess",
                     "s1", "seq", idx, "event", ev);
}

static enum cluster_apply_result apply(json_t *state, int idx, const char *event_json) {
    json_t *e = entry(idx, event_json);
    char err[256];
    assert_int_equal(cluster_entry_validate(e, err, sizeof err), 0);
    enum cluster_apply_result r = cluster_state_apply(state, e, err, sizeof err);
    json_decref(e);
    return r;
}

static long long applied(json_t *state) {
    return json_integer_value(json_object_get(state, "lastEventAppliedIdx"));
}

static void test_new_state_has_exo_fields(void **unused) {
    (void)unused;
    json_t *s = cluster_state_new();
    const char *fields[] = {"instances", "runners", "downloads", "tasks", "lastSeen", "topology",
                            "nodeIdentities", "nodeMemory", "nodeDisk", "nodeSystem",
                            "nodeNetwork", "customModelCards", "lastEventAppliedIdx"};
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        assert_non_null(json_object_get(s, fields[i]));
    assert_int_equal(applied(s), 0);
    json_decref(s);
}

static void test_node_info_and_timeout(void **unused) {
    (void)unused;
    json_t *s = cluster_state_new();
    assert_int_equal(apply(s, 1, "{\"NodeGatheredInfo\":{\"nodeId\":\"n1\",\"info\":{\"MemoryUsage\":"
                                 "{\"ramTotal\":{\"inBytes\":100}}}}}"),
                     CLUSTER_APPLY_OK);
    assert_int_equal(json_integer_value(cluster_state_lookup(s, "nodeMemory/n1/ramTotal/inBytes")),
                     100);
    assert_string_equal(json_string_value(cluster_state_lookup(s, "topology/nodes/0")), "n1");
    assert_string_equal(json_string_value(cluster_state_lookup(s, "lastSeen/n1")),
                        "2023-11-14T22:13:20.123Z");
    assert_int_equal(apply(s, 2, "{\"NodeGatheredInfo\":{\"nodeId\":\"n2\",\"info\":{\"NodeIdentity\":"
                                 "{\"friendlyName\":\"b\"}}}}"),
                     CLUSTER_APPLY_OK);
    assert_int_equal(apply(s, 3, "{\"TopologyEdgesMeasured\":{\"source\":\"n1\",\"edges\":[{\"sink\":"
                                 "\"n2\",\"latencyMs\":0.5,\"bandwidthMbps\":900}]}}"),
                     CLUSTER_APPLY_OK);
    assert_int_equal(apply(s, 4, "{\"TopologyEdgesMeasured\":{\"source\":\"n2\",\"edges\":[{\"sink\":"
                                 "\"n1\",\"latencyMs\":0.7}]}}"),
                     CLUSTER_APPLY_OK);
    /* A second measurement from n1 replaces its edges rather than adding to them. */
    assert_int_equal(apply(s, 5, "{\"TopologyEdgesMeasured\":{\"source\":\"n1\",\"edges\":[{\"sink\":"
                                 "\"n2\",\"latencyMs\":0.9}]}}"),
                     CLUSTER_APPLY_OK);
    json_t *conns = cluster_state_lookup(s, "topology/connections");
    assert_int_equal(json_array_size(conns), 2);
    assert_int_equal(apply(s, 6, "{\"NodeTimedOut\":{\"nodeId\":\"n2\"}}"), CLUSTER_APPLY_OK);
    assert_null(cluster_state_lookup(s, "nodeIdentities/n2"));
    assert_null(cluster_state_lookup(s, "lastSeen/n2"));
    assert_int_equal(json_array_size(cluster_state_lookup(s, "topology/connections")), 0);
    assert_int_equal(json_array_size(cluster_state_lookup(s, "topology/nodes")), 1);
    assert_non_null(cluster_state_lookup(s, "nodeMemory/n1"));
    assert_int_equal(applied(s), 6);
    json_decref(s);
}

/* The ranks' rendezvous keys live inside their instance: every node reads them from State, and
 * they go when the instance goes (a key for a gone instance changes nothing). */
static void test_rendezvous_keys_live_in_the_instance(void **unused) {
    (void)unused;
    json_t *s = cluster_state_new();
    int i = 1;
    assert_int_equal(apply(s, i++, "{\"InstanceCreated\":{\"instance\":{\"MlxRingInstance\":"
                                   "{\"instanceId\":\"i1\"}}}}"),
                     CLUSTER_APPLY_OK);
    assert_int_equal(apply(s, i++, "{\"InstanceRendezvousSet\":{\"instanceId\":\"i1\","
                                   "\"key\":\"i1/rank/0\",\"value\":\"0a0b\"}}"),
                     CLUSTER_APPLY_OK);
    json_t *keys = cluster_state_lookup(s, "instances/i1/MlxRingInstance/rendezvous");
    assert_string_equal(json_string_value(json_object_get(keys, "i1/rank/0")), "0a0b");
    assert_int_equal(apply(s, i++, "{\"InstanceRendezvousSet\":{\"instanceId\":\"i1\","
                                   "\"key\":\"k\"}}"),
                     CLUSTER_APPLY_IGNORED);
    assert_int_equal(apply(s, i++, "{\"InstanceDeleted\":{\"instanceId\":\"i1\"}}"),
                     CLUSTER_APPLY_OK);
    assert_int_equal(apply(s, i++, "{\"InstanceRendezvousSet\":{\"instanceId\":\"i1\","
                                   "\"key\":\"k\",\"value\":\"00\"}}"),
                     CLUSTER_APPLY_OK);
    assert_null(cluster_state_lookup(s, "instances/i1"));
    json_decref(s);
}

static void test_instances_runners_tasks_downloads(void **unused) {
    (void)unused;
    json_t *s = cluster_state_new();
    int i = 1;
    assert_int_equal(apply(s, i++, "{\"InstanceCreated\":{\"instance\":{\"MlxRingInstance\":"
                                   "{\"instanceId\":\"i1\",\"shards\":2}}}}"),
                     CLUSTER_APPLY_OK);
    assert_int_equal(json_integer_value(
                         cluster_state_lookup(s, "instances/i1/MlxRingInstance/shards")),
                     2);
    assert_int_equal(apply(s, i++, "{\"RunnerStatusUpdated\":{\"runnerId\":\"r1\",\"runnerStatus\":"
                                   "{\"RunnerReady\":{}}}}"),
                     CLUSTER_APPLY_OK);
    assert_non_null(cluster_state_lookup(s, "runners/r1/RunnerReady"));
    assert_int_equal(apply(s, i++, "{\"TaskCreated\":{\"taskId\":\"t1\",\"task\":{\"ChatCompletion\":"
                                   "{\"taskStatus\":\"Pending\"}}}}"),
                     CLUSTER_APPLY_OK);
    assert_int_equal(apply(s, i++, "{\"TaskStatusUpdated\":{\"taskId\":\"t1\",\"taskStatus\":"
                                   "\"Complete\"}}"),
                     CLUSTER_APPLY_OK);
    assert_string_equal(
        json_string_value(cluster_state_lookup(s, "tasks/t1/ChatCompletion/taskStatus")), "Complete");
    assert_int_equal(apply(s, i++, "{\"TaskStatusUpdated\":{\"taskId\":\"nope\",\"taskStatus\":\"X\"}}"),
                     CLUSTER_APPLY_IGNORED);
    assert_int_equal(apply(s, i++, "{\"NodeDownloadProgress\":{\"downloadProgress\":{\"DownloadOngoing\":"
                                   "{\"nodeId\":\"n1\",\"modelId\":\"m\",\"bytes\":1}}}}"),
                     CLUSTER_APPLY_OK);
    assert_int_equal(apply(s, i++, "{\"NodeDownloadProgress\":{\"downloadProgress\":{\"DownloadCompleted\":"
                                   "{\"nodeId\":\"n1\",\"modelId\":\"m\"}}}}"),
                     CLUSTER_APPLY_OK);
    assert_int_equal(json_array_size(cluster_state_lookup(s, "downloads/n1")), 1);
    assert_non_null(cluster_state_lookup(s, "downloads/n1/0/DownloadCompleted"));
    assert_int_equal(apply(s, i++, "{\"DownloadDeleted\":{\"nodeId\":\"n1\",\"modelId\":\"m\"}}"),
                     CLUSTER_APPLY_OK);
    assert_int_equal(json_array_size(cluster_state_lookup(s, "downloads/n1")), 0);
    assert_int_equal(apply(s, i++, "{\"InstanceDeleted\":{\"instanceId\":\"i1\"}}"), CLUSTER_APPLY_OK);
    assert_int_equal(apply(s, i++, "{\"RunnerDeleted\":{\"runnerId\":\"r1\"}}"), CLUSTER_APPLY_OK);
    assert_int_equal(apply(s, i++, "{\"TaskDeleted\":{\"taskId\":\"t1\"}}"), CLUSTER_APPLY_OK);
    assert_int_equal(json_object_size(json_object_get(s, "instances")), 0);
    assert_int_equal(json_object_size(json_object_get(s, "runners")), 0);
    assert_int_equal(json_object_size(json_object_get(s, "tasks")), 0);
    assert_int_equal(apply(s, i++, "{\"MasterElected\":{\"nodeId\":\"node-m\",\"term\":3}}"),
                     CLUSTER_APPLY_OK);
    assert_string_equal(json_string_value(json_object_get(s, "masterNodeId")), "node-m");
    assert_int_equal(applied(s), i - 1);
    json_decref(s);
}

static void test_bad_events_only_advance_index(void **unused) {
    (void)unused;
    json_t *s = cluster_state_new();
    json_t *before = json_deep_copy(s);
    const char *bad[] = {
        "{\"NoSuchEvent\":{}}",
        "{\"InstanceCreated\":{\"instance\":{\"A\":{},\"B\":{}}}}",
        "{\"InstanceCreated\":{\"instance\":5}}",
        "{\"NodeGatheredInfo\":{\"nodeId\":\"n\",\"info\":{\"Weird\":{}}}}",
        "{\"NodeGatheredInfo\":{\"nodeId\":\"\",\"info\":{\"MemoryUsage\":{}}}}",
        "{\"TopologyEdgesMeasured\":{\"source\":\"n\",\"edges\":[{\"sink\":\"m\"}]}}",
        "{\"RunnerStatusUpdated\":{\"runnerId\":7}}",
        "{\"A\":{},\"B\":{}}",
        "{\"A\":[]}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(apply(s, (int)i + 1, bad[i]), CLUSTER_APPLY_IGNORED);
    json_object_set_new(before, "lastEventAppliedIdx", json_integer(sizeof bad / sizeof bad[0]));
    assert_true(json_equal(before, s));
    json_decref(before);
    json_decref(s);
}

static void test_out_of_order_is_refused(void **unused) {
    (void)unused;
    json_t *s = cluster_state_new();
    assert_int_equal(apply(s, 2, "{\"RunnerDeleted\":{\"runnerId\":\"r\"}}"),
                     CLUSTER_APPLY_OUT_OF_ORDER);
    assert_int_equal(applied(s), 0);
    assert_int_equal(apply(s, 1, "{\"RunnerDeleted\":{\"runnerId\":\"r\"}}"), CLUSTER_APPLY_OK);
    assert_int_equal(apply(s, 1, "{\"RunnerDeleted\":{\"runnerId\":\"r\"}}"),
                     CLUSTER_APPLY_OUT_OF_ORDER);
    json_decref(s);
}

/* Two nodes folding the same log reach identical State, and the log entries are not aliased
 * into State (changing an entry afterwards does not change State). */
static void test_deterministic_and_unaliased(void **unused) {
    (void)unused;
    json_t *a = cluster_state_new(), *b = cluster_state_new();
    const char *events[] = {
        "{\"InstanceCreated\":{\"instance\":{\"K\":{\"instanceId\":\"i\"}}}}",
        "{\"TaskCreated\":{\"taskId\":\"t\",\"task\":{\"T\":{}}}}",
        "{\"TaskStatusUpdated\":{\"taskId\":\"t\",\"taskStatus\":\"Running\"}}",
    };
    for (int i = 0; i < 3; i++) {
        json_t *e = entry(i + 1, events[i]);
        char err[128];
        cluster_state_apply(a, e, err, sizeof err);
        json_object_set_new(json_object_get(json_object_get(e, "event"),
                                            json_object_iter_key(json_object_iter(
                                                json_object_get(e, "event")))),
                            "mutated", json_true());
        json_decref(e);
        assert_int_equal(apply(b, i + 1, events[i]), CLUSTER_APPLY_OK);
    }
    assert_true(json_equal(a, b));
    json_decref(a);
    json_decref(b);
}

static void test_lookup_paths(void **unused) {
    (void)unused;
    json_t *s = cluster_state_new();
    assert_ptr_equal(cluster_state_lookup(s, ""), s);
    assert_ptr_equal(cluster_state_lookup(s, "/"), s);
    assert_non_null(cluster_state_lookup(s, "topology/nodes"));
    assert_non_null(cluster_state_lookup(s, "/topology/nodes/"));
    assert_null(cluster_state_lookup(s, "topology/nodes/0"));
    assert_null(cluster_state_lookup(s, "nope"));
    assert_null(cluster_state_lookup(s, "lastEventAppliedIdx/x"));
    assert_null(cluster_state_lookup(s, "topology/nodes/-1"));
    json_decref(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_new_state_has_exo_fields),
        cmocka_unit_test(test_node_info_and_timeout),
        cmocka_unit_test(test_instances_runners_tasks_downloads),
        cmocka_unit_test(test_rendezvous_keys_live_in_the_instance),
        cmocka_unit_test(test_bad_events_only_advance_index),
        cmocka_unit_test(test_out_of_order_is_refused),
        cmocka_unit_test(test_deterministic_and_unaliased),
        cmocka_unit_test(test_lookup_paths),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
