/* CPU backend entry points. Until the SIMD kernels and the thread pool land, every op runs the
 * reference path on the calling thread. */
#include "compute/cpu/cpu.h"

#include <pthread.h>
#include <unistd.h>

static int thread_count;

void cpu_set_threads(int n) {
    thread_count = n;
}

int cpu_threads(void) {
    if (thread_count <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        thread_count = n > 0 ? (int)n : 1;
    }
    return thread_count;
}

static threadpool *shared_pool;
static pthread_once_t shared_pool_once = PTHREAD_ONCE_INIT;

static void shared_pool_create(void) {
    shared_pool = threadpool_create(cpu_threads(), -1); /* NULL on failure: ops run inline */
}

threadpool *cpu_thread_pool(void) {
    pthread_once(&shared_pool_once, shared_pool_create);
    return shared_pool;
}

const char *cpu_simd_level(void) {
    return "generic";
}

void cpu_matmul(const weight_matrix *w, const float *x, float *y, int64_t n_tokens) {
    cpu_matmul_reference(w, x, y, n_tokens);
}
