/*
 * chunk.cu: the CUDA chunked prefill op chunk_gated_delta_product_varlen (gdp-math.md 3, 4).
 *
 * Stages, each one kernel, all on tensor cores (mma.sync m16n8k16, 16-bit inputs, fp32
 * accumulation) except the small triangular solve:
 *   cumsum (cumsum.cu)  Gq, Gk: chunk-local base-2 cumulative decays of both streams
 *   chunk_wy_kernel     per expanded chunk: keys (L2-normalized if asked, rounded to the
 *                       input dtype), A = beta K K^T with decay, Ai = (I + A)^-1 in fp32,
 *                       w = Ai (beta 2^Gk K), u = Ai (beta V)
 *   chunk_state_kernel  per (sequence, head, 64 value columns): the sequential sweep over the
 *                       sequence's expanded chunks, state in registers; v_new = u - w S,
 *                       S = 2^gl S + K^T (2^(gl - Gk) v_new); stores the state entering each
 *                       token chunk, chunk states, the final state or the cache slot
 *   chunk_out_kernel    per (token chunk, head, 64 value columns): o = scale (2^Gq (Q h) +
 *                       sum_m ((Q K_m^T) . D) V_new,m) with the token-causal mask D
 *   zero_tail_kernel    output rows past cu_seqlens[N] = 0
 * Intermediates live in the ctx workspace (src/workspace.h), padded to the tile sizes. With
 * descriptors given nothing is allocated and nothing waits for the host, and the grids
 * depend only on (num_chunks, num_chunks_dp, T, N, H), so the call can be graph-captured.
 * Rounding points follow upstream (gdp-math.md 3.3-3.6): keys, Ai, w, u, v_new, the decayed
 * v_new, the states fed to w S and to the output stage, and the masked scores are 16-bit.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gdp_kernels.h"
#include "src/internal.h"
#include "src/workspace.h"

/* Developer hook: kernels/dev/chunk_stages.cu defines it to record an event after each stage. */
#ifndef GDP_CHUNK_STAGE_MARK
#define GDP_CHUNK_STAGE_MARK(stage, stream) ((void)0)
#endif

namespace {

constexpr int CHUNK = GDP_CHUNK_SIZE; /* 64 rows per chunk on both streams */
constexpr int PAD = 8;                /* 16-bit elements of row padding: ldmatrix rows hit distinct banks */
constexpr int VB = 64;                /* value columns per block in the state and output stages */

/* Everything the stage kernels read, passed by value. */
struct ChunkParams {
    const void *q, *k, *v, *beta, *h0;
    const int32_t *cu, *cidx, *cidx_dp, *coff, *slots;
    const float *gq, *gk;
    void *kn, *w, *u, *hs; /* workspace: keys, w, u (then v_new), states entering chunks */
    void *o, *state, *final_state, *chunk_states;
    int64_t T, n_slots, state_stride_slot, state_stride_head, cs_rows, h_rows;
    int N, H, K, V, M, KP, VP;
    int beta_dtype, h0_dtype, state_dtype, final_dtype, cs_dtype;
    float scale;
    int l2norm;
    int q_vec, k_vec, v_vec; /* 16-byte loads allowed for the input tiles */
};

// CUDA kernels

/* ---- 16-bit element traits: conversions and the matching mma instruction ---- */
template <typename T> struct Elem;

template <> struct Elem<__nv_bfloat16> {
    static __device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
    static __device__ __forceinline__ __nv_bfloat16 from_f(float x) { return __float2bfloat16_rn(x); }
    static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
        __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
        return *reinterpret_cast<uint32_t *>(&v);
    }
    static __device__ __forceinline__ void mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                     "{%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

template <> struct Elem<__half> {
    static __device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
    static __device__ __forceinline__ __half from_f(float x) { return __float2half_rn(x); }
    static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
        __half2 v = __floats2half2_rn(lo, hi);
        return *reinterpret_cast<uint32_t *>(&v);
    }
    static __device__ __forceinline__ void mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                     "{%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

/* ---- shared-memory matrix loads and async copies ---- */
__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* Four 8x8 16-bit matrices; lane l gives the row address of matrix l/8, row l%8. */
__device__ __forceinline__ void ldsm_x4(uint32_t r[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p))
                 : "memory");
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t r[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p))
                 : "memory");
}
/* 16-byte global -> shared copy; valid == false writes zeros and reads nothing. */
__device__ __forceinline__ void cp_async16(void *dst, const void *src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
                 "r"(valid ? 16 : 0)
                 : "memory");
}
__device__ __forceinline__ void cp_async4(void *dst, const void *src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, 4;\n" ::"r"(smem_u32(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

/* ---- warp-level fragments (m16n8k16; g = lane / 4 is the row, t = lane % 4 the column pair) ----
 * A fragment of rows [r0, r0+16) x cols [k0, k0+16) of a row-major smem matrix. */
template <typename T>
__device__ __forceinline__ void frag_a(uint32_t a[4], const T *s, int ld, int r0, int k0, int lane) {
    ldsm_x4(a, s + (r0 + (lane & 15)) * ld + k0 + (lane >> 4) * 8);
}
/* A fragment of A = S^T for S stored row-major [k][m]: rows m in [m0, m0+16), cols k in [k0, k0+16). */
template <typename T>
__device__ __forceinline__ void frag_a_trans(uint32_t a[4], const T *s, int ld, int m0, int k0, int lane) {
    ldsm_x4_t(a, s + (k0 + (lane >> 4) * 8 + (lane & 7)) * ld + m0 + ((lane >> 3) & 1) * 8);
}
/* B fragments of two n8 tiles [n0, n0+16) x k [k0, k0+16) for B stored row-major [k][n]:
 * b[0], b[1] for tile n0, b[2], b[3] for tile n0 + 8. */
template <typename T>
__device__ __forceinline__ void frag_b_kn(uint32_t b[4], const T *s, int ld, int k0, int n0, int lane) {
    ldsm_x4_t(b, s + (k0 + ((lane >> 3) & 1) * 8 + (lane & 7)) * ld + n0 + (lane >> 4) * 8);
}
/* The same for B stored row-major [n][k] (B = S^T, as in Q K^T). */
template <typename T>
__device__ __forceinline__ void frag_b_nk(uint32_t b[4], const T *s, int ld, int k0, int n0, int lane) {
    ldsm_x4(b, s + (n0 + (lane >> 4) * 8 + (lane & 7)) * ld + k0 + ((lane >> 3) & 1) * 8);
}

/* ---- element access in any storage dtype ---- */
__device__ __forceinline__ float load_any(const void *p, int dtype, int64_t i) {
    switch (dtype) {
    case GDP_DTYPE_FP32: return static_cast<const float *>(p)[i];
    case GDP_DTYPE_BF16: return __bfloat162float(static_cast<const __nv_bfloat16 *>(p)[i]);
    case GDP_DTYPE_FP16: return __half2float(static_cast<const __half *>(p)[i]);
    default: return 0.0f;
    }
}
__device__ __forceinline__ void store_any(void *p, int dtype, int64_t i, float x) {
    switch (dtype) {
    case GDP_DTYPE_FP32: static_cast<float *>(p)[i] = x; break;
    case GDP_DTYPE_BF16: static_cast<__nv_bfloat16 *>(p)[i] = __float2bfloat16_rn(x); break;
    case GDP_DTYPE_FP16: static_cast<__half *>(p)[i] = __float2half_rn(x); break;
    default: break;
    }
}

template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* Starts copying rows [0, 64) x cols [0, COLS) of a row-major global matrix (row stride ld_g)
 * into smem with 16-byte cp.async; rows >= nrows and cols >= ncols (a multiple of 8) become 0. */
template <typename T, int NTH>
__device__ __forceinline__ void tile_async(T *dst, int ld_s, const T *__restrict__ src, int64_t ld_g, int nrows,
                                           int cols, int ncols, int tid) {
    const int vpr = cols >> 3;
    for (int e = tid; e < CHUNK * vpr; e += NTH) {
        const int r = e / vpr, c = (e - r * vpr) * 8;
        const bool ok = r < nrows && c < ncols;
        cp_async16(dst + r * ld_s + c, ok ? src + r * ld_g + c : src, ok);
    }
}

/* The same with plain element loads, for any ncols and alignment. */
template <typename T, int NTH>
__device__ __forceinline__ void tile_scalar(T *dst, int ld_s, const T *__restrict__ src, int64_t ld_g, int nrows,
                                            int cols, int ncols, int tid) {
    for (int e = tid; e < CHUNK * cols; e += NTH) {
        const int r = e / cols, c = e - r * cols;
        dst[r * ld_s + c] = (r < nrows && c < ncols) ? src[r * ld_g + c] : Elem<T>::from_f(0.0f);
    }
}

/* In-place L2 norm of rows [0, nrows) of a 64 x KP smem tile: x / sqrt(sum x^2 + 1e-6) in fp32,
 * rounded to T. 8 lanes per row (4 rows per warp at a time), 16-byte vectors; each row's partial
 * sums meet in a fixed shuffle tree, so the result is deterministic. */
template <typename T, int KP, int NW>
__device__ __forceinline__ void l2norm_rows(T *s, int ld, int nrows, int warp, int lane) {
    constexpr int VPL = KP / 64; /* 16-byte vectors per lane */
    for (int r0 = warp * 4; r0 < nrows; r0 += NW * 4) {
        const int r = r0 + (lane >> 3), l8 = lane & 7;
        uint4 vals[VPL];
        float ss = 0.0f;
#pragma unroll
        for (int j = 0; j < VPL; j++) {
            vals[j] = *reinterpret_cast<const uint4 *>(s + r * ld + (j * 8 + l8) * 8);
            const T *x = reinterpret_cast<const T *>(&vals[j]);
#pragma unroll
            for (int e = 0; e < 8; e++) {
                const float f = Elem<T>::to_f(x[e]);
                ss += f * f;
            }
        }
        ss += __shfl_xor_sync(0xffffffffu, ss, 4);
        ss += __shfl_xor_sync(0xffffffffu, ss, 2);
        ss += __shfl_xor_sync(0xffffffffu, ss, 1);
        if (r < nrows) {
            const float inv = 1.0f / sqrtf(ss + (float)GDP_L2NORM_EPS);
#pragma unroll
            for (int j = 0; j < VPL; j++) {
                T *x = reinterpret_cast<T *>(&vals[j]);
#pragma unroll
                for (int e = 0; e < 8; e++)
                    x[e] = Elem<T>::from_f(Elem<T>::to_f(x[e]) * inv);
                *reinterpret_cast<uint4 *>(s + r * ld + (j * 8 + l8) * 8) = vals[j];
            }
        }
    }
}

/* ================= stage 1: WY factors per expanded chunk ================= */
template <typename T, int KP> struct WySmem {
    T k[CHUNK][KP + PAD];      /* keys, then beta 2^Gk K                                    */
    float a[CHUNK][CHUNK + 4]; /* A; after the solve the same bytes hold Ai in T           */
    float x[CHUNK][CHUNK + 4]; /* (I + A)^-1 in fp32                                       */
    float tmp[16][3 * 16 + 4]; /* one block row of sum_q A_rq X_qc, all its column blocks */
    float beta[CHUNK];
    float fk[CHUNK]; /* beta 2^Gk: the row factor of w's right-hand side */
    float gk[CHUNK];
}; /* dynamic smem continues with V [CHUNK][VP + PAD] in T, later scaled by beta */
static_assert(sizeof(WySmem<__nv_bfloat16, 64>) % 16 == 0 && sizeof(WySmem<__half, 128>) % 16 == 0 &&
                  sizeof(WySmem<__nv_bfloat16, 256>) % 16 == 0,
              "the V tile after WySmem needs 16-byte alignment");
static_assert(sizeof(float) * CHUNK * (CHUNK + 4) >= sizeof(__nv_bfloat16) * CHUNK * (CHUNK + PAD),
              "Ai in T must fit in A's storage");

/* Work split: one 128-thread block per (expanded chunk descriptor, head); warp w owns rows
 * [16w, 16w+16) of A, w and u; the 64x64 triangular inverse runs on CUDA cores in fp32.
 * K and V arrive together (cp.async) at the start, so no load waits after the solve. */
template <typename T, int KP>
__global__ void __launch_bounds__(128) chunk_wy_kernel(const ChunkParams p) {
    constexpr int NTH = 128;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    WySmem<T, KP> &s = *reinterpret_cast<WySmem<T, KP> *>(smem_raw);
    T *sv = reinterpret_cast<T *>(smem_raw + sizeof(WySmem<T, KP>));
    T(*ai)[CHUNK + PAD] = reinterpret_cast<T(*)[CHUNK + PAD]>(&s.a[0][0]);
    const int ldv = p.VP + PAD;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t4 = lane & 3;
    const int hd = blockIdx.y, H = p.H;

    const int i = p.cidx_dp[2 * blockIdx.x], j = p.cidx_dp[2 * blockIdx.x + 1];
    if (i < 0 || i >= p.N || j < 0)
        return;
    const int64_t bos = p.cu[i];
    const int64_t len_dp = ((int64_t)p.cu[i + 1] - bos) * p.M;
    const int64_t start = (int64_t)j * CHUNK;
    if (start >= len_dp)
        return; /* padding descriptor: inert */
    const int n = (int)min((int64_t)CHUNK, len_dp - start);
    const int64_t row0 = bos * p.M + start; /* global expanded row of local row 0 */

    /* keys and values (both at once), beta, Gk */
    const T *ksrc = static_cast<const T *>(p.k) + (row0 * H + hd) * p.K;
    const T *vsrc = static_cast<const T *>(p.v) + (row0 * H + hd) * p.V;
    if (p.k_vec)
        tile_async<T, NTH>(&s.k[0][0], KP + PAD, ksrc, (int64_t)H * p.K, n, KP, p.K, tid);
    else
        tile_scalar<T, NTH>(&s.k[0][0], KP + PAD, ksrc, (int64_t)H * p.K, n, KP, p.K, tid);
    if (p.v_vec)
        tile_async<T, NTH>(sv, ldv, vsrc, (int64_t)H * p.V, n, p.VP, p.V, tid);
    else
        tile_scalar<T, NTH>(sv, ldv, vsrc, (int64_t)H * p.V, n, p.VP, p.V, tid);
    cp_async_commit();
    if (tid < CHUNK) {
        float b = 0.0f, gk = 0.0f;
        if (tid < n) {
            b = load_any(p.beta, p.beta_dtype, (row0 + tid) * H + hd);
            gk = p.gk[(row0 + tid) * H + hd];
        }
        s.beta[tid] = b;
        s.gk[tid] = gk;
        s.fk[tid] = b * exp2f(gk);
    }
    cp_async_wait<0>();
    __syncthreads();
    if (p.l2norm) {
        l2norm_rows<T, KP, NTH / 32>(&s.k[0][0], KP + PAD, n, warp, lane);
        __syncthreads();
    }
    /* The keys the later stages use (normalized and rounded like upstream's separate pass). */
    {
        T *kn = static_cast<T *>(p.kn) + (row0 * H + hd) * KP;
        constexpr int VPR = KP / 8;
        for (int e = tid; e < n * VPR; e += NTH) {
            const int r = e / VPR, c = (e % VPR) * 8;
            *reinterpret_cast<uint4 *>(kn + (int64_t)r * H * KP + c) = *reinterpret_cast<const uint4 *>(&s.k[r][c]);
        }
    }

    /* A[r][s] = beta_r 2^(Gk_r - Gk_s) <k_r, k_s> for s < r < n, else 0. */
    {
        float acc[8][4];
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                acc[nt][e] = 0.0f;
        const int r0 = warp * 16;
#pragma unroll
        for (int kk = 0; kk < KP; kk += 16) {
            uint32_t a[4];
            frag_a(a, &s.k[0][0], KP + PAD, r0, kk, lane);
#pragma unroll
            for (int pp = 0; pp < 4; pp++) {
                if (pp <= warp) { /* columns past the diagonal block are masked anyway */
                    uint32_t b[4];
                    frag_b_nk(b, &s.k[0][0], KP + PAD, kk, pp * 16, lane);
                    Elem<T>::mma(acc[2 * pp], a, b[0], b[1]);
                    Elem<T>::mma(acc[2 * pp + 1], a, b[2], b[3]);
                }
            }
        }
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = r0 + g + (e >> 1) * 8, c = nt * 8 + 2 * t4 + (e & 1);
                float val = 0.0f;
                if (c < r && r < n) /* exponent <= 0 here: no overflow */
                    val = acc[nt][e] * exp2f(s.gk[r] - s.gk[c]) * s.beta[r];
                s.a[r][c] = val;
            }
        /* the inverse's blocks above the diagonal are zero: (0,1) (0,2) (0,3) (1,2) (1,3) (2,3) */
        for (int e = tid; e < 6 * 256; e += NTH) {
            const int blk = e >> 8, rb = (blk >= 3) + (blk >= 5), cb = blk + 1 - (blk >= 3) * 2 - (blk >= 5);
            s.x[rb * 16 + ((e >> 4) & 15)][cb * 16 + (e & 15)] = 0.0f;
        }
    }
    __syncthreads();

    /* (I + A)^-1, 16x16 blocks: diagonal blocks by forward substitution, one thread per column. */
    if (tid < 64) {
        const int b = tid >> 4, c = tid & 15, base = b * 16;
        float x[16];
#pragma unroll
        for (int r = 0; r < 16; r++) {
            float v = (r == c) ? 1.0f : 0.0f;
#pragma unroll
            for (int q = 0; q < 16; q++)
                if (q < r)
                    v -= s.a[base + r][base + q] * x[q];
            x[r] = v;
        }
#pragma unroll
        for (int r = 0; r < 16; r++)
            s.x[base + r][base + c] = x[r];
    }
    __syncthreads();
    /* Off-diagonal blocks, block row by block row: X_rc = -D_r sum_{c <= q < r} A_rq X_qc. Each
     * thread owns a 2-row x 4-column micro-tile of the block row (rows 2 rp, 2 rp + 1; columns
     * 4 cq .. 4 cq + 3), so one float4 of X serves 8 multiply-adds; sums run in index order. */
#pragma unroll
    for (int rb = 1; rb < 4; rb++) {
        const int rp = tid & 7, cq = tid >> 3, cb = cq >> 2, col = cq * 4; /* col = 16 cb + 4 (cq % 4) */
        const bool active = tid < 32 * rb;
        if (active) {
            float acc[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
            for (int jb = cb; jb < rb; jb++) {
#pragma unroll
                for (int q = 0; q < 16; q++) {
                    const float4 xv = *reinterpret_cast<const float4 *>(&s.x[jb * 16 + q][col]);
                    const float a0 = s.a[rb * 16 + 2 * rp][jb * 16 + q], a1 = s.a[rb * 16 + 2 * rp + 1][jb * 16 + q];
                    acc[0][0] += a0 * xv.x; acc[0][1] += a0 * xv.y; acc[0][2] += a0 * xv.z; acc[0][3] += a0 * xv.w;
                    acc[1][0] += a1 * xv.x; acc[1][1] += a1 * xv.y; acc[1][2] += a1 * xv.z; acc[1][3] += a1 * xv.w;
                }
            }
            *reinterpret_cast<float4 *>(&s.tmp[2 * rp][col]) = make_float4(acc[0][0], acc[0][1], acc[0][2], acc[0][3]);
            *reinterpret_cast<float4 *>(&s.tmp[2 * rp + 1][col]) = make_float4(acc[1][0], acc[1][1], acc[1][2], acc[1][3]);
        }
        __syncthreads();
        if (active) {
            float acc[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
            for (int q = 0; q < 16; q++) {
                const float4 tv = *reinterpret_cast<const float4 *>(&s.tmp[q][col]);
                const float d0 = s.x[rb * 16 + 2 * rp][rb * 16 + q], d1 = s.x[rb * 16 + 2 * rp + 1][rb * 16 + q];
                acc[0][0] += d0 * tv.x; acc[0][1] += d0 * tv.y; acc[0][2] += d0 * tv.z; acc[0][3] += d0 * tv.w;
                acc[1][0] += d1 * tv.x; acc[1][1] += d1 * tv.y; acc[1][2] += d1 * tv.z; acc[1][3] += d1 * tv.w;
            }
            *reinterpret_cast<float4 *>(&s.x[rb * 16 + 2 * rp][col]) =
                make_float4(-acc[0][0], -acc[0][1], -acc[0][2], -acc[0][3]);
            *reinterpret_cast<float4 *>(&s.x[rb * 16 + 2 * rp + 1][col]) =
                make_float4(-acc[1][0], -acc[1][1], -acc[1][2], -acc[1][3]);
        }
        __syncthreads();
    }
    /* Ai rounded to T (over A's dead storage); K becomes beta 2^Gk K and V beta V (rounded to T). */
    for (int e = tid; e < CHUNK * CHUNK / 4; e += NTH) {
        const int r = e >> 4, c = (e & 15) * 4;
        const float4 xv = *reinterpret_cast<const float4 *>(&s.x[r][c]);
        *reinterpret_cast<uint2 *>(&ai[r][c]) = make_uint2(Elem<T>::pack(xv.x, xv.y), Elem<T>::pack(xv.z, xv.w));
    }
    {
        constexpr int VPR = KP / 8;
        for (int e = tid; e < CHUNK * VPR; e += NTH) {
            const int r = e / VPR, c = (e % VPR) * 8;
            uint4 val = *reinterpret_cast<const uint4 *>(&s.k[r][c]);
            T *x = reinterpret_cast<T *>(&val);
            const float f = s.fk[r];
#pragma unroll
            for (int q = 0; q < 8; q++)
                x[q] = Elem<T>::from_f(f * Elem<T>::to_f(x[q]));
            *reinterpret_cast<uint4 *>(&s.k[r][c]) = val;
        }
        const int vpr = p.VP >> 3;
        for (int e = tid; e < CHUNK * vpr; e += NTH) {
            const int r = e / vpr, c = (e - r * vpr) * 8;
            uint4 val = *reinterpret_cast<const uint4 *>(sv + r * ldv + c);
            T *x = reinterpret_cast<T *>(&val);
            const float f = s.beta[r];
#pragma unroll
            for (int q = 0; q < 8; q++)
                x[q] = Elem<T>::from_f(f * Elem<T>::to_f(x[q]));
            *reinterpret_cast<uint4 *>(sv + r * ldv + c) = val;
        }
    }
    __syncthreads();

    /* w = Ai (beta 2^Gk K), u = Ai (beta V), 64 columns at a time; Ai is lower triangular, so
     * only k-steps up to the warp's rows. */
    const int r0 = warp * 16;
    const int nblk_w = KP / 64, nblk = nblk_w + p.VP / 64;
    for (int cb = 0; cb < nblk; cb++) {
        const bool is_w = cb < nblk_w;
        const T *rhs = is_w ? &s.k[0][0] : sv;
        const int ld = is_w ? KP + PAD : ldv;
        const int col0 = is_w ? cb * 64 : (cb - nblk_w) * 64;
        float acc[8][4];
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                acc[nt][e] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < 4; ks++) {
            if (ks <= warp) {
                uint32_t a[4];
                frag_a(a, &ai[0][0], CHUNK + PAD, r0, ks * 16, lane);
#pragma unroll
                for (int pp = 0; pp < 4; pp++) {
                    uint32_t b[4];
                    frag_b_kn(b, rhs, ld, ks * 16, col0 + pp * 16, lane);
                    Elem<T>::mma(acc[2 * pp], a, b[0], b[1]);
                    Elem<T>::mma(acc[2 * pp + 1], a, b[2], b[3]);
                }
            }
        }
        const int64_t ldg = is_w ? (int64_t)H * KP : (int64_t)H * p.VP;
        T *dst = is_w ? static_cast<T *>(p.w) + (row0 * H + hd) * KP + col0
                      : static_cast<T *>(p.u) + (row0 * H + hd) * p.VP + col0;
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                const int r = r0 + g + hh * 8, c = nt * 8 + 2 * t4;
                if (r < n)
                    *reinterpret_cast<uint32_t *>(dst + (int64_t)r * ldg + c) =
                        Elem<T>::pack(acc[nt][2 * hh], acc[nt][2 * hh + 1]);
            }
    }
}

/* ================= stage 2: sequential state sweep ================= */
template <typename T, int KP, int STAGES> struct StateSmem {
    T w[STAGES][CHUNK][KP + PAD];
    T k[STAGES][CHUNK][KP + PAD];
    T u[STAGES][CHUNK][VB + PAD]; /* u of the chunk, overwritten by the decayed v_new */
    T s[KP][VB + PAD];            /* 16-bit copy of the running state                */
    float g[STAGES][CHUNK];
};

/* Work split: one block of KP / 16 warps per (sequence, head, 64 value columns), looping over the
 * sequence's expanded chunks in order with STAGES - 1 chunks of w, K, u, Gk in flight; warp w
 * keeps state rows [16w, 16w+16) in fp32 registers and computes a 16-row x (64 / CG)-column
 * piece of the chunk's v_new (4 row tiles x CG column groups cover the 64 x 64 tile). */
template <typename T, int KP, int STAGES>
__global__ void __launch_bounds__(KP * 2) chunk_state_kernel(const ChunkParams p) {
    constexpr int NW = KP / 16, NTH = NW * 32;
    constexpr int CG = NW / 4;      /* v_new column groups: 1 (KP 64), 2 (128), 4 (256) */
    constexpr int VNT = 8 / CG;     /* n8 tiles of v_new per warp                      */
    constexpr int VPR = KP / 8;     /* 16-byte vectors per row of w and K              */
    constexpr int NLK = CHUNK * VPR / NTH;       /* w / K vectors per thread and chunk */
    constexpr int NLU = CHUNK * (VB / 8) / NTH;  /* u vectors per thread and chunk     */
    static_assert(NLK * NTH == CHUNK * VPR && NLU * NTH == CHUNK * (VB / 8), "load split");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    StateSmem<T, KP, STAGES> &s = *reinterpret_cast<StateSmem<T, KP, STAGES> *>(smem_raw);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t4 = lane & 3;
    const int vb = blockIdx.x, hd = blockIdx.y, i = blockIdx.z, H = p.H;
    const int64_t bos = p.cu[i];
    const int64_t len_dp = ((int64_t)p.cu[i + 1] - bos) * p.M;
    const int nt_dp = (int)((len_dp + CHUNK - 1) / CHUNK);
    const int64_t coff = p.coff[i];
    const int vr0 = (warp & 3) * 16;          /* v_new tile rows of this warp    */
    const int vc0 = (warp >> 2) * (64 / CG);  /* v_new tile columns of this warp */
    const int sr0 = warp * 16;                /* state rows of this warp         */

    /* state in registers: S[nt] covers rows sr0 + {g, g+8}, cols 8 nt + 2 t4 + {0, 1} */
    float S[8][4];
#pragma unroll
    for (int nt = 0; nt < 8; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int r = sr0 + g + (e >> 1) * 8, c = vb * VB + nt * 8 + 2 * t4 + (e & 1);
            float x = 0.0f;
            if (p.h0 != nullptr && r < p.K && c < p.V)
                x = load_any(p.h0, p.h0_dtype, (((int64_t)i * H + hd) * p.K + r) * p.V + c);
            S[nt][e] = x;
        }

    /* this thread's copies, the same every chunk: row, smem offset and global offset from the
     * chunk's first row (the offsets fit int32: 64 rows x H x 256 < 2^31 for H < 2^17) */
    int lk_row[NLK], lk_smem[NLK], lk_glob[NLK], lu_row[NLU], lu_smem[NLU], lu_glob[NLU];
#pragma unroll
    for (int q = 0; q < NLK; q++) {
        const int e = tid + q * NTH, r = e / VPR, c = (e % VPR) * 8;
        lk_row[q] = r;
        lk_smem[q] = r * (KP + PAD) + c;
        lk_glob[q] = (r * H + hd) * KP + c;
    }
#pragma unroll
    for (int q = 0; q < NLU; q++) {
        const int e = tid + q * NTH, r = e / (VB / 8), c = (e % (VB / 8)) * 8;
        lu_row[q] = r;
        lu_smem[q] = r * (VB + PAD) + c;
        lu_glob[q] = (r * H + hd) * p.VP + vb * VB + c;
    }

    /* Starts the copies of chunk ct into stage b and commits them as one group. */
    auto issue = [&](int ct, int b) {
        const int64_t rowc = bos * p.M + (int64_t)ct * CHUNK;
        const int nc = (int)min((int64_t)CHUNK, len_dp - (int64_t)ct * CHUNK);
        const T *wsrc = static_cast<const T *>(p.w) + rowc * H * KP;
        const T *ksrc = static_cast<const T *>(p.kn) + rowc * H * KP;
        const T *usrc = static_cast<const T *>(p.u) + rowc * H * p.VP;
#pragma unroll
        for (int q = 0; q < NLK; q++) {
            const bool ok = lk_row[q] < nc;
            cp_async16(&s.w[b][0][0] + lk_smem[q], wsrc + (ok ? lk_glob[q] : 0), ok);
            cp_async16(&s.k[b][0][0] + lk_smem[q], ksrc + (ok ? lk_glob[q] : 0), ok);
        }
#pragma unroll
        for (int q = 0; q < NLU; q++) {
            const bool ok = lu_row[q] < nc;
            cp_async16(&s.u[b][0][0] + lu_smem[q], usrc + (ok ? lu_glob[q] : 0), ok);
        }
        for (int r = tid; r < CHUNK; r += NTH) {
            if (r < nc)
                cp_async4(&s.g[b][r], p.gk + (rowc + r) * H + hd);
            else
                s.g[b][r] = 0.0f;
        }
        cp_async_commit();
    };

    /* prologue: STAGES - 1 groups in flight (empty groups past the end keep the count uniform) */
#pragma unroll
    for (int c = 0; c < STAGES - 1; c++) {
        if (c < nt_dp)
            issue(c, c);
        else
            cp_async_commit();
    }
    for (int ct = 0; ct < nt_dp; ct++) {
        const int b = ct % STAGES;
        const int nc = (int)min((int64_t)CHUNK, len_dp - (int64_t)ct * CHUNK);
        const bool store_h = (ct % p.M) == 0;
        const int64_t hrow = coff + ct / p.M;
        /* 16-bit state for w S (and the output stage); fp32 chunk states straight from registers */
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                const int r = sr0 + g + hh * 8, c = nt * 8 + 2 * t4;
                *reinterpret_cast<uint32_t *>(&s.s[r][c]) = Elem<T>::pack(S[nt][2 * hh], S[nt][2 * hh + 1]);
            }
        if (store_h && p.chunk_states != nullptr && hrow < p.cs_rows) {
#pragma unroll
            for (int nt = 0; nt < 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int r = sr0 + g + (e >> 1) * 8, c = vb * VB + nt * 8 + 2 * t4 + (e & 1);
                    if (r < p.K && c < p.V)
                        store_any(p.chunk_states, p.cs_dtype, ((hrow * H + hd) * p.K + r) * p.V + c, S[nt][e]);
                }
        }
        cp_async_wait<STAGES - 2>();
        __syncthreads(); /* chunk ct landed, s.s complete, every warp done with chunk ct - 1 */
        if (ct + STAGES - 1 < nt_dp)
            issue(ct + STAGES - 1, (ct + STAGES - 1) % STAGES); /* the stage chunk ct - 1 used */
        else
            cp_async_commit();
        if (store_h && hrow < p.h_rows) {
            T *hs = static_cast<T *>(p.hs) + ((hrow * H + hd) * KP) * p.VP + vb * VB;
            for (int e = tid; e < KP * (VB / 8); e += NTH) {
                const int r = e / (VB / 8), c = (e % (VB / 8)) * 8;
                *reinterpret_cast<uint4 *>(hs + (int64_t)r * p.VP + c) = *reinterpret_cast<const uint4 *>(&s.s[r][c]);
            }
        }

        /* v_new = u - w S over this warp's 16 x (64 / CG) piece */
        float P[VNT][4];
#pragma unroll
        for (int nt = 0; nt < VNT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                P[nt][e] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < KP; kk += 16) {
            uint32_t a[4];
            frag_a(a, &s.w[b][0][0], KP + PAD, vr0, kk, lane);
#pragma unroll
            for (int pp = 0; pp < VNT / 2; pp++) {
                uint32_t bb[4];
                frag_b_kn(bb, &s.s[0][0], VB + PAD, kk, vc0 + pp * 16, lane);
                Elem<T>::mma(P[2 * pp], a, bb[0], bb[1]);
                Elem<T>::mma(P[2 * pp + 1], a, bb[2], bb[3]);
            }
        }
        const float gl = s.g[b][nc - 1];
        T *vnew = static_cast<T *>(p.u) + ((bos * p.M + (int64_t)ct * CHUNK) * H + hd) * p.VP + vb * VB;
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
            const int r = vr0 + g + hh * 8;
            const bool ok = r < nc;
            const float f = ok ? exp2f(gl - s.g[b][r]) : 0.0f;
#pragma unroll
            for (int nt = 0; nt < VNT; nt++) {
                const int c = vc0 + nt * 8 + 2 * t4;
                T *up = &s.u[b][r][c];
                const float v0 = Elem<T>::to_f(up[0]) - P[nt][2 * hh];
                const float v1 = Elem<T>::to_f(up[1]) - P[nt][2 * hh + 1];
                if (ok)
                    *reinterpret_cast<uint32_t *>(vnew + (int64_t)r * H * p.VP + c) = Elem<T>::pack(v0, v1);
                *reinterpret_cast<uint32_t *>(up) = Elem<T>::pack(v0 * f, v1 * f);
            }
        }
        __syncthreads(); /* decayed v_new complete */

        /* S = 2^gl S + K^T (decayed v_new) */
        const float dec = exp2f(gl);
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                S[nt][e] *= dec;
#pragma unroll
        for (int ks = 0; ks < 4; ks++) {
            if (ks * 16 < nc) { /* rows past the chunk's end are zero */
                uint32_t a[4];
                frag_a_trans(a, &s.k[b][0][0], KP + PAD, sr0, ks * 16, lane);
#pragma unroll
                for (int pp = 0; pp < 4; pp++) {
                    uint32_t bb[4];
                    frag_b_kn(bb, &s.u[b][0][0], VB + PAD, ks * 16, pp * 16, lane);
                    Elem<T>::mma(S[2 * pp], a, bb[0], bb[1]);
                    Elem<T>::mma(S[2 * pp + 1], a, bb[2], bb[3]);
                }
            }
        }
    }
    cp_async_wait<0>(); /* no copy may land after the block exits */

    /* final state: the cache slot (in place, cache dtype) or the dense final_state */
    void *dst = nullptr;
    int dtype = 0;
    int64_t base = 0;
    if (p.state != nullptr) {
        const int slot = p.slots != nullptr ? p.slots[i] : i;
        if (slot >= 0 && slot < p.n_slots) {
            dst = p.state;
            dtype = p.state_dtype;
            base = (int64_t)slot * p.state_stride_slot + (int64_t)hd * p.state_stride_head;
        }
    } else if (p.final_state != nullptr) {
        dst = p.final_state;
        dtype = p.final_dtype;
        base = ((int64_t)i * H + hd) * p.K * p.V;
    }
    if (dst != nullptr) {
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = sr0 + g + (e >> 1) * 8, c = vb * VB + nt * 8 + 2 * t4 + (e & 1);
                if (r < p.K && c < p.V)
                    store_any(dst, dtype, base + (int64_t)r * p.V + c, S[nt][e]);
            }
    }
}

/* ================= stage 3: outputs per token chunk ================= */
constexpr int OB = 2 * VB; /* value columns per output block */
template <typename T, int KP> struct OutLayout {
    static constexpr size_t q_bytes = sizeof(T) * CHUNK * (KP + PAD);
    static constexpr size_t h_bytes = sizeof(T) * KP * (OB + PAD);
    static constexpr size_t k_bytes = sizeof(T) * CHUNK * (KP + PAD);
    static constexpr size_t kv_bytes = k_bytes + sizeof(T) * CHUNK * (OB + PAD); /* K_m then V_new,m */
    /* region A holds h, then (after Q h) the K / V buffer of the odd copies; region B the even ones */
    static constexpr size_t a_bytes = h_bytes > kv_bytes ? h_bytes : kv_bytes;
    static constexpr size_t off_a = q_bytes, off_b = off_a + a_bytes, off_g = off_b + kv_bytes;
    static constexpr size_t total = off_g + sizeof(float) * CHUNK;
};

/* Work split: one 256-thread block per (token chunk descriptor, head, 128 value columns); warp w
 * owns output rows [16 (w % 4), +16) and value columns [64 (w / 4), +64) of the block's slice,
 * and (the mask being causal) only score columns < 16 (w % 4) + 16. The next copy's K_m and
 * V_new,m tiles load while the current one is used (two buffers, the first reusing h's space). */
template <typename T, int KP>
__global__ void __launch_bounds__(256, KP <= 128 ? 2 : 1) chunk_out_kernel(const ChunkParams p) {
    constexpr int NTH = 256;
    using L = OutLayout<T, KP>;
    constexpr int VPR = KP / 8;
    constexpr int NLK = CHUNK * VPR / NTH;       /* K vectors per thread and copy     */
    constexpr int NLV = CHUNK * (OB / 8) / NTH;  /* V_new vectors per thread and copy */
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T *sq = reinterpret_cast<T *>(smem_raw);
    T *sh = reinterpret_cast<T *>(smem_raw + L::off_a);
    float *sg = reinterpret_cast<float *>(smem_raw + L::off_g);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t4 = lane & 3;
    const int rg = warp & 3, vh = warp >> 2;
    const int hd = blockIdx.y, H = p.H;
    const int zc = blockIdx.z * OB;           /* first value column of this block */
    const int cols_blk = min(OB, p.VP - zc);  /* 64 or 128 padded columns          */
    const bool has_cols = vh * VB < cols_blk; /* this warp's 64 columns exist      */
    const int i = p.cidx[2 * blockIdx.x], j = p.cidx[2 * blockIdx.x + 1];
    if (i < 0 || i >= p.N || j < 0)
        return;
    const int64_t bos = p.cu[i];
    const int64_t len = (int64_t)p.cu[i + 1] - bos;
    const int64_t start = (int64_t)j * CHUNK;
    if (start >= len)
        return; /* padding descriptor: inert */
    const int n = (int)min((int64_t)CHUNK, len - start);
    const int64_t t0 = bos + start;
    const int64_t hrow = (int64_t)p.coff[i] + j;
    if (hrow >= p.h_rows)
        return;

    const T *qsrc = static_cast<const T *>(p.q) + (t0 * H + hd) * p.K;
    if (p.q_vec)
        tile_async<T, NTH>(sq, KP + PAD, qsrc, (int64_t)H * p.K, n, KP, p.K, tid);
    else
        tile_scalar<T, NTH>(sq, KP + PAD, qsrc, (int64_t)H * p.K, n, KP, p.K, tid);
    {
        const T *hs = static_cast<const T *>(p.hs) + ((hrow * H + hd) * KP) * p.VP + zc;
        for (int e = tid; e < KP * (OB / 8); e += NTH) {
            const int r = e / (OB / 8), c = (e % (OB / 8)) * 8;
            const bool ok = c < cols_blk;
            cp_async16(sh + r * (OB + PAD) + c, ok ? hs + (int64_t)r * p.VP + c : hs, ok);
        }
    }
    if (tid < CHUNK)
        sg[tid] = tid < n ? p.gq[(t0 + tid) * H + hd] : 0.0f;

    /* this thread's copies of K_m / V_new,m rows (t0 + sigma) M + m: the same every copy but m */
    int64_t lk_glob[NLK], lv_glob[NLV];
    int lk_smem[NLK], lv_smem[NLV];
    bool lk_ok[NLK], lv_ok[NLV];
#pragma unroll
    for (int q = 0; q < NLK; q++) {
        const int e = tid + q * NTH, r = e / VPR, c = (e % VPR) * 8;
        lk_ok[q] = r < n;
        lk_smem[q] = r * (KP + PAD) + c;
        lk_glob[q] = (((t0 + (r < n ? r : 0)) * p.M) * H + hd) * KP + c;
    }
#pragma unroll
    for (int q = 0; q < NLV; q++) {
        const int e = tid + q * NTH, r = e / (OB / 8), c = (e % (OB / 8)) * 8;
        lv_ok[q] = r < n && c < cols_blk;
        lv_smem[q] = r * (OB + PAD) + c;
        lv_glob[q] = (((t0 + (r < n ? r : 0)) * p.M) * H + hd) * p.VP + zc + (c < cols_blk ? c : 0);
    }
    /* Starts the copies of copy m into the buffer at `buf` (K, then V_new) as one group. */
    auto issue = [&](int m, unsigned char *buf) {
        T *sk = reinterpret_cast<T *>(buf), *sv = reinterpret_cast<T *>(buf + L::k_bytes);
        const T *ksrc = static_cast<const T *>(p.kn) + (int64_t)m * H * KP;
        const T *vsrc = static_cast<const T *>(p.u) + (int64_t)m * H * p.VP;
#pragma unroll
        for (int q = 0; q < NLK; q++)
            cp_async16(sk + lk_smem[q], ksrc + lk_glob[q], lk_ok[q]);
#pragma unroll
        for (int q = 0; q < NLV; q++)
            cp_async16(sv + lv_smem[q], vsrc + lv_glob[q], lv_ok[q]);
        cp_async_commit();
    };
    unsigned char *buf_a = smem_raw + L::off_a, *buf_b = smem_raw + L::off_b;
    issue(0, buf_b); /* one group with q and h */
    cp_async_wait<0>();
    __syncthreads();
    if (p.l2norm) {
        l2norm_rows<T, KP, NTH / 32>(sq, KP + PAD, n, warp, lane);
        __syncthreads();
    }

    const int r0 = rg * 16, c0 = vh * VB;
    float acc[8][4];
#pragma unroll
    for (int nt = 0; nt < 8; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            acc[nt][e] = 0.0f;
    if (has_cols) { /* Q h */
#pragma unroll
        for (int kk = 0; kk < KP; kk += 16) {
            uint32_t a[4];
            frag_a(a, sq, KP + PAD, r0, kk, lane);
#pragma unroll
            for (int pp = 0; pp < 4; pp++) {
                uint32_t b[4];
                frag_b_kn(b, sh, OB + PAD, kk, c0 + pp * 16, lane);
                Elem<T>::mma(acc[2 * pp], a, b[0], b[1]);
                Elem<T>::mma(acc[2 * pp + 1], a, b[2], b[3]);
            }
        }
    }
    const float gq_lo = sg[r0 + g], gq_hi = sg[r0 + g + 8];
    {
        const float f_lo = exp2f(gq_lo), f_hi = exp2f(gq_hi);
#pragma unroll
        for (int nt = 0; nt < 8; nt++) {
            acc[nt][0] *= f_lo;
            acc[nt][1] *= f_lo;
            acc[nt][2] *= f_hi;
            acc[nt][3] *= f_hi;
        }
    }
    __syncthreads(); /* h is no longer read: region A takes copy 1 */
    if (p.M > 1)
        issue(1, buf_a);
    else
        cp_async_commit();

    for (int m = 0; m < p.M; m++) {
        unsigned char *buf = (m & 1) ? buf_a : buf_b;
        const T *sk = reinterpret_cast<const T *>(buf), *sv = reinterpret_cast<const T *>(buf + L::k_bytes);
        if (m > 0) {
            cp_async_wait<1>(); /* copy m landed (the group after it may still be in flight) */
            __syncthreads();
        }
        if (has_cols) {
            /* scores of this warp's rows against token columns < 16 (rg + 1) */
            float sc[8][4];
#pragma unroll
            for (int nt = 0; nt < 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    sc[nt][e] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < KP; kk += 16) {
                uint32_t a[4];
                frag_a(a, sq, KP + PAD, r0, kk, lane);
#pragma unroll
                for (int pp = 0; pp < 4; pp++) {
                    if (pp <= rg) {
                        uint32_t bk[4];
                        frag_b_nk(bk, sk, KP + PAD, kk, pp * 16, lane);
                        Elem<T>::mma(sc[2 * pp], a, bk[0], bk[1]);
                        Elem<T>::mma(sc[2 * pp + 1], a, bk[2], bk[3]);
                    }
                }
            }
            /* token-causal mask and decay ratio, rounded to T as the A operand of P V; tiles
             * entirely right of the diagonal block stay zero */
            uint32_t pa[4][4];
#pragma unroll
            for (int ks = 0; ks < 4; ks++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    pa[ks][e] = 0u;
#pragma unroll
            for (int nt = 0; nt < 8; nt++) {
                if ((nt >> 1) <= rg) {
                    float pv[4];
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int tau = r0 + g + (e >> 1) * 8, sig = nt * 8 + 2 * t4 + (e & 1);
                        const float gt = (e >> 1) ? gq_hi : gq_lo;
                        pv[e] = (sig <= tau && tau < n) ? sc[nt][e] * exp2f(gt - sg[sig]) : 0.0f;
                    }
                    pa[nt >> 1][(nt & 1) * 2 + 0] = Elem<T>::pack(pv[0], pv[1]);
                    pa[nt >> 1][(nt & 1) * 2 + 1] = Elem<T>::pack(pv[2], pv[3]);
                }
            }
#pragma unroll
            for (int ks = 0; ks < 4; ks++) {
                if (ks <= rg) {
#pragma unroll
                    for (int pp = 0; pp < 4; pp++) {
                        uint32_t bv[4];
                        frag_b_kn(bv, sv, OB + PAD, ks * 16, c0 + pp * 16, lane);
                        Elem<T>::mma(acc[2 * pp], pa[ks], bv[0], bv[1]);
                        Elem<T>::mma(acc[2 * pp + 1], pa[ks], bv[2], bv[3]);
                    }
                }
            }
        }
        __syncthreads(); /* every warp is done with this buffer */
        if (m + 2 < p.M)
            issue(m + 2, buf);
        else
            cp_async_commit();
    }
    cp_async_wait<0>();

    /* o = scale * acc, rows < n, columns < V */
    if (has_cols) {
        T *o = static_cast<T *>(p.o) + (t0 * H + hd) * p.V;
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = r0 + g + (e >> 1) * 8, c = zc + c0 + nt * 8 + 2 * t4 + (e & 1);
                if (r < n && c < p.V)
                    o[(int64_t)r * H * p.V + c] = Elem<T>::from_f(acc[nt][e] * p.scale);
            }
    }
}

/* Work split: a fixed grid strides over the token rows from cu_seqlens[N] on (padding tokens,
 * which no chunk owns) and zeroes their H * V elements; real rows are never touched. */
__global__ void __launch_bounds__(256) zero_tail_kernel(uint16_t *__restrict__ o, const int32_t *__restrict__ cu,
                                                        int n_seq, int64_t rows, int64_t row_elems) {
    const int64_t end = n_seq > 0 ? cu[n_seq] : 0;
    for (int64_t t = end + blockIdx.x; t < rows; t += gridDim.x)
        for (int64_t e = threadIdx.x; e < row_elems; e += blockDim.x)
            o[t * row_elems + e] = 0;
}

/* ---- dispatch of the templated stages over (dtype, padded K, pipeline depth) ---- */
template <typename T, int KP> struct Stages {
    static size_t wy_smem(int vp) { return sizeof(WySmem<T, KP>) + (size_t)CHUNK * (vp + PAD) * sizeof(T); }
    static size_t out_smem() { return OutLayout<T, KP>::total; }

    template <int STAGES> static cudaError_t launch_state(const ChunkParams &p, cudaStream_t st) {
        const size_t smem = sizeof(StateSmem<T, KP, STAGES>);
        cudaError_t err = cudaFuncSetAttribute(chunk_state_kernel<T, KP, STAGES>,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (err != cudaSuccess)
            return err;
        chunk_state_kernel<T, KP, STAGES><<<dim3((unsigned)(p.VP / VB), (unsigned)p.H, (unsigned)p.N), KP * 2, smem,
                                            st>>>(p);
        return cudaSuccess;
    }

    /* sms: multiprocessors of the device; with at most one state block per SM the deeper
     * pipeline costs no occupancy (K <= 128; K = 256 has room for two stages only). */
    static cudaError_t launch(const ChunkParams &p, int64_t num_chunks, int64_t num_chunks_dp, int sms,
                              cudaStream_t st) {
        cudaError_t err;
        if (num_chunks_dp > 0) {
            const size_t smem = wy_smem(p.VP);
            err = cudaFuncSetAttribute(chunk_wy_kernel<T, KP>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
            if (err != cudaSuccess)
                return err;
            chunk_wy_kernel<T, KP><<<dim3((unsigned)num_chunks_dp, (unsigned)p.H), 128, smem, st>>>(p);
        }
        GDP_CHUNK_STAGE_MARK(2, st);
        if (p.N > 0) {
            const int64_t blocks = (int64_t)(p.VP / VB) * p.H * p.N;
            if (KP <= 128 && blocks <= sms)
                err = launch_state<KP <= 128 ? 4 : 2>(p, st);
            else
                err = launch_state<2>(p, st);
            if (err != cudaSuccess)
                return err;
        }
        GDP_CHUNK_STAGE_MARK(3, st);
        if (num_chunks > 0) {
            err = cudaFuncSetAttribute(chunk_out_kernel<T, KP>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)out_smem());
            if (err != cudaSuccess)
                return err;
            chunk_out_kernel<T, KP><<<dim3((unsigned)num_chunks, (unsigned)p.H, (unsigned)((p.VP + OB - 1) / OB)),
                                      256, out_smem(), st>>>(p);
        }
        GDP_CHUNK_STAGE_MARK(4, st);
        return cudaGetLastError();
    }
};

template <typename T>
cudaError_t launch_stages(const ChunkParams &p, int64_t num_chunks, int64_t num_chunks_dp, int sms, cudaStream_t st) {
    switch (p.KP) {
    case 64: return Stages<T, 64>::launch(p, num_chunks, num_chunks_dp, sms, st);
    case 128: return Stages<T, 128>::launch(p, num_chunks, num_chunks_dp, sms, st);
    case 256: return Stages<T, 256>::launch(p, num_chunks, num_chunks_dp, sms, st);
    default: return cudaErrorInvalidValue; /* the workspace plan only produces the three above */
    }
}

bool aligned16(const void *ptr) { return ((uintptr_t)ptr & 15u) == 0; }

gdp_status_t cuda_fail(const char *op, const char *what, cudaError_t err) {
    (void)cudaGetLastError(); /* clear the error so the next call starts clean */
    GDP_FAIL(GDP_STATUS_CUDA_ERROR, "%s: %s failed: %s", op, what, cudaGetErrorString(err));
}

} // namespace

// kernel launchers

extern "C" gdp_status_t gdp_cuda_chunk(struct gdp_ctx *ctx, const gdp_chunk_args *a) {
    static const char *op = "gdp_chunk_gated_delta_product_varlen";
    /* ---- CUDA-only rules (the front-end checked shapes and dtypes common to all backends) ---- */
    if (a->q.dtype != GDP_DTYPE_BF16 && a->q.dtype != GDP_DTYPE_FP16)
        GDP_FAIL(GDP_STATUS_UNSUPPORTED,
                 "%s: q has dtype %s; the CUDA chunk op takes bf16 or fp16 q, k, v (as upstream); cast the inputs "
                 "or use GDP_BACKEND_CPU",
                 op, gdp_dtype_name(a->q.dtype));
    if (a->k.dtype != a->q.dtype || a->v.dtype != a->q.dtype || a->o.dtype != a->q.dtype)
        GDP_FAIL(GDP_STATUS_UNSUPPORTED, "%s: k (%s), v (%s) and o (%s) must have q's dtype %s on the CUDA backend",
                 op, gdp_dtype_name(a->k.dtype), gdp_dtype_name(a->v.dtype), gdp_dtype_name(a->o.dtype),
                 gdp_dtype_name(a->q.dtype));
    if (a->q.ndim != 4 || a->v.ndim != 4 || a->cu_seqlens.ndim != 1 || a->cu_seqlens.shape[0] < 1)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: q, v must be 4-d and cu_seqlens [N+1]", op);
    const int64_t T = a->q.shape[1], H = a->q.shape[2], K = a->q.shape[3], V = a->v.shape[3];
    const int64_t N = a->cu_seqlens.shape[0] - 1;
    const int32_t M = a->num_householder;
    if (K < 1 || V < 1 || K > GDP_MAX_HEAD_DIM || V > GDP_MAX_HEAD_DIM || H < 1 || M < 1)
        GDP_FAIL(GDP_STATUS_UNSUPPORTED, "%s: K = %lld, V = %lld, H = %lld, M = %d; the CUDA op takes 1 <= K, V <= %d",
                 op, (long long)K, (long long)V, (long long)H, M, GDP_MAX_HEAD_DIM);
    if (H > 65535 || N > 65535)
        GDP_FAIL(GDP_STATUS_UNSUPPORTED, "%s: %lld heads and %lld sequences; the CUDA grids take at most 65535 each",
                 op, (long long)H, (long long)N);
    const gdp_tensor *dense[] = {&a->q, &a->k, &a->v, &a->g, &a->beta, &a->o, &a->cu_seqlens, &a->initial_state,
                                 &a->final_state, &a->chunk_states, &a->chunk_indices, &a->chunk_indices_dp,
                                 &a->chunk_offsets, &a->state_indices};
    const char *dense_names[] = {"q", "k", "v", "g", "beta", "o", "cu_seqlens", "initial_state", "final_state",
                                 "chunk_states", "chunk_indices", "chunk_indices_dp", "chunk_offsets",
                                 "state_indices"};
    for (size_t d = 0; d < sizeof dense / sizeof dense[0]; d++)
        if (gdp_tensor_present(dense[d]) && !gdp_tensor_is_contiguous(dense[d]))
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: %s must be contiguous on the CUDA backend; pass a contiguous copy",
                     op, dense_names[d]);
    const bool have_state = gdp_tensor_present(&a->state);
    if (have_state) {
        if (a->state.ndim != 4 || gdp_tensor_stride(&a->state, 3) != 1 || gdp_tensor_stride(&a->state, 2) != V)
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                     "%s: state must be [slots, H, K, V] with its last two dims contiguous (strides %lld, 1 expected "
                     "%lld, 1)",
                     op, (long long)gdp_tensor_stride(&a->state, 2), (long long)V);
        if (a->state.dtype == GDP_DTYPE_INT32)
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: state must be fp32 or bf16", op);
    }
    const gdp_tensor *fl[] = {&a->initial_state, &a->final_state, &a->chunk_states, &a->beta};
    const char *fl_names[] = {"initial_state", "final_state", "chunk_states", "beta"};
    for (int d = 0; d < 4; d++)
        if (gdp_tensor_present(fl[d]) && fl[d]->dtype == GDP_DTYPE_INT32)
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: %s must be a float tensor", op, fl_names[d]);
    if (gdp_tensor_present(&a->g) && a->g.dtype != GDP_DTYPE_FP32)
        GDP_FAIL(GDP_STATUS_UNSUPPORTED, "%s: g has dtype %s; the CUDA op takes fp32 g", op, gdp_dtype_name(a->g.dtype));
    const bool have_desc = gdp_tensor_present(&a->chunk_indices) && gdp_tensor_present(&a->chunk_indices_dp) &&
                           gdp_tensor_present(&a->chunk_offsets);
    const bool any_desc = gdp_tensor_present(&a->chunk_indices) || gdp_tensor_present(&a->chunk_indices_dp) ||
                          gdp_tensor_present(&a->chunk_offsets);
    if (any_desc && !have_desc)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: pass all three descriptors (chunk_indices, chunk_indices_dp, "
                 "chunk_offsets) or none", op);
    if (gdp_tensor_present(&a->state_indices) && !have_desc)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: state_indices needs the three descriptors (as upstream); build them "
                 "with gdp_build_chunk_descriptors", op);
    const bool want_cs = a->return_chunk_states && gdp_tensor_present(&a->chunk_states);

    gdp_chunk_workspace_layout lay;
    GDP_CHECK(gdp_chunk_workspace_plan(T, N, M, (int32_t)H, (int32_t)K, (int32_t)V, &lay));
    if (have_desc && ctx->workspace_bytes < lay.total)
        GDP_FAIL(GDP_STATUS_INVALID_USAGE,
                 "%s: the ctx workspace holds %zu bytes and this call needs %zu; with descriptors given the op never "
                 "allocates: call gdp_chunk_get_workspace_size(%lld, %lld, %d, %lld, %lld, %lld, &bytes) and "
                 "gdp_ctx_reserve_workspace(ctx, bytes) once before the first call (and before graph capture)",
                 op, ctx->workspace_bytes, lay.total, (long long)T, (long long)N, M, (long long)H, (long long)K,
                 (long long)V);

    cudaStream_t stream = (cudaStream_t)ctx->stream;
    cudaError_t err;
    int64_t num_chunks, num_chunks_dp;
    const int32_t *cidx, *cidx_dp, *coff;
    if (have_desc) {
        num_chunks = a->chunk_indices.shape[0];
        num_chunks_dp = a->chunk_indices_dp.shape[0];
        cidx = (const int32_t *)a->chunk_indices.data;
        cidx_dp = (const int32_t *)a->chunk_indices_dp.data;
        coff = (const int32_t *)a->chunk_offsets.data;
    } else {
        /* Derive the descriptors on the host (FLA's path): one sync, grids from the real lengths. */
        GDP_CHECK(gdp_ctx_reserve_workspace(ctx, lay.total));
        int32_t *host = (int32_t *)gdp_calloc((size_t)(N + 1 + 2 * lay.desc_rows + 2 * lay.desc_rows_dp + N + 1),
                                              sizeof(int32_t), "the chunk descriptors");
        if (host == NULL)
            return GDP_STATUS_SYSTEM_ERROR;
        int32_t *cu_h = host, *ci_h = cu_h + N + 1, *cidp_h = ci_h + 2 * lay.desc_rows,
                *off_h = cidp_h + 2 * lay.desc_rows_dp;
        err = cudaMemcpyAsync(cu_h, a->cu_seqlens.data, (size_t)(N + 1) * sizeof(int32_t), cudaMemcpyDeviceToHost,
                              stream);
        if (err == cudaSuccess)
            err = cudaStreamSynchronize(stream);
        if (err != cudaSuccess) {
            free(host);
            return cuda_fail(op, "reading cu_seqlens", err);
        }
        gdp_status_t st = gdp_build_chunk_descriptors(cu_h, (int32_t)N, M, T, ci_h, cidp_h, off_h, &num_chunks,
                                                      &num_chunks_dp);
        if (st != GDP_STATUS_SUCCESS) {
            free(host);
            return st;
        }
        int32_t *dev = (int32_t *)((char *)ctx->workspace + lay.off_desc);
        err = cudaMemcpyAsync(dev, ci_h, (size_t)(2 * num_chunks) * sizeof(int32_t), cudaMemcpyHostToDevice, stream);
        if (err == cudaSuccess)
            err = cudaMemcpyAsync(dev + 2 * num_chunks, cidp_h, (size_t)(2 * num_chunks_dp) * sizeof(int32_t),
                                  cudaMemcpyHostToDevice, stream);
        if (err == cudaSuccess)
            err = cudaMemcpyAsync(dev + 2 * num_chunks + 2 * num_chunks_dp, off_h, (size_t)(N + 1) * sizeof(int32_t),
                                  cudaMemcpyHostToDevice, stream);
        if (err == cudaSuccess)
            err = cudaStreamSynchronize(stream); /* the host arrays are freed next */
        free(host);
        if (err != cudaSuccess)
            return cuda_fail(op, "uploading the derived descriptors", err);
        cidx = dev;
        cidx_dp = dev + 2 * num_chunks;
        coff = dev + 2 * num_chunks + 2 * num_chunks_dp;
    }

    char *ws = (char *)ctx->workspace;
    ChunkParams p;
    memset(&p, 0, sizeof p);
    p.q = a->q.data;
    p.k = a->k.data;
    p.v = a->v.data;
    p.beta = a->beta.data;
    p.beta_dtype = a->beta.dtype;
    p.h0 = gdp_tensor_present(&a->initial_state) ? a->initial_state.data : nullptr;
    p.h0_dtype = p.h0 ? a->initial_state.dtype : 0;
    p.cu = (const int32_t *)a->cu_seqlens.data;
    p.cidx = cidx;
    p.cidx_dp = cidx_dp;
    p.coff = coff;
    p.gq = (const float *)(ws + lay.off_gq);
    p.gk = (const float *)(ws + lay.off_gk);
    p.kn = ws + lay.off_kn;
    p.w = ws + lay.off_w;
    p.u = ws + lay.off_u;
    p.hs = ws + lay.off_h;
    p.o = a->o.data;
    if (have_state) {
        p.state = a->state.data;
        p.state_dtype = a->state.dtype;
        p.n_slots = a->state.shape[0];
        p.state_stride_slot = gdp_tensor_stride(&a->state, 0);
        p.state_stride_head = gdp_tensor_stride(&a->state, 1);
        p.slots = gdp_tensor_present(&a->state_indices) ? (const int32_t *)a->state_indices.data : nullptr;
    } else if (a->output_final_state && gdp_tensor_present(&a->final_state)) {
        p.final_state = a->final_state.data;
        p.final_dtype = a->final_state.dtype;
    }
    if (want_cs) {
        p.chunk_states = a->chunk_states.data;
        p.cs_dtype = a->chunk_states.dtype;
        p.cs_rows = a->chunk_states.shape[0];
    }
    p.T = T;
    p.h_rows = lay.h_rows;
    p.N = (int)N;
    p.H = (int)H;
    p.K = (int)K;
    p.V = (int)V;
    p.M = M;
    p.KP = (int)lay.kp;
    p.VP = (int)lay.vp;
    p.scale = (float)(a->scale != 0.0 ? a->scale : 1.0 / sqrt((double)K));
    p.l2norm = a->use_qk_l2norm_in_kernel ? 1 : 0;
    p.q_vec = (K % 8 == 0) && aligned16(a->q.data);
    p.k_vec = (K % 8 == 0) && aligned16(a->k.data);
    p.v_vec = (V % 8 == 0) && aligned16(a->v.data);
    /* exact_log2e is a CPU-reference knob: in fp32 1/ln 2 rounds to GDP_RCP_LN2 anyway. */

    /* ---- enqueue: cumsums, WY, state sweep, outputs, zero tail ---- */
    gdp_tensor gq_view, gk_view;
    int64_t gq_shape[3] = {1, T, H}, gk_shape[3] = {1, T * M, H};
    gdp_tensor_init(&gq_view, ws + lay.off_gq, GDP_DTYPE_FP32, 3, gq_shape);
    gdp_tensor_init(&gk_view, ws + lay.off_gk, GDP_DTYPE_FP32, 3, gk_shape);
    GDP_CHUNK_STAGE_MARK(0, stream);
    GDP_CHECK(gdp_cuda_chunk_local_cumsum(ctx, &gq_view, &gk_view, gdp_tensor_present(&a->g) ? &a->g : NULL,
                                          &a->cu_seqlens, M));
    GDP_CHUNK_STAGE_MARK(1, stream);
    int sms = 0;
    err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ctx->device);
    if (err != cudaSuccess)
        return cuda_fail(op, "reading the multiprocessor count", err);
    err = a->q.dtype == GDP_DTYPE_BF16 ? launch_stages<__nv_bfloat16>(p, num_chunks, num_chunks_dp, sms, stream)
                                       : launch_stages<__half>(p, num_chunks, num_chunks_dp, sms, stream);
    if (err != cudaSuccess)
        return cuda_fail(op, "launching the chunk stages", err);
    if (T > 0) {
        zero_tail_kernel<<<(unsigned)(T < 256 ? T : 256), 256, 0, stream>>>((uint16_t *)a->o.data, p.cu, p.N, T,
                                                                            H * V);
        err = cudaGetLastError();
        if (err != cudaSuccess)
            return cuda_fail(op, "launching the tail zero-fill", err);
    }
    GDP_CHUNK_STAGE_MARK(5, stream);
    return GDP_STATUS_SUCCESS;
}
