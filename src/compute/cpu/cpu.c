/* CPU backend entry points: SIMD level detection, the shared thread pool, and the matmul driver
 * that splits work over threads and picks the matvec (decode) or gemm (prefill) regime.
 *
 * Threads split matmuls over output rows (every row of one matrix has the same number of bytes):
 * matvecs in one contiguous run of equal bytes per thread with stealing of chunks at the end
 * (see matvec_split_mode), several matrices that share x in one job (cpu_matmul_multi); gemms in
 * contiguous ranges of equal size.
 * Refuses: weight views the kernels cannot trust (bad bits/group size, missing pointers): the
 * output is zeroed and the error logged once (the loader validates views; this is a bug guard). */
#include "compute/cpu/cpu_internal.h"
#include "compute/cpu/matmul_amx.h"

#include "base/cpus.h"
#include "base/log.h"

#include <cblas.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif
#if defined(__aarch64__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int thread_count;
static cpus machine_cpus;
static pthread_once_t machine_cpus_once = PTHREAD_ONCE_INIT;

static void machine_cpus_detect(void) { cpus_detect(&machine_cpus); }

void cpu_set_threads(int n) {
    thread_count = n;
}

int cpu_threads(void) {
    if (thread_count <= 0) {
        pthread_once(&machine_cpus_once, machine_cpus_detect);
        thread_count = machine_cpus.n_fast;
    }
    return thread_count;
}

static threadpool *shared_pool;
static pthread_once_t shared_pool_once = PTHREAD_ONCE_INIT;

/* A pool job: each thread keeps to the fast cores from now on. */
static void pin_to_fast(void *ctx, int thread_index, int n_threads) {
    (void)thread_index, (void)n_threads;
    pthread_setaffinity_np(pthread_self(), sizeof(cpu_set_t), (const cpu_set_t *)ctx);
}

static void shared_pool_create(void) {
    shared_pool = threadpool_create(cpu_threads(), -1); /* NULL on failure: ops run inline */
    pthread_once(&machine_cpus_once, machine_cpus_detect);
    const cpus *m = &machine_cpus;
    if (!m->mixed) return;
    char list[256];
    cpus_format_list(&m->fast, list, sizeof list);
    /* On cores of two speeds a step waits for its slowest thread: as many threads as fast cores
     * or fewer keep to those (the scheduler would otherwise move them onto little ones). */
    if (cpu_threads() <= m->n_fast) {
        threadpool_run(shared_pool, 0, pin_to_fast, (void *)&m->fast);
        log_info("cpu: %d thread%s on the fast cores %s (of %d usable CPUs)", cpu_threads(),
                 cpu_threads() == 1 ? "" : "s", list, m->n_usable);
    } else {
        log_info("cpu: %d threads, more than the %d fast cores (%s): not pinned", cpu_threads(),
                 m->n_fast, list);
    }
}

threadpool *cpu_thread_pool(void) {
    pthread_once(&shared_pool_once, shared_pool_create);
    return shared_pool;
}

/* ---- SIMD level ---------------------------------------------------------------------------- */

#if defined(__x86_64__)
/* Feature bits straight from CPUID and XGETBV (the OS must save the wide registers too). */
typedef struct x86_features {
    int avx2, avx512;
} x86_features;

static x86_features x86_detect(void) {
    x86_features f = {0, 0};
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
    int fma = (c >> 12) & 1, osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, f16c = (c >> 29) & 1;
    if (!osxsave || !avx) return f;
    unsigned xcr0_lo, xcr0_hi;
    __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
    if ((xcr0_lo & 0x6u) != 0x6u) return f; /* XMM and YMM state */
    if (__get_cpuid_max(0, NULL) < 7) return f;
    __cpuid_count(7, 0, a, b, c, d);
    f.avx2 = fma && f16c && ((b >> 5) & 1);
    int avx512f = (b >> 16) & 1, dq = (b >> 17) & 1, bw = (b >> 30) & 1, vl = (b >> 31) & 1;
    int vbmi = (c >> 1) & 1, gfni = (c >> 8) & 1, vnni = (c >> 11) & 1;
    int zmm_state = (xcr0_lo & 0xe6u) == 0xe6u; /* opmask, upper ZMM0-15, ZMM16-31 */
    /* GFNI: split_nibbles (mlx_avx512.h); every CPU with VBMI and VNNI has it (Ice Lake and
     * later, Zen 4 and later) */
    f.avx512 = f.avx2 && zmm_state && avx512f && dq && bw && vl && vbmi && vnni && gfni;
    return f;
}

/* CPUID traps to the hypervisor in a VM (microseconds): detect once. */
static _Atomic int x86_bits = -1;

static x86_features x86_cached(void) {
    int v = atomic_load_explicit(&x86_bits, memory_order_relaxed);
    if (v < 0) {
        x86_features f = x86_detect();
        v = f.avx2 | f.avx512 << 1;
        atomic_store(&x86_bits, v);
    }
    return (x86_features){v & 1, (v >> 1) & 1};
}
#endif

#if defined(__aarch64__)
/* aarch64 features from the kernel's HWCAP words (the instructions are not readable from user
 * space on every kernel): bit 0 ASIMD dotprod, bit 1 i8mm. Read once. */
static _Atomic int arm_bits = -1;

static int arm_cached(void) {
    int v = atomic_load_explicit(&arm_bits, memory_order_relaxed);
    if (v < 0) {
        unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
        v = ((hw & HWCAP_ASIMD) && (hw & HWCAP_ASIMDDP) ? 1 : 0) | (hw2 & HWCAP2_I8MM ? 2 : 0);
        atomic_store(&arm_bits, v);
    }
    return v;
}
#endif

int cpu_neon_i8mm(void) {
#if defined(__aarch64__)
    return (arm_cached() & 2) && cpu_level_supported(CPU_LEVEL_NEON_DOTPROD);
#else
    return 0;
#endif
}

/* What the hardware (and this build) offers, before EXO_CPU_SIMD. */
static int level_in_hardware(cpu_level level) {
    switch (level) {
    case CPU_LEVEL_GENERIC: return 1;
#if defined(__x86_64__)
    case CPU_LEVEL_AVX2: return x86_cached().avx2;
    case CPU_LEVEL_AVX512: return x86_cached().avx512;
#endif
#if defined(__aarch64__)
    case CPU_LEVEL_NEON: return 1;
    case CPU_LEVEL_NEON_DOTPROD: return (arm_cached() & 1) && cpu_kernels_neon_dotprod.matvec;
#endif
    default: return 0;
    }
}

static const char *const level_names[CPU_LEVEL_COUNT] = {"generic", "avx2", "avx512", "neon",
                                                         "neon-dotprod"};

/* The highest level EXO_CPU_SIMD allows (generic|avx2|avx512|neon|neon-dotprod; levels of the
 * other architecture never exist here, so the enum order is the order within each family). */
static cpu_level level_cap(void) {
    static _Atomic int cap = -1;
    int c = atomic_load_explicit(&cap, memory_order_relaxed);
    if (c < 0) {
        c = CPU_LEVEL_COUNT - 1;
        const char *env = getenv("EXO_CPU_SIMD");
        for (int l = 0; env && l < CPU_LEVEL_COUNT; l++)
            if (!strcmp(env, level_names[l])) c = l;
        atomic_store(&cap, c);
    }
    return (cpu_level)c;
}

int cpu_level_supported(cpu_level level) {
    return level >= 0 && level < CPU_LEVEL_COUNT && level <= level_cap() && level_in_hardware(level);
}

const cpu_kernels *cpu_kernels_for(cpu_level level) {
    if (!cpu_level_supported(level)) return NULL;
    switch (level) {
    case CPU_LEVEL_GENERIC: return &cpu_kernels_generic;
#if defined(__x86_64__)
    case CPU_LEVEL_AVX2: return &cpu_kernels_avx2;
    case CPU_LEVEL_AVX512: return &cpu_kernels_avx512;
#endif
#if defined(__aarch64__)
    case CPU_LEVEL_NEON: return &cpu_kernels_neon;
    case CPU_LEVEL_NEON_DOTPROD: return &cpu_kernels_neon_dotprod;
#endif
    default: return NULL;
    }
}

static _Atomic int best_level = -1;

/* The best supported level (cpu_level_supported already applies EXO_CPU_SIMD). */
static cpu_level cpu_best_level(void) {
    int l = atomic_load_explicit(&best_level, memory_order_relaxed);
    if (l >= 0) return (cpu_level)l;
    l = CPU_LEVEL_GENERIC;
    for (int c = CPU_LEVEL_GENERIC + 1; c < CPU_LEVEL_COUNT; c++)
        if (cpu_level_supported((cpu_level)c)) l = c;
    atomic_store(&best_level, l);
    return (cpu_level)l;
}

const cpu_kernels *cpu_kernels_best(void) {
    return cpu_kernels_for(cpu_best_level());
}

const char *cpu_simd_level(void) {
    return cpu_kernels_best()->name;
}

/* ---- weight checks and activation preparation --------------------------------------------- */

int cpu_weight_supported(const weight_matrix *w) {
    if (!w || !w->data || w->rows <= 0 || w->cols <= 0) return 0;
    switch (w->format) {
    case WEIGHT_F32: case WEIGHT_F16: case WEIGHT_BF16: return 1;
    case WEIGHT_MLX_AFFINE:
        if (w->bits != 2 && w->bits != 3 && w->bits != 4 && w->bits != 5 && w->bits != 6 &&
            w->bits != 8)
            return 0;
        if (w->group_size != 32 && w->group_size != 64 && w->group_size != 128) return 0;
        if (w->cols % w->group_size != 0 || !w->scales || !w->biases) return 0;
        if (w->layout != WEIGHT_LAYOUT_MLX &&
            (w->layout != WEIGHT_LAYOUT_MLX_ROWS16 || (w->bits != 4 && w->bits != 8) || w->cols % 128))
            return 0; /* the interleaved layout exists for 4- and 8-bit rows of whole 128-value chunks */
        return w->scale_dtype == DTYPE_BF16 || w->scale_dtype == DTYPE_F16 ||
               w->scale_dtype == DTYPE_F32;
    }
    return 0;
}

/* Fills in->xq/xscale/xsum for MLX weights. Returns 0 or -1 (out of memory). */
static int prepare_mlx_input(const cpu_kernels *k, const weight_matrix *w, matvec_input *in,
                             void **owned) {
    int want_int16 = k->needs_int16_x;
    int64_t n = in->n_tokens, cols = w->cols, gs = w->group_size, groups = cols / gs;
    size_t floats = (size_t)(n * groups);
    size_t bytes = 2 * floats * sizeof(float) + (want_int16 ? (size_t)(n * cols) * 2 : 0);
    char *mem = malloc(bytes);
    if (!mem) return -1;
    *owned = mem;
    float *xsum = (float *)mem, *xscale = xsum + floats;
    int16_t *xq = want_int16 ? (int16_t *)(xscale + floats) : NULL;
    for (int64_t t = 0; t < n; t++) {
        for (int64_t g = 0; g < groups; g++) {
            const float *xs = in->x + t * cols + g * gs;
            float sum = 0, amax = 0;
            for (int64_t c = 0; c < gs; c++) {
                sum += xs[c];
                float a = fabsf(xs[c]);
                amax = a > amax ? a : amax;
            }
            xsum[t * groups + g] = sum;
            if (!want_int16) continue;
            float xmax = (float)cpu_mlx_x_max(k, w);
            float scale = amax / xmax;
            float inv = amax > 0 ? xmax / amax : 0.0f;
            xscale[t * groups + g] = scale;
            int16_t *q = xq + t * cols + g * gs;
            for (int64_t c = 0; c < gs; c++) q[c] = (int16_t)lrintf(xs[c] * inv);
        }
    }
    int per_byte = want_int16 ? cpu_mlx_x_permuted(w) : 0;
    if (per_byte) { /* see cpu_mlx_x_permuted: reorder each chunk of V values */
        int64_t V = 32 * per_byte;
        int16_t tmp[128];
        for (int64_t t = 0; t < n; t++)
            for (int64_t c0 = 0; c0 < cols; c0 += V) {
                int16_t *q = xq + t * cols + c0;
                for (int k = 0; k < per_byte; k++)
                    for (int j = 0; j < 32; j++) tmp[k * 32 + j] = q[j * per_byte + k];
                memcpy(q, tmp, (size_t)V * sizeof *q);
            }
    }
    if (want_int16 && cpu_mlx_x_planes(w))
        for (int64_t t = 0; t < n; t++) cpu_mlx_x_to_planes(xq + t * cols, cols);
    if (want_int16 && cpu_mlx_x_planes8(k, w))
        for (int64_t t = 0; t < n; t++) cpu_mlx_x_to_planes8(xq + t * cols, cols);
    in->xsum = xsum;
    in->xscale = xscale;
    in->xq = xq;
    return 0;
}

static int prepare_mlx(const cpu_kernels *k, const weight_matrix *w, matvec_input *in, void **owned) {
    if (!k->prepare_mlx) return prepare_mlx_input(k, w, in, owned);
    int64_t n = in->n_tokens, cols = w->cols, groups = cols / w->group_size;
    size_t floats = (size_t)(n * groups);
    char *mem = cpu_scratch(3, 2 * floats * sizeof(float) + (size_t)(n * cols) * 2 + 64);
    if (!mem) return -1;
    float *xsum = (float *)mem, *xscale = xsum + floats;
    int16_t *xq = (int16_t *)(xscale + floats);
    k->prepare_mlx(w, in->x, n, xsum, xscale, xq);
    in->xsum = xsum;
    in->xscale = xscale;
    in->xq = xq;
    return 0;
}

/* ---- scratch memory -------------------------------------------------------------------------- */

typedef struct scratch_slot {
    void *p;
    size_t bytes;
} scratch_slot;

/* Per-thread slots live behind a pthread key so a thread's buffers are freed when it exits. */
static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;

static void scratch_free(void *p) {
    scratch_slot *slots = p;
    for (int i = 0; i < 4; i++) free(slots[i].p);
    free(slots);
}

static void scratch_key_create(void) {
    pthread_key_create(&scratch_key, scratch_free);
}

void *cpu_scratch(int slot, size_t bytes) {
    pthread_once(&scratch_once, scratch_key_create);
    scratch_slot *slots = pthread_getspecific(scratch_key);
    if (!slots) {
        slots = calloc(4, sizeof *slots);
        if (!slots || pthread_setspecific(scratch_key, slots) != 0) {
            free(slots);
            return NULL;
        }
    }
    scratch_slot *s = &slots[slot & 3];
    if (s->bytes >= bytes && s->p) return s->p;
    free(s->p);
    size_t rounded = (bytes + 4095) & ~(size_t)4095;
    s->p = aligned_alloc(64, rounded);
    s->bytes = s->p ? rounded : 0;
    return s->p;
}

/* ---- matvec regime ------------------------------------------------------------------------- */

/* One matvec job covers up to CPU_MATMUL_MULTI_MAX matrices that read the same activations
 * (q/k/v, gate/up): one dispatch and one barrier for all of them, and each thread streams one
 * contiguous run of bytes across them. */
typedef struct matvec_part {
    const weight_matrix *w;
    matvec_input in;
    float *y;
    size_t row_bytes; /* weight bytes per row: data + scales + biases */
    size_t first_byte; /* offset of the part's first row in the job's byte space */
    int64_t first_chunk; /* dynamic split: the part's first chunk index */
    int64_t chunk_rows;
} matvec_part;

/* [front, back) of a thread's chunk indices in one word: the owner takes from the front, a thread
 * that has finished its own takes from the back. */
typedef struct steal_range {
    _Atomic uint64_t range;
    char pad[56]; /* one cache line each */
} steal_range;

#define CPU_STEAL_MAX_THREADS 64

typedef struct matvec_job {
    const cpu_kernels *k;
    int n_parts;
    matvec_part parts[CPU_MATMUL_MULTI_MAX];
    size_t total_bytes;
    int64_t total_chunks;
    _Atomic int64_t next_chunk;
    steal_range ranges[CPU_STEAL_MAX_THREADS]; /* split 2: each thread's chunks, front and back */
} matvec_job;

/* How a matvec job's rows are split over threads (EXO_MATVEC_SPLIT):
 *   steal (default): each thread owns one contiguous run of equal bytes, cut into chunks of ~1/8
 *     of it, and works through them front to back; a thread that has finished takes chunks from
 *     the back of another's run. On an idle machine every thread streams one run, as static; on a
 *     busy one a thread that lost its core does not hold the step up, as dynamic.
 *   static: one contiguous run of equal bytes per thread, nothing else.
 *   dynamic: chunks handed out first come first served from one counter. */
static _Atomic int matvec_split = -1; /* -1: not read yet; else a CPU_SPLIT_* */

void cpu_matvec_set_split(int split) {
    atomic_store(&matvec_split, split >= CPU_SPLIT_STATIC && split <= CPU_SPLIT_STEAL ? split : CPU_SPLIT_STEAL);
}

static int matvec_split_mode(void) {
    int m = atomic_load_explicit(&matvec_split, memory_order_relaxed);
    if (m < 0) {
        const char *e = getenv("EXO_MATVEC_SPLIT");
        m = !e ? CPU_SPLIT_STEAL : !strcmp(e, "static") ? CPU_SPLIT_STATIC
            : !strcmp(e, "dynamic") ? CPU_SPLIT_DYNAMIC : CPU_SPLIT_STEAL;
        atomic_store(&matvec_split, m);
    }
    return m;
}

int cpu_env_switch(_Atomic int *cache, const char *name, const char *off_word) {
    int v = atomic_load_explicit(cache, memory_order_relaxed);
    if (v < 0) {
        const char *e = getenv(name);
        v = !(e && !strcmp(e, off_word));
        atomic_store(cache, v);
    }
    return v;
}

static _Atomic int matvec_q4_planes = -1;

int cpu_matvec_q4_planes(void) {
    return cpu_env_switch(&matvec_q4_planes, "EXO_MATVEC_Q4", "int16");
}

void cpu_matvec_set_q4_planes(int on) {
    atomic_store(&matvec_q4_planes, on ? 1 : 0);
}

/* The x86 CPU's vendor from CPUID leaf 0 (ebx, edx, ecx spell it): 'I' GenuineIntel, 'A'
 * AuthenticAMD, 0 anything else (and every other architecture). */
static int cpu_vendor(void) {
#if defined(__x86_64__)
    unsigned a, b, c, d;
    if (!__get_cpuid(0, &a, &b, &c, &d)) return 0;
    if (b == 0x756e6547u && d == 0x49656e69u && c == 0x6c65746eu) return 'I';
    if (b == 0x68747541u && d == 0x69746e65u && c == 0x444d4163u) return 'A';
#endif
    return 0;
}

static _Atomic int matvec_prefetch_l2 = -1;

int cpu_matvec_prefetch_l2(void) {
    int v = atomic_load_explicit(&matvec_prefetch_l2, memory_order_relaxed);
    if (v < 0) {
        v = cpu_vendor() == 'I';
        const char *e = getenv("EXO_MATVEC_PREFETCH_L2");
        if (e && (!strcmp(e, "0") || !strcmp(e, "1"))) v = e[0] == '1';
        atomic_store(&matvec_prefetch_l2, v);
    }
    return v;
}

void cpu_matvec_set_prefetch_l2(int on) {
    atomic_store(&matvec_prefetch_l2, on ? 1 : 0);
}

static _Atomic long matvec_prefetch = -1;

size_t cpu_matvec_prefetch(void) {
    long v = atomic_load_explicit(&matvec_prefetch, memory_order_relaxed);
    if (v < 0) {
        const char *e = getenv("EXO_MATVEC_PREFETCH");
        v = e ? atol(e) : CPU_MATVEC_PREFETCH_DEFAULT;
        if (v < 0 || v > (1l << 20)) v = CPU_MATVEC_PREFETCH_DEFAULT;
        v &= ~63l;
        atomic_store(&matvec_prefetch, v);
    }
    return (size_t)v;
}

static _Atomic int matvec_streams = -1;

int cpu_matvec_streams(void) {
    int v = atomic_load_explicit(&matvec_streams, memory_order_relaxed);
    if (v < 0) {
        const char *e = getenv("EXO_MATVEC_STREAMS");
        v = e && (!strcmp(e, "1") || !strcmp(e, "2") || !strcmp(e, "4")) ? atoi(e) : cpu_vendor() == 'A' ? 1 : 2;
        atomic_store(&matvec_streams, v);
    }
    return v;
}

void cpu_matvec_set_streams(int streams) {
    atomic_store(&matvec_streams, streams == 1 || streams == 4 ? streams : 2);
}

void cpu_matvec_set_prefetch(size_t bytes) {
    atomic_store(&matvec_prefetch, (long)(bytes > (1u << 20) ? CPU_MATVEC_PREFETCH_DEFAULT : bytes & ~(size_t)63));
}

static void matvec_static_share(void *p, int i, int nth) {
    matvec_job *job = p;
    size_t b0 = job->total_bytes / (size_t)nth * (size_t)i, b1 = job->total_bytes / (size_t)nth * (size_t)(i + 1);
    if (i == nth - 1) b1 = job->total_bytes;
    for (int k = 0; k < job->n_parts; k++) {
        const matvec_part *pt = &job->parts[k];
        size_t lo = pt->first_byte, hi = lo + (size_t)pt->w->rows * pt->row_bytes;
        if (b1 <= lo || b0 >= hi) continue;
        /* Row r belongs to the thread whose byte range holds the row's first byte. */
        int64_t r0 = b0 <= lo ? 0 : (int64_t)((b0 - lo + pt->row_bytes - 1) / pt->row_bytes);
        int64_t r1 = b1 >= hi ? pt->w->rows : (int64_t)((b1 - lo + pt->row_bytes - 1) / pt->row_bytes);
        if (pt->w->layout == WEIGHT_LAYOUT_MLX_ROWS16) { /* whole blocks of 16 rows per thread */
            r0 = r0 + 15 < pt->w->rows ? (r0 + 15) & ~(int64_t)15 : pt->w->rows;
            r1 = r1 + 15 < pt->w->rows ? (r1 + 15) & ~(int64_t)15 : pt->w->rows;
        }
        if (r1 > r0) job->k->matvec(pt->w, &pt->in, pt->y, r0, r1);
    }
}

static void matvec_chunk(const matvec_job *job, int64_t c) {
    int k = 0;
    while (k + 1 < job->n_parts && job->parts[k + 1].first_chunk <= c) k++;
    const matvec_part *pt = &job->parts[k];
    int64_t r0 = (c - pt->first_chunk) * pt->chunk_rows;
    int64_t r1 = r0 + pt->chunk_rows < pt->w->rows ? r0 + pt->chunk_rows : pt->w->rows;
    job->k->matvec(pt->w, &pt->in, pt->y, r0, r1);
}

static void matvec_dynamic_share(void *p, int i, int nth) {
    (void)i;
    (void)nth;
    matvec_job *job = p;
    for (;;) {
        int64_t c = atomic_fetch_add_explicit(&job->next_chunk, 1, memory_order_relaxed);
        if (c >= job->total_chunks) return;
        matvec_chunk(job, c);
    }
}

/* Takes one chunk from the front (owner) or the back (thief) of a range; 0 when it is empty. */
static int steal_take(steal_range *s, int from_back, int64_t *chunk) {
    uint64_t v = atomic_load_explicit(&s->range, memory_order_relaxed);
    for (;;) {
        uint32_t front = (uint32_t)(v >> 32), back = (uint32_t)v;
        if (front >= back) return 0;
        uint64_t next = from_back ? ((uint64_t)front << 32) | (back - 1)
                                  : ((uint64_t)(front + 1) << 32) | back;
        if (atomic_compare_exchange_weak_explicit(&s->range, &v, next, memory_order_relaxed,
                                                  memory_order_relaxed)) {
            *chunk = from_back ? back - 1 : front;
            return 1;
        }
    }
}

static void matvec_steal_share(void *p, int i, int nth) {
    matvec_job *job = p;
    int64_t c;
    while (steal_take(&job->ranges[i], 0, &c)) matvec_chunk(job, c);
    for (int k = 1; k < nth; k++) {
        steal_range *victim = &job->ranges[(i + k) % nth];
        while (steal_take(victim, 1, &c)) matvec_chunk(job, c);
    }
}

/* One pass of n_tokens <= CPU_MATVEC_MAX_TOKENS over n matrices; x_off/y_off select the pass's
 * tokens. Returns 0 or -1 (out of memory). */
static int matvec_run(const cpu_kernels *k, const weight_matrix *const *ws, int n, const float *x,
                      float *const *ys, int64_t t0, int64_t n_tokens) {
    matvec_job job = {.k = k, .n_parts = n};
    void *owned[CPU_MATMUL_MULTI_MAX] = {0};
    threadpool *pool = cpu_thread_pool();
    int nth = threadpool_size(pool);
    int rc = 0, slot3_used = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        matvec_part *pt = &job.parts[i];
        const weight_matrix *w = ws[i];
        pt->w = w;
        pt->y = ys[i] + t0 * w->rows;
        pt->in = (matvec_input){.x = x + t0 * w->cols, .n_tokens = n_tokens};
        pt->row_bytes = weight_matrix_bytes(w) / (size_t)w->rows;
        pt->first_byte = job.total_bytes;
        job.total_bytes += pt->row_bytes * (size_t)w->rows;
        int64_t chunk = w->rows / ((int64_t)nth * 8);
        /* multiples of 16 rows for the interleaved layout: a chunk is whole blocks */
        int64_t align = w->layout == WEIGHT_LAYOUT_MLX_ROWS16 ? 15 : 3;
        pt->chunk_rows = chunk < 16 ? 16 : (chunk + align) & ~align;
        pt->first_chunk = job.total_chunks;
        job.total_chunks += (w->rows + pt->chunk_rows - 1) / pt->chunk_rows;
        if (w->format != WEIGHT_MLX_AFFINE) continue;
        /* Matrices of the same shape and quantization share the prepared activations. */
        const matvec_part *same = NULL;
        for (int j = 0; j < i && !same; j++) {
            const weight_matrix *v = ws[j];
            if (v->format == WEIGHT_MLX_AFFINE && v->cols == w->cols && v->bits == w->bits &&
                v->group_size == w->group_size && cpu_mlx_x_planes(v) == cpu_mlx_x_planes(w) &&
                cpu_mlx_x_planes8(k, v) == cpu_mlx_x_planes8(k, w))
                same = &job.parts[j];
        }
        if (same) {
            pt->in = same->in;
        } else if (!slot3_used) { /* the kernel's own preparation into thread scratch slot 3 */
            rc = prepare_mlx(k, w, &pt->in, &owned[i]);
            slot3_used = k->prepare_mlx != NULL;
        } else {
            rc = prepare_mlx_input(k, w, &pt->in, &owned[i]);
        }
    }
    if (rc == 0) {
        atomic_init(&job.next_chunk, 0);
        int use = (int)(job.total_chunks < nth ? job.total_chunks : nth);
        int mode = matvec_split_mode();
        if (mode == CPU_SPLIT_STEAL && (use > CPU_STEAL_MAX_THREADS || job.total_chunks > UINT32_MAX))
            mode = CPU_SPLIT_DYNAMIC;
        if (mode == CPU_SPLIT_STEAL)
            for (int i = 0; i < use; i++) {
                uint64_t f = (uint64_t)(job.total_chunks * i / use), b = (uint64_t)(job.total_chunks * (i + 1) / use);
                atomic_init(&job.ranges[i].range, f << 32 | b);
            }
        threadpool_run(pool, use, mode == CPU_SPLIT_STATIC ? matvec_static_share
                                  : mode == CPU_SPLIT_DYNAMIC ? matvec_dynamic_share
                                                              : matvec_steal_share, &job);
    }
    for (int i = 0; i < n; i++) free(owned[i]);
    return rc;
}

/* ---- gemm regime, own micro-kernel --------------------------------------------------------- */

typedef struct gemm_job {
    const cpu_kernels *k;
    const weight_matrix *w;
    const float *x;
    float *y;
    int64_t n_tokens;
    float *xpanels; /* [token blocks][cols][NR] */
    _Atomic int failed;
} gemm_job;

static void pack_x_range(void *p, int64_t begin, int64_t end, int thread_index) {
    (void)thread_index;
    gemm_job *job = p;
    int64_t K = job->w->cols;
    for (int64_t tb = begin; tb < end; tb++) {
        float *dst = job->xpanels + tb * K * CPU_GEMM_NR;
        int64_t t0 = tb * CPU_GEMM_NR;
        int nt = (int)(job->n_tokens - t0 < CPU_GEMM_NR ? job->n_tokens - t0 : CPU_GEMM_NR);
        for (int j = 0; j < nt; j++) { /* read each token row sequentially */
            const float *src = job->x + (t0 + j) * K;
            for (int64_t c = 0; c < K; c++) dst[c * CPU_GEMM_NR + j] = src[c];
        }
        for (int j = nt; j < CPU_GEMM_NR; j++)
            for (int64_t c = 0; c < K; c++) dst[c * CPU_GEMM_NR + j] = 0.0f;
    }
}

static void gemm_own_range(void *p, int64_t rb_begin, int64_t rb_end, int thread_index) {
    (void)thread_index;
    gemm_job *job = p;
    const weight_matrix *w = job->w;
    int64_t K = w->cols, rows = w->rows;
    int64_t ntb = (job->n_tokens + CPU_GEMM_NR - 1) / CPU_GEMM_NR;
    size_t panel = (size_t)CPU_GEMM_MR * CPU_GEMM_KC * sizeof(float);
    float *tmp = cpu_scratch(1, panel), *wpanel = cpu_scratch(2, panel);
    if (!tmp || !wpanel) {
        atomic_store(&job->failed, 1);
        return;
    }
    for (int64_t kc = 0; kc < K; kc += CPU_GEMM_KC) {
        int64_t kl = K - kc < CPU_GEMM_KC ? K - kc : CPU_GEMM_KC;
        for (int64_t rb = rb_begin; rb < rb_end; rb++) {
            int64_t r0 = rb * CPU_GEMM_MR;
            int mv = (int)(rows - r0 < CPU_GEMM_MR ? rows - r0 : CPU_GEMM_MR);
            job->k->gemm_pack(w, r0, mv, kc, kl, wpanel, tmp);
            for (int64_t tb = 0; tb < ntb; tb++) {
                int64_t t0 = tb * CPU_GEMM_NR;
                int nv = (int)(job->n_tokens - t0 < CPU_GEMM_NR ? job->n_tokens - t0 : CPU_GEMM_NR);
                job->k->gemm_tile(wpanel, job->xpanels + (tb * K + kc) * CPU_GEMM_NR, kl,
                                  job->y + t0 * rows + r0, rows, mv, nv, kc > 0);
            }
        }
    }
}

static int gemm_own_run(const cpu_kernels *k, const weight_matrix *w, const float *x, float *y,
                        int64_t n_tokens) {
    int64_t ntb = (n_tokens + CPU_GEMM_NR - 1) / CPU_GEMM_NR;
    gemm_job job = {.k = k, .w = w, .x = x, .y = y, .n_tokens = n_tokens};
    job.xpanels = cpu_scratch(0, (size_t)(ntb * w->cols * CPU_GEMM_NR) * sizeof(float));
    if (!job.xpanels) return -1;
    threadpool *pool = cpu_thread_pool();
    threadpool_parallel_for(pool, ntb, pack_x_range, &job);
    threadpool_parallel_for(pool, (w->rows + CPU_GEMM_MR - 1) / CPU_GEMM_MR, gemm_own_range, &job);
    return atomic_load(&job.failed) ? -1 : 0;
}

/* ---- gemm regime, OpenBLAS ----------------------------------------------------------------- */

static pthread_once_t openblas_once = PTHREAD_ONCE_INIT;

/* We split work over our own pool; OpenBLAS must not start threads of its own on top. */
static void openblas_single_thread(void) {
    openblas_set_num_threads(1);
}

#define OPENBLAS_ROW_TILE 64

static void gemm_openblas_range(void *p, int64_t begin, int64_t end, int thread_index) {
    (void)thread_index;
    gemm_job *job = p;
    const weight_matrix *w = job->w;
    int64_t K = w->cols, rows = w->rows, n = job->n_tokens;
    if (w->format == WEIGHT_F32) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)(end - begin), (int)K,
                    1.0f, job->x, (int)K, (const float *)w->data + begin * K, (int)K, 0.0f,
                    job->y + begin, (int)rows);
        return;
    }
    float *tmp = cpu_scratch(1, (size_t)(OPENBLAS_ROW_TILE * K) * sizeof(float));
    if (!tmp) {
        atomic_store(&job->failed, 1);
        return;
    }
    for (int64_t r0 = begin; r0 < end; r0 += OPENBLAS_ROW_TILE) {
        int64_t rt = end - r0 < OPENBLAS_ROW_TILE ? end - r0 : OPENBLAS_ROW_TILE;
        for (int64_t i = 0; i < rt; i++) job->k->dequant(w, r0 + i, 0, K, tmp + i * K);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)rt, (int)K, 1.0f,
                    job->x, (int)K, tmp, (int)K, 0.0f, job->y + r0, (int)rows);
    }
}

static int gemm_openblas_run(const cpu_kernels *k, const weight_matrix *w, const float *x, float *y,
                             int64_t n_tokens) {
    pthread_once(&openblas_once, openblas_single_thread);
    gemm_job job = {.k = k, .w = w, .x = x, .y = y, .n_tokens = n_tokens};
    threadpool_parallel_for(cpu_thread_pool(), w->rows, gemm_openblas_range, &job);
    return atomic_load(&job.failed) ? -1 : 0;
}

/* ---- MLX int16 gemm (AVX-512, batched decode) ------------------------------------------------ */

#if defined(__x86_64__)
typedef struct mlx_gemm_job {
    int n;
    const weight_matrix *ws[CPU_MATMUL_MULTI_MAX];
    float *ys[CPU_MATMUL_MULTI_MAX];
    mlx_gemm_x px[CPU_MATMUL_MULTI_MAX];
    int px_of[CPU_MATMUL_MULTI_MAX]; /* which px each matrix reads (matrices share one per group size) */
    int64_t chunk_rows[CPU_MATMUL_MULTI_MAX], first_chunk[CPU_MATMUL_MULTI_MAX + 1];
    const float *x;
    int prep; /* the px being prepared */
    _Atomic int failed; /* a chunk found no memory: the caller falls back to another path */
} mlx_gemm_job;

static void mlx_gemm_prepare_range(void *p, int64_t g0, int64_t g1, int thread_index) {
    (void)thread_index;
    mlx_gemm_job *job = p;
    cpu_mlx_gemm_prepare(job->x, &job->px[job->prep], g0, g1);
}

static void mlx_gemm_chunks(void *p, int64_t c0, int64_t c1, int thread_index) {
    (void)thread_index;
    mlx_gemm_job *job = p;
    for (int64_t c = c0; c < c1; c++) {
        int i = 0;
        while (c >= job->first_chunk[i + 1]) i++;
        const weight_matrix *w = job->ws[i];
        int64_t r0 = (c - job->first_chunk[i]) * job->chunk_rows[i];
        int64_t r1 = r0 + job->chunk_rows[i] < w->rows ? r0 + job->chunk_rows[i] : w->rows;
        if (cpu_mlx_gemm_rows(w, &job->px[job->px_of[i]], job->ys[i], r0, r1) != 0) atomic_store(&job->failed, 1);
    }
}

/* Returns 0, or -1 when out of memory (ys partly written: the caller computes them again). */
static int mlx_gemm_run(int n, const weight_matrix *const *ws, const float *x, float *const *ys,
                        int64_t n_tokens) {
    mlx_gemm_job job = {.n = n, .x = x};
    void *owned[CPU_MATMUL_MULTI_MAX] = {0};
    int n_px = 0, rc = 0;
    threadpool *pool = cpu_thread_pool();
    int64_t nth = threadpool_size(pool);
    for (int i = 0; i < n && rc == 0; i++) {
        const weight_matrix *w = ws[i];
        job.ws[i] = w;
        job.ys[i] = ys[i];
        int same = -1;
        for (int j = 0; j < n_px && same < 0; j++)
            if (job.px[j].group_size == w->group_size &&
                job.px[j].pairs4 == cpu_mlx_gemm_pairs4(w->bits, n_tokens))
                same = j;
        if (same < 0) {
            size_t bytes = cpu_mlx_gemm_x_bytes(n_tokens, w->cols, w->group_size);
            void *mem = n_px == 0 ? cpu_scratch(0, bytes) : (owned[n_px] = aligned_alloc(64, (bytes + 63) & ~(size_t)63));
            if (!mem) {
                rc = -1;
                break;
            }
            cpu_mlx_gemm_x_init(&job.px[n_px], mem, n_tokens, w->cols, w->group_size, w->bits);
            job.prep = n_px;
            threadpool_parallel_for(pool, w->cols / w->group_size, mlx_gemm_prepare_range, &job);
            same = n_px++;
        }
        job.px_of[i] = same;
        /* ~8 chunks per thread, in multiples of 12 rows (every tile height divides 12) */
        int64_t chunk = (w->rows / (nth * 8) + 11) / 12 * 12;
        job.chunk_rows[i] = chunk < 12 ? 12 : chunk;
        job.first_chunk[i + 1] = job.first_chunk[i] + (w->rows + job.chunk_rows[i] - 1) / job.chunk_rows[i];
    }
    if (rc == 0) threadpool_parallel_for_dynamic(pool, job.first_chunk[n], 1, mlx_gemm_chunks, &job);
    for (int i = 0; i < n; i++) free(owned[i]);
    return rc == 0 && atomic_load(&job.failed) ? -1 : rc;
}

/* EXO_MLX_GEMM=0 leaves 9..256-token MLX matmuls to the matvec passes and the f32 gemm, as
 * before the MLX int16 gemm existed (A/B runs only). */
static int mlx_gemm_enabled(void) {
    static _Atomic int on = -1;
    return cpu_env_switch(&on, "EXO_MLX_GEMM", "0");
}

/* Whether cpu_matmul_multi_with runs the MLX int16 gemm for these matrices. */
static int use_mlx_gemm(const cpu_kernels *k, int n, const weight_matrix *const *ws,
                        int64_t n_tokens, cpu_gemm_engine gemm, int max_matvec_tokens) {
    if (k != &cpu_kernels_avx512) return 0;
    for (int i = 0; i < n; i++)
        if (ws[i]->format != WEIGHT_MLX_AFFINE) return 0;
    if (gemm == CPU_GEMM_MLX_INT) return n_tokens > (max_matvec_tokens < 0 ? 0 : max_matvec_tokens);
    int rows16 = 0; /* all interleaved: their matvec passes beat it (max_matvec_default) */
    for (int i = 0; i < n; i++) rows16 += ws[i]->layout == WEIGHT_LAYOUT_MLX_ROWS16;
    if (rows16 == n) return 0;
    return gemm == CPU_GEMM_AUTO && max_matvec_tokens < 0 && mlx_gemm_enabled() &&
           n_tokens >= CPU_MLX_GEMM_MIN_TOKENS &&
           n_tokens <= CPU_MLX_GEMM_MAX_TOKENS;
}

/* Whether every matrix of a cpu_matmul_multi_with call runs on the AMX tiles (matmul_amx.h). */
static int amx_takes(int n, const weight_matrix *const *ws, int64_t n_tokens) {
    for (int i = 0; i < n; i++)
        if (!cpu_amx_ok(ws[i], n_tokens)) return 0;
    return 1;
}
#endif

/* ---- entry points -------------------------------------------------------------------------- */

static int check_view(const weight_matrix *w, float *y, int64_t n_tokens) {
    if (cpu_weight_supported(w)) return 0;
    /* The model loader validates views, so this is a bug upstream: answer zeros (never read
     * through a bad view) and say so once. */
    static _Atomic int warned;
    if (!atomic_exchange(&warned, 1))
        log_error("cpu_matmul: unsupported weight view (format %d, %lldx%lld, bits %d, group %d); "
                  "output set to zero", w ? (int)w->format : -1, w ? (long long)w->rows : 0LL,
                  w ? (long long)w->cols : 0LL, w ? w->bits : 0, w ? w->group_size : 0);
    if (y && w && w->rows > 0) memset(y, 0, (size_t)(n_tokens * w->rows) * sizeof *y);
    return -1;
}

static int is_avx512(const cpu_kernels *k) {
#if defined(__x86_64__)
    return k == &cpu_kernels_avx512;
#else
    (void)k;
    return 0;
#endif
}

static int max_matvec_default(const cpu_kernels *k, const weight_matrix *w) {
    if (w->layout == WEIGHT_LAYOUT_MLX_ROWS16)
        return is_avx512(k) ? INT32_MAX : CPU_MATVEC_PASSES_Q4_ROWS16; /* cpu_internal.h */
    return w->format == WEIGHT_MLX_AFFINE ? CPU_MATVEC_PASSES_MLX : CPU_MATVEC_PASSES_DENSE;
}

int cpu_matmul_multi_with(int n, const weight_matrix *const *ws, const float *x, float *const *ys,
                          int64_t n_tokens, cpu_level level, cpu_gemm_engine gemm,
                          int max_matvec_tokens) {
    const cpu_kernels *k = cpu_kernels_for(level);
    if (!k || n < 1 || n > CPU_MATMUL_MULTI_MAX) return -1;
    if (n_tokens <= 0) return 0;
    int bad = 0;
    for (int i = 0; i < n; i++) {
        if (check_view(ws[i], ys[i], n_tokens)) bad = 1;
        else if (ws[i]->layout != WEIGHT_LAYOUT_MLX && !(k->rows16_bits & (1u << ws[i]->bits))) {
            /* layout.c repacks only for a level that reads the interleaved rows of that width */
            static _Atomic int warned;
            if (!atomic_exchange(&warned, 1))
                log_error("cpu_matmul: a 16-row interleaved %d-bit matrix at SIMD level %s, which reads "
                          "it in MLX order only; output set to zero", ws[i]->bits, k->name);
            memset(ys[i], 0, (size_t)(n_tokens * ws[i]->rows) * sizeof(float));
            bad = 1;
        }
        else if (ws[i]->cols != ws[0]->cols) { /* they must share x */
            memset(ys[i], 0, (size_t)(n_tokens * ws[i]->rows) * sizeof(float));
            bad = 1;
        }
    }
    if (bad) return -1;
#if defined(__x86_64__)
    if (k == &cpu_kernels_avx512 && gemm == CPU_GEMM_AUTO && max_matvec_tokens < 0 && amx_takes(n, ws, n_tokens) &&
        cpu_amx_matmul_multi(n, ws, x, ys, n_tokens) == 0)
        return 0;
    if (use_mlx_gemm(k, n, ws, n_tokens, gemm, max_matvec_tokens) &&
        mlx_gemm_run(n, ws, x, ys, n_tokens) == 0)
        return 0;
#endif
    int mv = max_matvec_tokens;
    for (int i = 0; i < n && max_matvec_tokens < 0; i++) {
        int d = max_matvec_default(k, ws[i]);
        mv = i == 0 || d < mv ? d : mv;
    }
    if (n_tokens <= mv) { /* passes of up to 8 tokens over all the weights */
        for (int64_t t0 = 0; t0 < n_tokens; t0 += CPU_MATVEC_MAX_TOKENS) {
            int64_t m = n_tokens - t0 < CPU_MATVEC_MAX_TOKENS ? n_tokens - t0 : CPU_MATVEC_MAX_TOKENS;
            if (matvec_run(k, ws, n, x, ys, t0, m) != 0) { /* out of memory: slow but right */
                for (int i = 0; i < n; i++) cpu_matmul_reference(ws[i], x, ys[i], n_tokens);
                return 0;
            }
        }
        return 0;
    }
    for (int i = 0; i < n; i++) {
        const weight_matrix *w = ws[i];
        int rc;
        if (k->gemm_tile && gemm != CPU_GEMM_OPENBLAS) rc = gemm_own_run(k, w, x, ys[i], n_tokens);
        else rc = gemm_openblas_run(k, w, x, ys[i], n_tokens);
        if (rc != 0) cpu_matmul_reference(w, x, ys[i], n_tokens); /* out of memory */
    }
    return 0;
}

int cpu_matmul_with(const weight_matrix *w, const float *x, float *y, int64_t n_tokens,
                    cpu_level level, cpu_gemm_engine gemm, int max_matvec_tokens) {
    return cpu_matmul_multi_with(1, &w, x, &y, n_tokens, level, gemm, max_matvec_tokens);
}

/* Whether w's activations must stay float (weight_matrix.exact_activations), unless
 * EXO_EXACT_ACTIVATIONS=0 (A/B runs) says to ignore the hint. */
static int wants_exact(const weight_matrix *w) {
    static _Atomic int honour = -1;
    return w->exact_activations && w->format == WEIGHT_MLX_AFFINE &&
           cpu_env_switch(&honour, "EXO_EXACT_ACTIVATIONS", "0");
}

/* A matrix that wants float activations. At the AVX-512 level: its residual-plane kernel (4-bit),
 * else the f32 gemm for an interleaved matrix (layout.c
 * interleaves exact 4-bit matrices only at this level; the gemm dequantizes to f32). Else the
 * best level whose kernels keep MLX-order activations float (AVX-512 and NEON dotprod round
 * them to int16 per group for their integer dot products; AVX2 and NEON do not). */
static void matmul_exact(const weight_matrix *w, const float *x, float *y, int64_t n_tokens) {
    cpu_level best = cpu_best_level();
    if (best == CPU_LEVEL_AVX512 && cpu_mlx4_exact_ok(w, n_tokens) &&
        cpu_mlx4_exact_matmul(w, x, y, n_tokens) == 0)
        return;
    if (w->layout == WEIGHT_LAYOUT_MLX_ROWS16 && best == CPU_LEVEL_AVX512 &&
        cpu_matmul_with(w, x, y, n_tokens, best, CPU_GEMM_OWN, 0) == 0)
        return;
    cpu_level level = best == CPU_LEVEL_AVX512         ? CPU_LEVEL_AVX2
                      : best == CPU_LEVEL_NEON_DOTPROD ? CPU_LEVEL_NEON
                                                       : best;
    cpu_matmul_with(w, x, y, n_tokens, level, CPU_GEMM_AUTO, -1);
}

/* The exact matrices of a cpu_matmul_multi call: one job where the residual kernel takes them
 * all (the GatedDeltaNet projections q/k/v, z, b, a), else one by one. */
static void matmul_exact_multi(int n, const weight_matrix *const *ws, const float *x, float *const *ys,
                               int64_t n_tokens) {
    int all = cpu_best_level() == CPU_LEVEL_AVX512;
    for (int i = 0; i < n && all; i++) all = cpu_mlx4_exact_ok(ws[i], n_tokens) && ws[i]->cols == ws[0]->cols;
    if (all && cpu_mlx4_exact_matmul_multi(n, ws, x, ys, n_tokens) == 0) return;
    for (int i = 0; i < n; i++) matmul_exact(ws[i], x, ys[i], n_tokens);
}

void cpu_matmul(const weight_matrix *w, const float *x, float *y, int64_t n_tokens) {
    if (wants_exact(w)) matmul_exact(w, x, y, n_tokens);
    else cpu_matmul_with(w, x, y, n_tokens, cpu_best_level(), CPU_GEMM_AUTO, -1);
}

/* EXO_MATMUL_FUSE=0 runs the matrices of cpu_matmul_multi one job each (for A/B runs). */
static int matmul_fuse(void) {
    static _Atomic int fuse = -1;
    return cpu_env_switch(&fuse, "EXO_MATMUL_FUSE", "0");
}

void cpu_matmul_multi(int n, const weight_matrix *const *ws, const float *x, float *const *ys,
                      int64_t n_tokens) {
    const weight_matrix *fused[CPU_MATMUL_MULTI_MAX], *exact[CPU_MATMUL_MULTI_MAX];
    float *fused_y[CPU_MATMUL_MULTI_MAX], *exact_y[CPU_MATMUL_MULTI_MAX];
    int n_fused = 0, n_exact = 0;
    for (int i = 0; i < n && i < CPU_MATMUL_MULTI_MAX; i++) n_exact += wants_exact(ws[i]);
    if (n_exact && n <= CPU_MATMUL_MULTI_MAX) { /* those together, the rest together */
        n_exact = 0;
        for (int i = 0; i < n; i++) {
            if (wants_exact(ws[i])) {
                exact[n_exact] = ws[i];
                exact_y[n_exact++] = ys[i];
                continue;
            }
            fused[n_fused] = ws[i];
            fused_y[n_fused++] = ys[i];
        }
        matmul_exact_multi(n_exact, exact, x, exact_y, n_tokens);
        if (n_fused) cpu_matmul_multi(n_fused, fused, x, fused_y, n_tokens);
        return;
    }
    if (!matmul_fuse()) {
        for (int i = 0; i < n; i++) cpu_matmul(ws[i], x, ys[i], n_tokens);
        return;
    }
    if (n > CPU_MATMUL_MULTI_MAX) { /* more than one job holds: split */
        cpu_matmul_multi(CPU_MATMUL_MULTI_MAX, ws, x, ys, n_tokens);
        cpu_matmul_multi(n - CPU_MATMUL_MULTI_MAX, ws + CPU_MATMUL_MULTI_MAX, x,
                         ys + CPU_MATMUL_MULTI_MAX, n_tokens);
        return;
    }
    cpu_matmul_multi_with(n, ws, x, ys, n_tokens, cpu_best_level(), CPU_GEMM_AUTO, -1);
}
