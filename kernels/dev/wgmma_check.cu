/*
 * wgmma_check.cu: kernels/chunk/wgmma.cuh on the GPU, before any kernel relies on it. One
 * warpgroup forms D = A B (64 x 64, K = 128: eight m64n64k16 steps across two 64-column panels)
 * with A and B in shared memory in the 128-byte-swizzled panel layout, for each of the four
 * operand majors (A K- or M-major, B K- or N-major), and compares D with a double-precision
 * product of the same bf16 values; D is poisoned (NaN) first. A wrong descriptor field or swizzle
 * gives errors of the order of the values, far above the fp32 accumulation's (about 1e-6 of the
 * largest value here). Exit 0 when all four pass, 1 on a failure, 77 without a compute
 * capability 9.0 GPU (sm_90a code runs on no other).
 * Build: -DGDP_BUILD_CHUNK_DEV=ON, target wgmma_check (compiled for sm_90a only).
 */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "chunk/wgmma.cuh"

constexpr int WM = 64, WN = 64, WK = 128;

/* A [WM][WK] and B [WK][WN] row-major in global memory; D [WM][WN]. TA / TB: 1 = MN-major. */
template <int TA, int TB>
__global__ void __launch_bounds__(128) wgmma_check_kernel(const __nv_bfloat16 *A, const __nv_bfloat16 *B, float *D) {
    extern __shared__ unsigned char smem_raw[];
    /* 1024-byte aligned panels: the swizzle is a function of the address bits */
    const uint32_t raw = wg_smem_u32(smem_raw), pad = (1024u - (raw & 1023u)) & 1023u;
    unsigned char *sa = smem_raw + pad, *sb = sa + WM * WK * 2;
    const int tid = threadIdx.x;
    for (int e = tid; e < WM * WK; e += 128) {
        const int m = e / WK, k = e % WK;
        *reinterpret_cast<__nv_bfloat16 *>(sa + (TA ? wg_offset(WK, k, m) : wg_offset(WM, m, k))) = A[e];
    }
    for (int e = tid; e < WK * WN; e += 128) {
        const int k = e / WN, n = e % WN;
        *reinterpret_cast<__nv_bfloat16 *>(sb + (TB ? wg_offset(WK, k, n) : wg_offset(WN, n, k))) = B[e];
    }
    wg_fence_smem();
    __syncthreads();
    float d[32];
#pragma unroll
    for (int i = 0; i < 32; i++)
        d[i] = 0.0f;
    wg_fence();
#pragma unroll
    for (int ks = 0; ks < WK / 16; ks++) {
        const uint64_t da = TA ? wg_desc_mnmajor(sa, WK, ks * 16, 0) : wg_desc_kmajor(sa, WM, 0, ks * 16);
        const uint64_t db = TB ? wg_desc_mnmajor(sb, WK, ks * 16, 0) : wg_desc_kmajor(sb, WN, 0, ks * 16);
        wg_mma_m64n64k16<TA, TB>(d, da, db, ks > 0);
    }
    wg_commit();
    wg_wait<0>();
    const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
#pragma unroll
    for (int i = 0; i < 32; i++) {
        const int j = i >> 2, e = i & 3;
        D[(16 * warp + g + (e >> 1) * 8) * WN + 8 * j + 2 * t4 + (e & 1)] = d[i];
    }
}

static int fail(const char *what, cudaError_t err) {
    fprintf(stderr, "wgmma_check: %s: %s\n", what, cudaGetErrorString(err));
    return 1;
}

template <int TA, int TB>
static int check(const __nv_bfloat16 *dA, const __nv_bfloat16 *dB, float *dD, const float *a, const float *b) {
    const size_t smem = 1024 + (size_t)(WM * WK + WK * WN) * 2;
    cudaError_t err = cudaFuncSetAttribute(wgmma_check_kernel<TA, TB>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           (int)smem);
    if (err != cudaSuccess)
        return fail("cudaFuncSetAttribute", err);
    if ((err = cudaMemset(dD, 0xff, sizeof(float) * WM * WN)) != cudaSuccess) /* NaN poison */
        return fail("cudaMemset", err);
    wgmma_check_kernel<TA, TB><<<1, 128, smem>>>(dA, dB, dD);
    if ((err = cudaGetLastError()) != cudaSuccess || (err = cudaDeviceSynchronize()) != cudaSuccess)
        return fail("the kernel", err);
    static float out[WM * WN];
    if ((err = cudaMemcpy(out, dD, sizeof out, cudaMemcpyDeviceToHost)) != cudaSuccess)
        return fail("cudaMemcpy", err);
    double worst = 0.0, scale = 0.0;
    int bad = 0;
    for (int m = 0; m < WM; m++)
        for (int n = 0; n < WN; n++) {
            double ref = 0.0;
            for (int k = 0; k < WK; k++)
                ref += (double)a[m * WK + k] * (double)b[k * WN + n];
            const double diff = fabs((double)out[m * WN + n] - ref);
            if (!(diff <= worst)) /* NaN counts as the worst */
                worst = isnan(diff) ? INFINITY : diff;
            scale = fmax(scale, fabs(ref));
            bad += !(diff <= 1e-4 * (fabs(ref) + 1.0));
        }
    printf("A %s-major, B %s-major: max |D - ref| %.3e (largest |ref| %.3e), %d of %d elements off: %s\n",
           TA ? "M" : "K", TB ? "N" : "K", worst, scale, bad, WM * WN, bad ? "FAIL" : "ok");
    return bad != 0;
}

int main(void) {
    int dev = 0;
    cudaDeviceProp prop;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
        printf("wgmma_check: no CUDA device, skipped\n");
        return 77;
    }
    if (prop.major != 9 || prop.minor != 0) {
        printf("wgmma_check: compute capability %d.%d, sm_90a code needs 9.0: skipped\n", prop.major, prop.minor);
        return 77;
    }
    static float a[WM * WK], b[WK * WN];
    static __nv_bfloat16 ha[WM * WK], hb[WK * WN];
    srand(20261204);
    for (int i = 0; i < WM * WK; i++) {
        ha[i] = __float2bfloat16((float)rand() / RAND_MAX * 2.0f - 1.0f);
        a[i] = __bfloat162float(ha[i]);
    }
    for (int i = 0; i < WK * WN; i++) {
        hb[i] = __float2bfloat16((float)rand() / RAND_MAX * 2.0f - 1.0f);
        b[i] = __bfloat162float(hb[i]);
    }
    __nv_bfloat16 *dA = NULL, *dB = NULL;
    float *dD = NULL;
    cudaError_t err;
    if ((err = cudaMalloc(&dA, sizeof ha)) != cudaSuccess || (err = cudaMalloc(&dB, sizeof hb)) != cudaSuccess ||
        (err = cudaMalloc(&dD, sizeof(float) * WM * WN)) != cudaSuccess)
        return fail("cudaMalloc", err);
    if ((err = cudaMemcpy(dA, ha, sizeof ha, cudaMemcpyHostToDevice)) != cudaSuccess ||
        (err = cudaMemcpy(dB, hb, sizeof hb, cudaMemcpyHostToDevice)) != cudaSuccess)
        return fail("cudaMemcpy", err);
    int failures = check<0, 0>(dA, dB, dD, a, b) + check<0, 1>(dA, dB, dD, a, b) + check<1, 0>(dA, dB, dD, a, b) +
                   check<1, 1>(dA, dB, dD, a, b);
    cudaFree(dA);
    cudaFree(dB);
    cudaFree(dD);
    printf("wgmma_check: %d of 4 operand layouts failed\n", failures);
    return failures ? 1 : 0;
}
