/*
 * mma_tf32.cuh: fp32 products on the tensor cores through tf32 (mma.sync m16n8k8, fp32 accumulate):
 * the rounding of an fp32 value to tf32 and its split into a tf32 high part and the remainder, so that
 * two or three mmas carry a product to about 2^-21 where one would carry it to 2^-11. Shared by the
 * decode op's tensor-core kernel (recurrent_mma.cuh) and the chunk op's split fix-up
 * (chunk/hopper_split.cuh).
 */
#ifndef GDP_MMA_TF32_CUH
#define GDP_MMA_TF32_CUH

#include <stdint.h>

namespace {

__device__ __forceinline__ uint32_t mma_tf32_hi(float x) {
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
    return r;
}

/* x = hi + lo with hi = tf32(x) (the lo word's low 13 bits are ignored by the mma: x to about 2^-21). */
__device__ __forceinline__ void mma_tf32_split(float x, uint32_t &hi, uint32_t &lo) {
    hi = mma_tf32_hi(x);
    lo = __float_as_uint(x - __uint_as_float(hi));
}

/* d += a b: m16n8k8, tf32 inputs (the low 13 bits of each word are ignored), fp32 accumulate. */
__device__ __forceinline__ void mma_tf32(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

} // namespace

#endif /* GDP_MMA_TF32_CUH */
