// Prototype for benchmarks/experiments/cpu-kernels/measure_bf16_linear.py (issue 14, part 3); not used by specgraft.
// y[M,N] = x[M,K] (fp32) . w[N,K]^T (bf16 stored as uint16), fp32 accumulation; AVX2 + FMA.
// Each y[m,n] is summed in the same order whatever M is (8 lanes over k, then a fixed lane sum).
#include <immintrin.h>
#include <stdint.h>
static inline __m256 load_bf16(const uint16_t* p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16));
}
static inline float hsum(__m256 v) {
    float t[8]; _mm256_storeu_ps(t, v);
    return ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));
}
void bf16_linear(const float* x, const uint16_t* w, float* y, int M, int N, int K) {
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n += 2) {
        const uint16_t* w0 = w + (long)n * K;
        const uint16_t* w1 = w + (long)(n + 1) * K;
        int m = 0;
        for (; m + 4 <= M; m += 4) {
            __m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a03 = a00, a10 = a00, a11 = a00, a12 = a00, a13 = a00;
            const float *x0 = x + (long)m * K, *x1 = x0 + K, *x2 = x1 + K, *x3 = x2 + K;
            for (int k = 0; k < K; k += 8) {
                __m256 v0 = load_bf16(w0 + k), v1 = load_bf16(w1 + k);
                __m256 b0 = _mm256_loadu_ps(x0 + k), b1 = _mm256_loadu_ps(x1 + k), b2 = _mm256_loadu_ps(x2 + k), b3 = _mm256_loadu_ps(x3 + k);
                a00 = _mm256_fmadd_ps(b0, v0, a00); a01 = _mm256_fmadd_ps(b1, v0, a01); a02 = _mm256_fmadd_ps(b2, v0, a02); a03 = _mm256_fmadd_ps(b3, v0, a03);
                a10 = _mm256_fmadd_ps(b0, v1, a10); a11 = _mm256_fmadd_ps(b1, v1, a11); a12 = _mm256_fmadd_ps(b2, v1, a12); a13 = _mm256_fmadd_ps(b3, v1, a13);
            }
            y[(long)m * N + n] = hsum(a00); y[(long)(m + 1) * N + n] = hsum(a01); y[(long)(m + 2) * N + n] = hsum(a02); y[(long)(m + 3) * N + n] = hsum(a03);
            y[(long)m * N + n + 1] = hsum(a10); y[(long)(m + 1) * N + n + 1] = hsum(a11); y[(long)(m + 2) * N + n + 1] = hsum(a12); y[(long)(m + 3) * N + n + 1] = hsum(a13);
        }
        for (; m < M; m++) {
            __m256 a0 = _mm256_setzero_ps(), a1 = a0;
            const float* x0 = x + (long)m * K;
            for (int k = 0; k < K; k += 8) {
                __m256 b0 = _mm256_loadu_ps(x0 + k);
                a0 = _mm256_fmadd_ps(b0, load_bf16(w0 + k), a0);
                a1 = _mm256_fmadd_ps(b0, load_bf16(w1 + k), a1);
            }
            y[(long)m * N + n] = hsum(a0); y[(long)m * N + n + 1] = hsum(a1);
        }
    }
}
