/*
 * prepare_math.cuh: the gates of the prepare step as PyTorch CUDA eager computes them, one
 * rounded operation at a time (the __f*_rn intrinsics keep nvcc from contracting them),
 * shared by prepare.cu and the fused decode core (decode_core.cu): beta = sigmoid(b) and
 * g = (-exp(A_log)) * softplus(a + dt_bias).
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

} // namespace

#endif /* GDP_PREPARE_MATH_CUH */
