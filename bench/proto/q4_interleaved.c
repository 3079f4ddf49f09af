// Standalone prototype (not part of exo's build): the 4-bit MLX g64 matvec with rows interleaved
// in blocks of 16, the layout proposed for issues 3 and 6 (bench/RESULTS.md, third session).
// One dword lane per row: lane r of vector k holds values 8k..8k+7 of row r's group (4 bytes, as
// MLX stores them), so each group's int32 dot products of 16 rows accumulate in lanes and are
// converted and scaled once per group and token, with no horizontal sums; the activations are
// the same int16 byte planes as matmul_avx512.c's (exact int16 products), read by broadcast.
// Weights, scales and activations here are synthetic: it measures speed, not results.
//   gcc -O3 -march=native -funroll-loops -o /tmp/q4i bench/proto/q4_interleaved.c && taskset -c 0 /tmp/q4i
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#define T __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")))
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
enum { GS = 64 };
// interleaved weights: [rb][g][k=0..7][lane r=0..15] dwords; scales/biases [rb][g][16] floats
// activations per token: planes per group: hi_e[8 dwords], hi_o[8], lo_e[8], lo_o[8] -> 128 bytes/group
T static inline __attribute__((always_inline)) void kern(const uint32_t *W, const float *S, const float *B, const uint8_t *X, const float *xs,
                   const float *xsum, float *y, int rows, int cols, int nt) {
  int groups = cols / GS; const __m512i m0f = _mm512_set1_epi8(0x0f);
  for (int rb = 0; rb < rows / 16; rb++) {
    __m512 acc[8];
    for (int t = 0; t < nt; t++) acc[t] = _mm512_setzero_ps();
    for (int g = 0; g < groups; g++) {
      const uint32_t *w = W + ((size_t)rb * groups + g) * 128;
      __m512i ah[8], al[8];
      for (int t = 0; t < nt; t++) ah[t] = al[t] = _mm512_setzero_si512();
      for (int k = 0; k < 8; k++) {
        __m512i v = _mm512_loadu_si512(w + 16 * k);
        __m512i we = _mm512_and_si512(v, m0f), wo = _mm512_and_si512(_mm512_srli_epi16(v, 4), m0f);
        for (int t = 0; t < nt; t++) {
          const uint32_t *xp = (const uint32_t *)(X + ((size_t)t * groups + g) * 128);
          ah[t] = _mm512_dpbusd_epi32(ah[t], we, _mm512_set1_epi32((int)xp[k]));
          ah[t] = _mm512_dpbusd_epi32(ah[t], wo, _mm512_set1_epi32((int)xp[8 + k]));
          al[t] = _mm512_dpbusd_epi32(al[t], _mm512_set1_epi32((int)xp[16 + k]), we);
          al[t] = _mm512_dpbusd_epi32(al[t], _mm512_set1_epi32((int)xp[24 + k]), wo);
        }
      }
      __m512 sc = _mm512_loadu_ps(S + ((size_t)rb * groups + g) * 16), bi = _mm512_loadu_ps(B + ((size_t)rb * groups + g) * 16);
      for (int t = 0; t < nt; t++) {
        __m512i a = _mm512_add_epi32(_mm512_slli_epi32(ah[t], 8), al[t]);
        __m512 sv = _mm512_mul_ps(sc, _mm512_set1_ps(xs[t * groups + g]));
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a), sv, acc[t]);
        acc[t] = _mm512_fmadd_ps(bi, _mm512_set1_ps(xsum[t * groups + g]), acc[t]);
      }
    }
    for (int t = 0; t < nt; t++) _mm512_storeu_ps(y + (size_t)t * rows + rb * 16, acc[t]);
  }
}
T __attribute__((noinline)) static void run(const uint32_t *W, const float *S, const float *B, const uint8_t *X, const float *xs,
                   const float *xsum, float *y, int rows, int cols, int nt) {
  switch (nt) { case 1: kern(W,S,B,X,xs,xsum,y,rows,cols,1); break; case 2: kern(W,S,B,X,xs,xsum,y,rows,cols,2); break;
  case 4: kern(W,S,B,X,xs,xsum,y,rows,cols,4); break; default: kern(W,S,B,X,xs,xsum,y,rows,cols,8); }
}
int main(int argc, char **argv) { (void)argc; (void)argv;
  int rows = 896, cols = 2048, groups = cols / GS;  // ~0.9 MB of 4-bit weights: L2-resident (2 MB L2)
  size_t nw = (size_t)rows * cols / 8;
  uint32_t *W = aligned_alloc(64, nw * 4); float *S = aligned_alloc(64, rows * groups * 4), *B = aligned_alloc(64, rows * groups * 4);
  uint8_t *X = aligned_alloc(64, 8 * groups * 128); float xs[8 * 64], xsum[8 * 64], *y = aligned_alloc(64, 8 * rows * 4);
  for (size_t i = 0; i < nw; i++) W[i] = (uint32_t)(i * 2654435761u);
  for (int i = 0; i < rows * groups; i++) S[i] = 0.01f, B[i] = -0.05f;
  for (int i = 0; i < 8 * groups * 128; i++) X[i] = (uint8_t)(i * 7);
  for (int i = 0; i < 8 * groups; i++) xs[i] = 1e-4f, xsum[i] = 0.1f;
  for (int nt = 1; nt <= 8; nt *= 2) {
    double best = 1e9;
    for (int r = 0; r < 200; r++) { double t0 = now(); run(W, S, B, X, xs, xsum, y, rows, cols, nt); double t = now() - t0; if (t < best) best = t; }
    double bytes = nw * 4 + 2.0 * rows * groups * 2;  // weights + bf16 scales/biases as MLX stores them
    printf("interleaved q4 g64 %dx%d, %d token(s): %.1f GB/s per core (L2)\n", rows, cols, nt, bytes / best * 1e-9);
  }
  return (int)y[0] & 0;
}
