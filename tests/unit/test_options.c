/* Node flags: defaults, every reserved flag, environment variables, and bad input. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "cmd/options.h"
#include "compute/device.h"

#include <stdlib.h>
#include <string.h>

static enum options_result parse(exo_options *o, char *err, int argc, char **argv) {
    options_defaults(o);
    return options_parse(o, argc, argv, err, 256);
}

static void test_defaults(void **state) {
    (void)state;
    unsetenv("EXO_MODELS_DIR");
    unsetenv("EXO_OFFLINE");
    setenv("XDG_DATA_HOME", "/tmp/xdg", 1);
    exo_options o;
    char err[256];
    char *argv[] = {"exo"};
    assert_int_equal(parse(&o, err, 1, argv), OPTIONS_OK);
    assert_int_equal(o.api_port, 52415);
    assert_int_equal(o.listen_port, 52414);
    assert_int_equal(o.discovery_port, 52413);
    assert_string_equal(o.data_dir, "/tmp/xdg/exo");
    assert_string_equal(o.models_dir, "/tmp/xdg/exo/models");
    assert_int_equal(o.max_body_bytes, 32u << 20);
    assert_false(o.offline);
}

static void test_all_flags(void **state) {
    (void)state;
    exo_options o;
    char err[256];
    char *argv[] = {"exo", "--api-port", "8080", "--models-dir=/m", "--models-path", "/a:/b",
                    "--data-dir", "/d", "--offline", "--namespace", "lab", "--no-worker",
                    "--no-api", "--peer", "10.0.0.2:52414", "--peer", "host:1",
                    "--listen-port", "7000", "--discovery-port", "7001", "-v", "-v",
                    "--kv-cache-mem", "2G", "--kv-cache-dtype", "f32"};
    int argc = (int)(sizeof argv / sizeof argv[0]);
    assert_int_equal(parse(&o, err, argc, argv), OPTIONS_OK);
    assert_int_equal(o.api_port, 8080);
    assert_string_equal(o.models_dir, "/m");
    assert_string_equal(o.models_path, "/a:/b");
    assert_string_equal(o.data_dir, "/d");
    assert_true(o.offline);
    assert_string_equal(o.namespace_name, "lab");
    assert_true(o.no_worker);
    assert_true(o.no_api);
    assert_int_equal(o.n_peers, 2);
    assert_string_equal(o.peers[1], "host:1");
    assert_int_equal(o.listen_port, 7000);
    assert_int_equal(o.discovery_port, 7001);
    assert_int_equal(o.verbosity, 2);
    assert_int_equal(o.kv_cache_bytes, 2ull << 30);
    assert_string_equal(o.kv_cache_dtype, "f32");
}

static void test_env(void **state) {
    (void)state;
    setenv("EXO_MODELS_DIR", "/env/models", 1);
    setenv("EXO_OFFLINE", "1", 1);
    exo_options o;
    char err[256];
    char *argv[] = {"exo"};
    assert_int_equal(parse(&o, err, 1, argv), OPTIONS_OK);
    assert_string_equal(o.models_dir, "/env/models");
    assert_true(o.offline);
    char *argv2[] = {"exo", "--models-dir", "/flag"};
    assert_int_equal(parse(&o, err, 3, argv2), OPTIONS_OK);
    assert_string_equal(o.models_dir, "/flag");
    unsetenv("EXO_MODELS_DIR");
    unsetenv("EXO_OFFLINE");
}

static void test_bad_flags(void **state) {
    (void)state;
    exo_options o;
    char err[256];
    char *a1[] = {"exo", "--bogus"};
    assert_int_equal(parse(&o, err, 2, a1), OPTIONS_ERROR);
    assert_non_null(strstr(err, "--bogus"));
    char *a2[] = {"exo", "--api-port", "99999"};
    assert_int_equal(parse(&o, err, 3, a2), OPTIONS_ERROR);
    char *a3[] = {"exo", "--api-port"};
    assert_int_equal(parse(&o, err, 2, a3), OPTIONS_ERROR);
    char *a4[] = {"exo", "--peer", "nohostport"};
    assert_int_equal(parse(&o, err, 3, a4), OPTIONS_ERROR);
    char *a5[] = {"exo", "--kv-cache-mem", "lots"};
    assert_int_equal(parse(&o, err, 3, a5), OPTIONS_ERROR);
    char *a6[] = {"exo", "--kv-cache-dtype", "int4"};
    assert_int_equal(parse(&o, err, 3, a6), OPTIONS_ERROR);
    assert_non_null(strstr(err, "int4"));
}

/* --device / EXO_DEVICE: what runners compute on; cuda is refused at start where it cannot run. */
static void test_device(void **state) {
    (void)state;
    unsetenv("EXO_DEVICE");
    exo_options o;
    char err[256];
    char *none[] = {"exo"};
    assert_int_equal(parse(&o, err, 1, none), OPTIONS_OK);
    assert_string_equal(o.device, ""); /* unset: runners pick (auto) */
    char *cpu[] = {"exo", "--device", "cpu"};
    assert_int_equal(parse(&o, err, 3, cpu), OPTIONS_OK);
    assert_string_equal(o.device, "cpu");
    char *bad[] = {"exo", "--device", "tpu"};
    assert_int_equal(parse(&o, err, 3, bad), OPTIONS_ERROR);
    assert_non_null(strstr(err, "not one of cpu, cuda, auto"));
    setenv("EXO_DEVICE", "auto", 1);
    assert_int_equal(parse(&o, err, 1, none), OPTIONS_OK);
    assert_string_equal(o.device, "auto");
    unsetenv("EXO_DEVICE");
    char *cuda[] = {"exo", "--device", "cuda"};
    enum options_result r = parse(&o, err, 3, cuda);
    if (compute_gpu_count() > 0) {
        assert_int_equal(r, OPTIONS_OK);
        assert_string_equal(o.device, "cuda");
    } else {
        assert_int_equal(r, OPTIONS_ERROR);
        assert_non_null(strstr(err, compute_cuda_built() ? "no CUDA GPU" : "built without the CUDA backend"));
    }
}

static void test_sizes(void **state) {
    (void)state;
    size_t v;
    assert_int_equal(options_parse_size("512M", &v), 0);
    assert_int_equal(v, 512u << 20);
    assert_int_equal(options_parse_size("64KiB", &v), 0);
    assert_int_equal(v, 64u << 10);
    assert_int_equal(options_parse_size("-1", &v), -1);
    assert_int_equal(options_parse_size("1X", &v), -1);
    assert_int_equal(options_parse_size("99999999999999999999G", &v), -1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults), cmocka_unit_test(test_all_flags),
        cmocka_unit_test(test_env), cmocka_unit_test(test_bad_flags),
        cmocka_unit_test(test_sizes), cmocka_unit_test(test_device),
    };
    return cmocka_run_group_tests_name("options", tests, NULL, NULL);
}
