/*
 * prepare_math.cuh: the gates of the prepare step as PyTorch CUDA eager computes them, one
 * rounded operation at a time (the __f*_rn intrinsics keep nvcc from contracting them),
 * shared by prepare.cu and the fused decode core (decode_core.cu): beta = sigmoid(b) and
 * g = (-exp(A_log)) * softplus(a + dt_bias); and where the decode prepare copies a conv channel.
 */
#ifndef GDP_PREPARE_MATH_CUH
#define GDP_PREPARE_MATH_CUH

#include <math.h>

namespace {

/* sigmoid exactly as torch: 1 / (1 + exp(-b)) in fp32, IEEE division. */
__device__ __forceinline__ float eager_sigmoid(float b) {
    return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-b)));
}

/* g exactly as torch: (-exp(A_log)) * softplus(a + dt_bias), threshold a strict > 20. */
__device__ __forceinline__ float eager_decay(float a, float dt_bias, float A_log) {
    const float x = __fadd_rn(a, dt_bias);
    const float sp = x > 20.0f ? x : log1pf(expf(x));
    return __fmul_rn(-expf(A_log), sp);
}

/* Where the decode prepare copies conv channel ch (of C = M H P value, M G N key, G N query channels)
 * of request b: put(dst, index, zero) once a place, with dst value, key or query and index its
 * element; zero: the place takes 0 instead (query copies other than M-1). Value once; a key channel
 * to each head of its group; a query channel to copy M-1 of each head of its group. Offsets within a
 * request in 32 bits (a request's q, k and v elements are far below 2^31). Shared by the fused
 * decode front (decode_core.cu) and the GEMV with the front as its epilogue (gemv_front.cu). */
template <typename Put>
__device__ __forceinline__ void prepare_copy_targets(int32_t ch, int64_t b, int32_t M, int32_t H, int32_t G, int32_t P,
                                                     int32_t N, int32_t hpg, int64_t k_base, int64_t q_base,
                                                     void *value, void *key, void *query, Put put) {
    const int64_t value_elems = (int64_t)M * H * P, kq_elems = (int64_t)M * H * N;
    if (ch < (int32_t)k_base) { /* value[(m), h, :] = x[(m*H + h)*P + :] */
        put(value, b * value_elems + ch, false);
    } else if (ch < (int32_t)q_base) { /* key[(m), h, c] = x[K_BASE + (m*G + h/hpg)*N + c] for each h of the group */
        const int32_t kk = ch - (int32_t)k_base;
        const int32_t c = kk % N, mg = kk / N, grp = mg % G, m = mg / G;
        for (int32_t i = 0; i < hpg; i++) {
            const int32_t h = grp * hpg + i;
            put(key, b * kq_elems + ((m * H + h) * N + c), false);
        }
    } else { /* query[(M-1), h, c] = x[Q_BASE + (h/hpg)*N + c]; zeros on the other copies */
        const int32_t qq = ch - (int32_t)q_base;
        const int32_t c = qq % N, grp = qq / N;
        for (int32_t i = 0; i < hpg; i++) {
            const int32_t h = grp * hpg + i;
            for (int32_t m = 0; m < M; m++)
                put(query, b * kq_elems + ((m * H + h) * N + c), m != M - 1);
        }
    }
}

} // namespace

#endif /* GDP_PREPARE_MATH_CUH */
