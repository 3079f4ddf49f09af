/* stream (bench/kernels-cpu27, issue 25): what limits one core's DRAM read stream on this VM. Reads
 * a 1 GiB array in 2 MiB pages with loops that differ in load width and issue rate, variants
 * alternated rep by rep, 1 or 2 threads (wall clock):
 *   z4: zmm loads, 4 independent vaddps chains (bench.c's AVX-512 probe loop)
 *   y1: ymm loads, 1 vaddps chain (what GCC makes of bench.c's plain loop: 8 B/cycle issue cap)
 *   z1: zmm loads, 1 chain;  y4: ymm loads, 4 chains
 *   zd: zmm loads, 2 vpdpbusd each into 4 chains (the 8-bit interleaved kernel's inner loop)
 *   yd: the same with the line read as two ymm halves joined by vinserti64x4
 *   zdp/ydp: zd/yd with prefetcht1 2 KiB ahead once per line
 *   zdt/zdtp: zd/zdp plus a scalar load of each line's second half
 *   zs/ys: zdp/ydp plus two side streams (32 B of scales and of biases per 2 KiB, other arrays)
 * Build: gcc -O2 -pthread -o stream bench/kernels-cpu27/stream.c */
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#define T __attribute__((target("avx512f,avx512bw,avx512vnni,avx2")))
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static volatile float sink;
T static void z4(const char *p, size_t n) {
    __m512 a = _mm512_setzero_ps(), b = a, c = a, d = a;
    for (size_t i = 0; i < n; i += 256) {
        a = _mm512_add_ps(a, _mm512_load_ps((const float *)(p + i)));
        b = _mm512_add_ps(b, _mm512_load_ps((const float *)(p + i + 64)));
        c = _mm512_add_ps(c, _mm512_load_ps((const float *)(p + i + 128)));
        d = _mm512_add_ps(d, _mm512_load_ps((const float *)(p + i + 192)));
    }
    sink = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a, b), _mm512_add_ps(c, d)));
}
T static void z1(const char *p, size_t n) {
    __m512 a = _mm512_setzero_ps();
    for (size_t i = 0; i < n; i += 64) a = _mm512_add_ps(a, _mm512_load_ps((const float *)(p + i)));
    sink = _mm512_reduce_add_ps(a);
}
T static void ya1(const char *p, size_t n) {
    __m256 a = _mm256_setzero_ps();
    for (size_t i = 0; i < n; i += 32) a = _mm256_add_ps(a, _mm256_load_ps((const float *)(p + i)));
    float t[8]; _mm256_storeu_ps(t, a); sink = t[0] + t[7];
}
T static void y4(const char *p, size_t n) {
    __m256 a = _mm256_setzero_ps(), b = a, c = a, d = a;
    for (size_t i = 0; i < n; i += 128) {
        a = _mm256_add_ps(a, _mm256_load_ps((const float *)(p + i)));
        b = _mm256_add_ps(b, _mm256_load_ps((const float *)(p + i + 32)));
        c = _mm256_add_ps(c, _mm256_load_ps((const float *)(p + i + 64)));
        d = _mm256_add_ps(d, _mm256_load_ps((const float *)(p + i + 96)));
    }
    float t[8]; _mm256_storeu_ps(t, _mm256_add_ps(_mm256_add_ps(a, b), _mm256_add_ps(c, d))); sink = t[0] + t[7];
}
static const char *xb;
T static inline __m512i dp(__m512i acc, __m512i a, const char *p) {
    __asm__("vpdpbusd %[b]%{1to16%}, %[a], %[acc]" : [acc] "+v"(acc) : [a] "v"(a), [b] "m"(*(const char(*)[4])p));
    return acc;
}
T static inline void pf(const char *p) { __asm__ volatile("prefetcht1 (%0)" : : "r"(p)); }
#define DLOOP(LOAD, PF)                                                                                  \
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0; \
    for (size_t i = 0; i < n; i += 256) {                                                                \
        if (PF) { pf(p + i + 2048); pf(p + i + 2112); pf(p + i + 2176); pf(p + i + 2240); }            \
        __m512i v0 = LOAD(p + i), v1 = LOAD(p + i + 64), v2 = LOAD(p + i + 128), v3 = LOAD(p + i + 192); \
        const char *x = xb + ((i >> 4) & 1020);                                                          \
        a0 = dp(a0, v0, x), b0 = dp(b0, v0, x + 128), a1 = dp(a1, v1, x + 4), b1 = dp(b1, v1, x + 132); \
        a2 = dp(a2, v2, x + 8), b2 = dp(b2, v2, x + 136), a3 = dp(a3, v3, x + 12), b3 = dp(b3, v3, x + 140); \
    }                                                                                                    \
    __m512i s = _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(a0, a1), _mm512_add_epi32(a2, a3)),  \
                                 _mm512_add_epi32(_mm512_add_epi32(b0, b1), _mm512_add_epi32(b2, b3)));  \
    sink = (float)_mm512_reduce_add_epi32(s);
T static inline __m512i lz(const char *p) { return _mm512_load_si512(p); }
T static inline __m512i ly(const char *p) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_load_si256((const __m256i *)p)), _mm256_load_si256((const __m256i *)(p + 32)), 1);
}
/* zmm load plus a scalar touch of the line's second half (a load-port uop only, no vector ALU):
 * two ascending accesses per line, like the ymm halves */
static unsigned long touch_sink;
#define TOUCH(p) ({ unsigned long t_; __asm__ volatile("movzbl 32(%1), %k0" : "=r"(t_) : "r"(p)); touch_sink += t_; })
T static inline __m512i lt(const char *p) { TOUCH(p); return _mm512_load_si512(p); }
T static void zdt(const char *p, size_t n) { DLOOP(lt, 0) }
T static void zdtp(const char *p, size_t n) { DLOOP(lt, 1) }
/* + the kernel's two side streams: 32 bytes of scales and 32 of biases per 2 KiB of lines, from
 * two other arrays (the 8-bit g64 interleaved layout), read and prefetched once per 2 KiB */
static const char *side_s, *side_b;
#define SLOOP(LOAD)                                                                                      \
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0; \
    __m256i sacc = _mm256_setzero_si256();                                                               \
    size_t off = (size_t)(p - buf) / 64;                                                                 \
    for (size_t i = 0; i < n; i += 256) {                                                                \
        pf(p + i + 2048); pf(p + i + 2112); pf(p + i + 2176); pf(p + i + 2240);                         \
        if ((i & 2047) == 0) {                                                                           \
            const char *ss = side_s + off + i / 64, *sb = side_b + off + i / 64;                         \
            pf(ss + 32); pf(sb + 32);                                                                    \
            sacc = _mm256_add_epi32(sacc, _mm256_add_epi32(_mm256_loadu_si256((const __m256i *)ss),      \
                                                           _mm256_loadu_si256((const __m256i *)sb)));    \
        }                                                                                                \
        __m512i v0 = LOAD(p + i), v1 = LOAD(p + i + 64), v2 = LOAD(p + i + 128), v3 = LOAD(p + i + 192); \
        const char *x = xb + ((i >> 4) & 1020);                                                          \
        a0 = dp(a0, v0, x), b0 = dp(b0, v0, x + 128), a1 = dp(a1, v1, x + 4), b1 = dp(b1, v1, x + 132); \
        a2 = dp(a2, v2, x + 8), b2 = dp(b2, v2, x + 136), a3 = dp(a3, v3, x + 12), b3 = dp(b3, v3, x + 140); \
    }                                                                                                    \
    __m512i s = _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(a0, a1), _mm512_add_epi32(a2, a3)),  \
                                 _mm512_add_epi32(_mm512_add_epi32(b0, b1), _mm512_add_epi32(b2, b3)));  \
    sink = (float)_mm512_reduce_add_epi32(s) + (float)_mm256_extract_epi32(sacc, 0);
static char *buf;
T static void zs(const char *p, size_t n) { SLOOP(lz) }
T static void ys(const char *p, size_t n) { SLOOP(ly) }
T static void zd(const char *p, size_t n) { DLOOP(lz, 0) }
T static void yd(const char *p, size_t n) { DLOOP(ly, 0) }
T static void zdp(const char *p, size_t n) { DLOOP(lz, 1) }
T static void ydp(const char *p, size_t n) { DLOOP(ly, 1) }
typedef void (*fn_t)(const char *, size_t);
static const struct { const char *name; fn_t fn; } V[] = {{"z4", z4}, {"y1", ya1}, {"z1", z1}, {"y4", y4}, {"zd", zd}, {"yd", yd}, {"zdp", zdp}, {"ydp", ydp}, {"zdt", zdt}, {"zdtp", zdtp}, {"zs", zs}, {"ys", ys}};
enum { NV = sizeof V / sizeof *V };
static size_t total; static int nth; static fn_t cur;
static pthread_barrier_t bar;
static void *worker(void *arg) {
    long i = (long)arg; size_t part = total / nth;
    for (;;) { pthread_barrier_wait(&bar); if (!cur) return NULL; cur(buf + part * i, part); pthread_barrier_wait(&bar); }
}
static int cmpd(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return x < y ? -1 : x > y; }
int main(int argc, char **argv) {
    nth = argc > 1 ? atoi(argv[1]) : 1; int reps = argc > 2 ? atoi(argv[2]) : 7;
    total = (size_t)1 << 30;
    buf = aligned_alloc((size_t)2 << 20, total); madvise(buf, total, MADV_HUGEPAGE);
    memset(buf, 1, total);
    xb = aligned_alloc(64, 4096); memset((void *)xb, 3, 4096);
    { size_t sl = total / 64 + 4096; char *a = aligned_alloc((size_t)2 << 20, (sl + (2 << 20)) & ~(size_t)((2 << 20) - 1)), *b = aligned_alloc((size_t)2 << 20, (sl + (2 << 20)) & ~(size_t)((2 << 20) - 1));
      madvise(a, sl, MADV_HUGEPAGE), madvise(b, sl, MADV_HUGEPAGE); memset(a, 1, sl), memset(b, 2, sl); side_s = a, side_b = b; }
    pthread_barrier_init(&bar, NULL, (unsigned)nth);
    pthread_t th[8];
    for (long i = 1; i < nth; i++) pthread_create(&th[i], NULL, worker, (void *)i);
    double g[NV][64];
    for (int r = -1; r < reps; r++)
        for (int v = 0; v < NV; v++) {
            int vi = (v + (r > 0 ? r : 0)) % NV;
            cur = V[vi].fn; double t0 = now();
            pthread_barrier_wait(&bar); cur(buf, total / nth); pthread_barrier_wait(&bar);
            if (r >= 0) g[vi][r] = total / (now() - t0) * 1e-9;
        }
    cur = NULL; pthread_barrier_wait(&bar);
    for (int v = 0; v < NV; v++) { qsort(g[v], reps, sizeof(double), cmpd); printf("%-4s %d threads: median %6.2f GB/s  best %6.2f\n", V[v].name, nth, g[v][reps / 2], g[v][reps - 1]); }
    return 0;
}
