/*
 * gemm_splitk.cu: the projection GEMM of a decode step's few-to-256 rows, C[rows, n] = A[rows, k]
 * B[n, k]^T + beta C with 16-bit A and B, fp32 accumulation and C fp32 or A's dtype
 * (kernels/gemm_splitk.h), split along k across the CTAs of a thread-block cluster.
 *
 * Status: correct (test_gemm_gpu) and slower than cuBLASLt at every row count (kernels/NOTES-ops.md,
 * thirty-eighth session): off unless GDP_GEMM_SPLITK asks for it. ncu (H100, the layer at B = 128):
 * out_proj's 16 clusters of 8 exceed the 15 that fit at once (a second wave), and both launches'
 * warps wait more on the partials' reduction and the cluster barriers than on the weight's bytes.
 *
 * Why it was built (kernels/dev/gemm_skinny.cu, thirty-eighth session, H100): cuBLASLt takes 6.0-7.1 us for
 * out_proj (2048 x 2048, 8.4 MB: 1.2-1.4 TB/s) and 14-16 us for in_proj (7728 x 2048, 31.7 MB:
 * 2.0-2.3 TB/s) at every row count from 8 to 256, and none of its heuristic's algorithms nor its
 * split-k forms (a second reduction launch) does better: with 128-column tiles out_proj is 16-32
 * CTAs on 132 SMs, each streaming its 2048-deep slice of the weight with a few stages in flight.
 * Here each 128 x 128 output tile is split over S = 2-8 CTAs of one cluster along k, so that
 * about one CTA an SM streams its part of the weight, 4 stages deep; the S partial tiles meet
 * in distributed shared memory and each CTA sums its share of the tile's rows over the S
 * partials in rank order (a fixed order: the same bits every call, no atomics, no workspace).
 *
 * Work split: grid (n tiles, m tiles, S), cluster (1, 1, S); a CTA of 8 warps computes the
 * 128 x 128 tile over k chunks [c0, c0 + chunks) of 64; warp w owns rows 32 (w % 4) .. + 32 and
 * columns 64 (w / 4) .. + 64 (2 x 8 m16n8k16 tiles, 64 accumulators a thread). A stage holds
 * the chunk's 128 rows of A and of B, each one copy-engine box (rows past rows or n land as
 * zeros) with the 128-byte swizzle, so that ldmatrix reads hit distinct banks; one thread issues a
 * stage's two copies on its mbarrier, 4 stages deep. (The first form staged them with 16-byte
 * cp.async, 8 a thread a stage, and measured within 1-5 us of this one: the address arithmetic
 * it spent was not what held either back.)
 */
#include <string.h>

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "chunk/mma.cuh"        /* Elem<T>, ldmatrix, mbarriers, tma_load_2d */
#include "chunk/tensor_map.h" /* encode_tile_map */
#include "device_info.h"
#include "dtype_access.cuh" /* aligned16 */
#include "gemm_splitk.h"
#include "src/cuda_check.h"
#include "src/internal.h"

namespace cg = cooperative_groups;

namespace {

constexpr int SK_TILE = 128;                    /* rows and columns of a CTA's tile */
constexpr int SK_KC = 64;                       /* k elements a stage: one 128-byte row of a box */
constexpr int SK_STAGES = 4;
constexpr int SK_THREADS = 256;
constexpr int SK_PART_LD = SK_TILE + 4;         /* a partial row (fp32), padded     */
constexpr int SK_BOX_BYTES = SK_TILE * SK_KC * 2;               /* one copy: 16 KB  */
constexpr size_t SK_STAGE_BYTES = 2 * (size_t)SK_BOX_BYTES;     /* A and B of one chunk */
constexpr size_t SK_SMEM = 1024 + SK_STAGES * SK_STAGE_BYTES + 64; /* 1024-byte alignment, stages, mbarriers */
static_assert((size_t)SK_TILE * SK_PART_LD * 4 <= SK_STAGES * SK_STAGE_BYTES, "the partial tile reuses the stages");

struct SplitkParams {
    CUtensorMap a_map, b_map; /* A [rows, k] and B [n, k] in boxes of 128 rows x 64 columns, 128-byte swizzle */
    void *C;
    int64_t ldc;
    int rows, n, k;
    int chunks; /* k chunks of SK_KC a CTA */
    float beta;
};

/* Element (r, c) of a box as the copy engine lands it with the 128-byte swizzle: row r's 16-byte
 * pieces permuted by r % 8 (so that the 8 rows an ldmatrix reads at one column hit 8 banks). */
template <typename T> __device__ __forceinline__ const T *sk_at(const T *box, int r, int c) {
    return box + r * SK_KC + ((((c >> 3) ^ r) & 7) << 3) + (c & 7);
}

template <typename T, bool C32>
__global__ void __launch_bounds__(SK_THREADS, 1) gemm_splitk_kernel(const __grid_constant__ SplitkParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ __align__(16) unsigned char sk_raw[];
    /* the swizzled boxes need 1024-byte alignment */
    unsigned char *sk_smem = sk_raw + ((1024 - (smem_u32(sk_raw) & 1023)) & 1023);
    uint64_t *full = reinterpret_cast<uint64_t *>(sk_smem + SK_STAGES * SK_STAGE_BYTES);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int wm = warp & 3, wn = warp >> 2;
    const int n0 = blockIdx.x * SK_TILE, m0 = blockIdx.y * SK_TILE;
    const int c0 = blockIdx.z * p.chunks;
    /* warps whose 32 rows lie past rows skip the products (their partials stay 0) */
    const bool rows_live = m0 + wm * 32 < p.rows;
    const auto stage_a = [&](int s) { return reinterpret_cast<T *>(sk_smem + s * SK_STAGE_BYTES); };
    /* chunk c into stage s: one thread, two copies (rows past rows or n land as zeros) */
    const auto issue = [&](int c, int s) {
        mbar_arrive_expect_tx(&full[s], (uint32_t)SK_STAGE_BYTES);
        tma_load_2d(stage_a(s), &p.a_map, (c0 + c) * SK_KC, m0, &full[s]);
        tma_load_2d(stage_a(s) + SK_TILE * SK_KC, &p.b_map, (c0 + c) * SK_KC, n0, &full[s]);
    };
    if (threadIdx.x == 0) {
        for (int s = 0; s < SK_STAGES; s++)
            mbar_init(&full[s], 1);
        fence_mbar_init();
        for (int s = 0; s < SK_STAGES - 1 && s < p.chunks; s++)
            issue(s, s);
    }
    __syncthreads(); /* the barriers initialized before anyone waits on them */

    float acc[2][8][4];
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                acc[mi][nt][e] = 0.0f;

    for (int c = 0; c < p.chunks; c++) {
        if (c > 0)
            __syncthreads(); /* every warp is done with chunk c - 1: its stage takes chunk c + STAGES - 1 */
        if (threadIdx.x == 0 && c + SK_STAGES - 1 < p.chunks)
            issue(c + SK_STAGES - 1, (c + SK_STAGES - 1) % SK_STAGES);
        mbar_wait(&full[c % SK_STAGES], (c / SK_STAGES) & 1);
        if (rows_live) {
            const T *sa = stage_a(c % SK_STAGES), *sb = sa + SK_TILE * SK_KC;
#pragma unroll
            for (int kk = 0; kk < SK_KC; kk += 16) {
                uint32_t af[2][4];
#pragma unroll
                for (int mi = 0; mi < 2; mi++)
                    ldsm_x4(af[mi], sk_at(sa, wm * 32 + mi * 16 + (lane & 15), kk + (lane >> 4) * 8));
#pragma unroll
                for (int pp = 0; pp < 4; pp++) {
                    uint32_t bf[4];
                    ldsm_x4(bf, sk_at(sb, wn * 64 + pp * 16 + (lane >> 4) * 8 + (lane & 7), kk + ((lane >> 3) & 1) * 8));
#pragma unroll
                    for (int mi = 0; mi < 2; mi++) {
                        Elem<T>::mma(acc[mi][2 * pp], af[mi], bf[0], bf[1]);
                        Elem<T>::mma(acc[mi][2 * pp + 1], af[mi], bf[2], bf[3]);
                    }
                }
            }
        }
    }
    __syncthreads(); /* every warp is done with the stages (every copy landed): the partial tile takes their place */

    float *part = reinterpret_cast<float *>(sk_smem);
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int nt = 0; nt < 8; nt++) {
            const int r = wm * 32 + mi * 16 + g, col = wn * 64 + nt * 8 + 2 * t;
            *reinterpret_cast<float2 *>(part + r * SK_PART_LD + col) = make_float2(acc[mi][nt][0], acc[mi][nt][1]);
            *reinterpret_cast<float2 *>(part + (r + 8) * SK_PART_LD + col) =
                make_float2(acc[mi][nt][2], acc[mi][nt][3]);
        }
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync(); /* every CTA's partial written and visible to the cluster */

    /* This CTA's share of the tile's rows, summed over the S partials in rank order. */
    const int S = (int)cluster.num_blocks(), rank = (int)cluster.block_rank();
    const int share = SK_TILE / S, r_lo = rank * share;
    for (int idx = threadIdx.x; idx < share * (SK_TILE / 4); idx += SK_THREADS) {
        const int r = r_lo + idx / (SK_TILE / 4), col = (idx % (SK_TILE / 4)) * 4;
        const int gr = m0 + r;
        if (gr >= p.rows)
            continue;
        float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (int q = 0; q < S; q++) {
            const float *remote = cluster.map_shared_rank(part, q);
            const float4 v = *reinterpret_cast<const float4 *>(remote + r * SK_PART_LD + col);
            sum.x += v.x, sum.y += v.y, sum.z += v.z, sum.w += v.w;
        }
        const float out[4] = {sum.x, sum.y, sum.z, sum.w};
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int gc = n0 + col + e;
            if (gc >= p.n)
                break;
            const int64_t at = (int64_t)gr * p.ldc + gc;
            float v = out[e];
            if (C32) {
                float *C = static_cast<float *>(p.C);
                if (p.beta != 0.0f)
                    v = fmaf(p.beta, C[at], v);
                C[at] = v;
            } else {
                T *C = static_cast<T *>(p.C);
                if (p.beta != 0.0f)
                    v = fmaf(p.beta, Elem<T>::to_f(C[at]), v);
                C[at] = Elem<T>::from_f(v);
            }
        }
    }
    cluster.sync(); /* no CTA leaves while another still reads its partial */
#endif
}

/* The copy engine's map of a row-major [rows, cols] 16-bit matrix with rows ld elements apart, in
 * boxes of SK_TILE rows x SK_KC columns, 128-byte swizzle (sk_at); rows past the end read as zeros. */
bool sk_encode(CUtensorMap *map, const void *base, int64_t rows, int64_t cols, int64_t ld) {
    return encode_tile_map(map, base, rows, cols, SK_KC, SK_TILE, CU_TENSOR_MAP_SWIZZLE_128B, ld);
}

/* The split: S = 8, 4 or 2 CTAs a tile (k chunks divisible by S), the most whose grid still fits
 * one CTA an SM; 0 when no split fits (then cuBLASLt runs). */
int splitk_ways(int64_t rows, int64_t n, int64_t k, int sms) {
    const int64_t tiles = ((n + SK_TILE - 1) / SK_TILE) * ((rows + SK_TILE - 1) / SK_TILE);
    const int64_t chunks = k / SK_KC;
    for (int s = 8; s >= 2; s /= 2)
        if (tiles * s <= sms && chunks % s == 0)
            return s;
    return 0;
}

template <typename T, bool C32> cudaError_t launch_splitk(const SplitkParams &p, int ways, cudaStream_t stream) {
    static bool configured = false; /* the attribute is per function, the same on every device */
    if (!configured) {
        const cudaError_t err =
            cudaFuncSetAttribute(gemm_splitk_kernel<T, C32>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)SK_SMEM);
        if (err != cudaSuccess)
            return err;
        configured = true;
    }
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)((p.n + SK_TILE - 1) / SK_TILE), (unsigned)((p.rows + SK_TILE - 1) / SK_TILE),
                       (unsigned)ways);
    cfg.blockDim = dim3(SK_THREADS);
    cfg.dynamicSmemBytes = SK_SMEM;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = 1;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = (unsigned)ways;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, gemm_splitk_kernel<T, C32>, p);
}

} // namespace

extern "C" int gdp_cuda_gemm_splitk_ways(struct gdp_ctx *ctx, int64_t rows, int64_t n, int64_t k, const void *A,
                                         int64_t lda, const void *B, gdp_dtype_t ab_dtype, const void *C,
                                         int64_t ldc, gdp_dtype_t c_dtype) {
    if ((ab_dtype != GDP_DTYPE_BF16 && ab_dtype != GDP_DTYPE_FP16) ||
        (c_dtype != GDP_DTYPE_FP32 && c_dtype != ab_dtype) || rows < 1 || rows > GDP_GEMM_SPLITK_MAX_ROWS ||
        n < 1 || n > INT32_MAX || k % SK_KC != 0 || k > INT32_MAX || lda % 8 != 0 || !aligned16(A) ||
        !aligned16(B) || C == nullptr || ldc < n)
        return 0;
    int cc = 0, sms = 0;
    if (gdp_device_cc(ctx->device, &cc) != cudaSuccess || gdp_device_sm_count(ctx->device, &sms) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return cc >= 90 ? splitk_ways(rows, n, k, sms) : 0;
}

extern "C" gdp_status_t gdp_cuda_gemm_splitk_nt(struct gdp_ctx *ctx, int ways, int64_t rows, int64_t n, int64_t k,
                                               const void *A, int64_t lda, const void *B, gdp_dtype_t ab_dtype,
                                               float beta, void *C, int64_t ldc, gdp_dtype_t c_dtype) {
    static const char *op = "gdp_gemm_nt (split-k)";
    if (ways < 2 || ways > 8 || (k / SK_KC) % ways != 0)
        GDP_FAIL(GDP_STATUS_INTERNAL_ERROR, "%s: %d ways for k %lld (gdp_cuda_gemm_splitk_ways decides them)", op,
                 ways, (long long)k);
    SplitkParams p;
    memset(&p, 0, sizeof p);
    if (!sk_encode(&p.a_map, A, rows, k, lda) || !sk_encode(&p.b_map, B, n, k, k))
        GDP_FAIL(GDP_STATUS_CUDA_ERROR, "%s: the driver refused the copy engine's map of A (rows %lld, k %lld, lda "
                 "%lld) or B (n %lld); set GDP_GEMM_SPLITK=off", op, (long long)rows, (long long)k, (long long)lda,
                 (long long)n);
    p.C = C;
    p.ldc = ldc;
    p.rows = (int)rows, p.n = (int)n, p.k = (int)k;
    p.chunks = (int)(k / SK_KC / ways);
    p.beta = beta;
    cudaStream_t stream = static_cast<cudaStream_t>(ctx->stream);
    const bool c32 = c_dtype == GDP_DTYPE_FP32;
    cudaError_t err;
    if (ab_dtype == GDP_DTYPE_BF16)
        err = c32 ? launch_splitk<__nv_bfloat16, true>(p, ways, stream) : launch_splitk<__nv_bfloat16, false>(p, ways, stream);
    else
        err = c32 ? launch_splitk<__half, true>(p, ways, stream) : launch_splitk<__half, false>(p, ways, stream);
    GDP_CUDA_LAUNCH_CHECK(op, err, "rows %lld, n %lld, k %lld, %d ways", (long long)rows, (long long)n, (long long)k,
                          ways);
    return GDP_STATUS_SUCCESS;
}
