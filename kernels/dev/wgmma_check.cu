/*
 * wgmma_check.cu: kernels/chunk/wgmma.cuh on the GPU, before any kernel relies on it. One
 * warpgroup forms D = A B (64 x N, K = 128: eight m64nNk16 steps across two 64-column panels; N =
 * 64 and 128, the second with an N-major B across two panels, which exercises the MN-major LBO)
 * with A and B in shared memory in the 128-byte-swizzled panel layout, for each of the four
 * operand majors (A K- or M-major, B K- or N-major), and compares D with a double-precision
 * product of the same bf16 values; D is poisoned (NaN) first. A wrong descriptor field or swizzle
 * gives errors of the order of the values, far above the fp32 accumulation's (about 1e-6 of the
 * largest value here). Then the copy engine: a 64 x 128 tile loaded by two SWIZZLE_128B tensor-map
 * copies must land byte for byte where the threads' wg_offset puts it (the design's TMA-loaded
 * K, V and Q tiles and its thread-written S16, X' and v_new share one layout). Exit 0 when all
 * pass, 1 on a failure, 77 without a compute capability 9.0 GPU (sm_90a code runs on no other).
 * Build: -DGDP_BUILD_CHUNK_DEV=ON, target wgmma_check (compiled for sm_90a only).
 */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "chunk/tensor_map.h" /* the encoder, found through the runtime (no libcuda link) */
#include "chunk/wgmma.cuh"

constexpr int WM = 64, WN_MAX = 128, WK = 128;

/* B's stored columns: WN + BOFF rounded up to a whole panel (the panel layout's rows are 128 bytes
 * whatever the tile's width; a 32-column MN-major tile still takes 64 columns a row). */
template <int WN, int BOFF> __host__ __device__ constexpr int stored_cols() {
    return (WN + BOFF + WG_PANEL_COLS - 1) / WG_PANEL_COLS * WG_PANEL_COLS;
}

/* A [WM][WK] and B [WK][SWN] row-major in global memory (SWN = stored_cols); D [WM][WN] = A times B's
 * columns [BOFF, BOFF + WN). TA / TB: 1 = MN-major. WN = 32: the Hopper kernel's 32-column halves of
 * a 64-column tile (BOFF = 32: an MN-major start inside a panel, or K-major rows from 32). */
template <int TA, int TB, int WN, int BOFF = 0>
__global__ void __launch_bounds__(128) wgmma_check_kernel(const __nv_bfloat16 *A, const __nv_bfloat16 *B, float *D) {
    constexpr int SWN = stored_cols<WN, BOFF>();
    extern __shared__ unsigned char smem_raw[];
    /* 1024-byte aligned panels: the swizzle is a function of the address bits */
    const uint32_t raw = smem_u32(smem_raw), pad = (1024u - (raw & 1023u)) & 1023u;
    unsigned char *sa = smem_raw + pad, *sb = sa + WM * WK * 2;
    const int tid = threadIdx.x;
    for (int e = tid; e < WM * WK; e += 128) {
        const int m = e / WK, k = e % WK;
        *reinterpret_cast<__nv_bfloat16 *>(sa + (TA ? wg_offset(WK, k, m) : wg_offset(WM, m, k))) = A[e];
    }
    for (int e = tid; e < WK * SWN; e += 128) {
        const int k = e / SWN, n = e % SWN;
        *reinterpret_cast<__nv_bfloat16 *>(sb + (TB ? wg_offset(WK, k, n) : wg_offset(SWN, n, k))) = B[e];
    }
    fence_proxy_async_smem();
    __syncthreads();
    float d[WN / 2];
    wg_gemm<WN, TA, TB, __nv_bfloat16, WK / 16, true>(
        d, [&](int ks) { return TA ? wg_desc_mnmajor(sa, WK, ks * 16, 0) : wg_desc_kmajor(sa, WM, 0, ks * 16); },
        [&](int ks) { return TB ? wg_desc_mnmajor(sb, WK, ks * 16, BOFF) : wg_desc_kmajor(sb, SWN, BOFF, ks * 16); });
    wg_wait<0>();
    const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
#pragma unroll
    for (int i = 0; i < WN / 2; i++) {
        const int j = i >> 2, e = i & 3;
        D[(16 * warp + g + (e >> 1) * 8) * WN + 8 * j + 2 * t4 + (e & 1)] = d[i];
    }
}

/* A [64][128] bf16 tile, row-major in global memory, into shared memory twice: by two tensor-map
 * copies of 64 x 64 boxes with the 128-byte swizzle (one a panel), and by the threads at
 * wg_offset; both tiles are copied out for the host to compare byte for byte. */
__global__ void __launch_bounds__(128) tma_layout_kernel(const __grid_constant__ CUtensorMap map,
                                                         const __nv_bfloat16 *A, unsigned char *by_tma,
                                                         unsigned char *by_threads) {
    extern __shared__ unsigned char smem_raw[];
    __shared__ __align__(8) uint64_t full;
    const uint32_t raw = smem_u32(smem_raw), pad = (1024u - (raw & 1023u)) & 1023u;
    unsigned char *st = smem_raw + pad, *sw = st + WM * WK * 2;
    const int tid = threadIdx.x;
    if (tid == 0) {
        mbar_init(&full, 1);
        fence_mbar_init();
    }
    __syncthreads();
    if (tid == 0) {
        mbar_arrive_expect_tx(&full, WM * WK * 2);
        for (int panel = 0; panel < WK / WG_PANEL_COLS; panel++)
            tma_load_2d(st + panel * WM * WG_ROW_BYTES, &map, panel * WG_PANEL_COLS, 0, &full);
    }
    for (int e = tid; e < WM * WK; e += 128)
        *reinterpret_cast<__nv_bfloat16 *>(sw + wg_offset(WM, e / WK, e % WK)) = A[e];
    mbar_wait(&full, 0);
    __syncthreads();
    for (int e = tid; e < WM * WK * 2; e += 128) {
        by_tma[e] = st[e];
        by_threads[e] = sw[e];
    }
}

static int fail(const char *what, cudaError_t err) {
    fprintf(stderr, "wgmma_check: %s: %s\n", what, cudaGetErrorString(err));
    return 1;
}

/* b: [WK][WN_MAX] row-major on the host; the device B of width stored_cols is its first columns (dB
 * holds them packed [WK][stored_cols]: dB64 for up to 64, dB for 128); the product takes columns
 * [BOFF, BOFF + WN). */
template <int TA, int TB, int WN, int BOFF = 0>
static int check(const __nv_bfloat16 *dA, const __nv_bfloat16 *dB, float *dD, const float *a, const float *b) {
    const size_t smem = 1024 + (size_t)(WM * WK + WK * stored_cols<WN, BOFF>()) * 2;
    cudaError_t err = cudaFuncSetAttribute(wgmma_check_kernel<TA, TB, WN, BOFF>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (err != cudaSuccess)
        return fail("cudaFuncSetAttribute", err);
    if ((err = cudaMemset(dD, 0xff, sizeof(float) * WM * WN)) != cudaSuccess) /* NaN poison */
        return fail("cudaMemset", err);
    wgmma_check_kernel<TA, TB, WN, BOFF><<<1, 128, smem>>>(dA, dB, dD);
    if ((err = cudaGetLastError()) != cudaSuccess || (err = cudaDeviceSynchronize()) != cudaSuccess)
        return fail("the kernel", err);
    static float out[WM * WN_MAX];
    if ((err = cudaMemcpy(out, dD, sizeof(float) * WM * WN, cudaMemcpyDeviceToHost)) != cudaSuccess)
        return fail("cudaMemcpy", err);
    double worst = 0.0, scale = 0.0;
    int bad = 0;
    for (int m = 0; m < WM; m++)
        for (int n = 0; n < WN; n++) {
            double ref = 0.0;
            for (int k = 0; k < WK; k++)
                ref += (double)a[m * WK + k] * (double)b[k * WN_MAX + BOFF + n];
            const double diff = fabs((double)out[m * WN + n] - ref);
            if (!(diff <= worst)) /* NaN counts as the worst */
                worst = isnan(diff) ? INFINITY : diff;
            scale = fmax(scale, fabs(ref));
            bad += !(diff <= 1e-4 * (fabs(ref) + 1.0));
        }
    printf("m64n%dk16, A %s-major, B %s-major from column %d: max |D - ref| %.3e (largest |ref| %.3e), %d of %d "
           "elements off: %s\n",
           WN, TA ? "M" : "K", TB ? "N" : "K", BOFF, worst, scale, bad, WM * WN, bad ? "FAIL" : "ok");
    return bad != 0;
}

/* The SWIZZLE_128B tile check above; returns 1 on a failure. */
static int check_tma_layout(const __nv_bfloat16 *dA) {
    CUtensorMap map;
    if (!encode_tile_map(&map, dA, WM, WK, WG_PANEL_COLS, WM, CU_TENSOR_MAP_SWIZZLE_128B)) {
        printf("tma layout: no cuTensorMapEncodeTiled from the driver, or it refused the map: FAIL\n");
        return 1;
    }
    const size_t bytes = (size_t)WM * WK * 2, smem = 1024 + 2 * bytes;
    unsigned char *d_tma = NULL, *d_thr = NULL;
    cudaError_t err;
    if ((err = cudaMalloc(&d_tma, bytes)) != cudaSuccess || (err = cudaMalloc(&d_thr, bytes)) != cudaSuccess)
        return fail("cudaMalloc", err);
    if ((err = cudaFuncSetAttribute(tma_layout_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem)) !=
        cudaSuccess)
        return fail("cudaFuncSetAttribute", err);
    tma_layout_kernel<<<1, 128, smem>>>(map, dA, d_tma, d_thr);
    if ((err = cudaGetLastError()) != cudaSuccess || (err = cudaDeviceSynchronize()) != cudaSuccess)
        return fail("the tma kernel", err);
    static unsigned char h_tma[WM * WK * 2], h_thr[WM * WK * 2];
    if ((err = cudaMemcpy(h_tma, d_tma, bytes, cudaMemcpyDeviceToHost)) != cudaSuccess ||
        (err = cudaMemcpy(h_thr, d_thr, bytes, cudaMemcpyDeviceToHost)) != cudaSuccess)
        return fail("cudaMemcpy", err);
    cudaFree(d_tma);
    cudaFree(d_thr);
    size_t off = 0;
    while (off < bytes && h_tma[off] == h_thr[off])
        off++;
    if (off < bytes)
        printf("tma layout: the tensor-map tile and wg_offset differ first at byte %zu (row %zu of its panel): FAIL\n",
               off, (off % ((size_t)WM * WG_ROW_BYTES)) / WG_ROW_BYTES);
    else
        printf("tma layout: two SWIZZLE_128B tensor-map copies land where wg_offset puts every element: ok\n");
    return off < bytes;
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
    static float a[WM * WK], b[WK * WN_MAX];
    static __nv_bfloat16 ha[WM * WK], hb[WK * WN_MAX], hb64[WK * 64];
    srand(20261204);
    for (int i = 0; i < WM * WK; i++) {
        ha[i] = __float2bfloat16((float)rand() / RAND_MAX * 2.0f - 1.0f);
        a[i] = __bfloat162float(ha[i]);
    }
    for (int i = 0; i < WK * WN_MAX; i++) {
        hb[i] = __float2bfloat16((float)rand() / RAND_MAX * 2.0f - 1.0f);
        b[i] = __bfloat162float(hb[i]);
    }
    for (int k = 0; k < WK; k++) /* the first 64 columns, packed, for the N = 64 checks */
        for (int n = 0; n < 64; n++)
            hb64[k * 64 + n] = hb[k * WN_MAX + n];
    __nv_bfloat16 *dA = NULL, *dB = NULL, *dB64 = NULL;
    float *dD = NULL;
    cudaError_t err;
    if ((err = cudaMalloc(&dA, sizeof ha)) != cudaSuccess || (err = cudaMalloc(&dB, sizeof hb)) != cudaSuccess ||
        (err = cudaMalloc(&dB64, sizeof hb64)) != cudaSuccess ||
        (err = cudaMalloc(&dD, sizeof(float) * WM * WN_MAX)) != cudaSuccess)
        return fail("cudaMalloc", err);
    if ((err = cudaMemcpy(dA, ha, sizeof ha, cudaMemcpyHostToDevice)) != cudaSuccess ||
        (err = cudaMemcpy(dB, hb, sizeof hb, cudaMemcpyHostToDevice)) != cudaSuccess ||
        (err = cudaMemcpy(dB64, hb64, sizeof hb64, cudaMemcpyHostToDevice)) != cudaSuccess)
        return fail("cudaMemcpy", err);
    int failures = check<0, 0, 64>(dA, dB64, dD, a, b) + check<0, 1, 64>(dA, dB64, dD, a, b) +
                   check<1, 0, 64>(dA, dB64, dD, a, b) + check<1, 1, 64>(dA, dB64, dD, a, b) +
                   check<0, 0, 128>(dA, dB, dD, a, b) + check<0, 1, 128>(dA, dB, dD, a, b) +
                   check<1, 0, 128>(dA, dB, dD, a, b) + check<1, 1, 128>(dA, dB, dD, a, b);
    /* the 32-column halves of a 64-column B (the Hopper kernel at V = 64 and its scores) */
    failures += check<0, 1, 32, 0>(dA, dB64, dD, a, b) + check<0, 1, 32, 32>(dA, dB64, dD, a, b) +
                check<0, 0, 32, 0>(dA, dB64, dD, a, b) + check<0, 0, 32, 32>(dA, dB64, dD, a, b);
    failures += check_tma_layout(dA);
    cudaFree(dA);
    cudaFree(dB);
    cudaFree(dB64);
    cudaFree(dD);
    printf("wgmma_check: %d of 13 checks failed (8 operand layouts, 4 half-tile offsets, the tensor-map tile)\n",
           failures);
    return failures ? 1 : 0;
}
