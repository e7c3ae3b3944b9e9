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
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

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

/* Loads a 64 x COLS tile of a row-major input (row stride ld_g elements) into smem, zero for
 * rows >= nrows or cols >= ncols; if row_scale, element (r, c) becomes T(row_scale[r] * x).
 * vec: ncols % 8 == 0 and 16-byte aligned rows, so 16-byte loads are legal. */
template <typename T, int COLS, int NTH>
__device__ __forceinline__ void load_input_tile(T *dst, int ld_s, const T *__restrict__ src, int64_t ld_g, int nrows,
                                                int ncols, bool vec, const float *row_scale, int tid) {
    if (vec) {
        constexpr int VPR = COLS / 8;
#pragma unroll 4
        for (int e = tid; e < CHUNK * VPR; e += NTH) {
            int r = e / VPR, c = (e % VPR) * 8;
            uint4 val = make_uint4(0u, 0u, 0u, 0u);
            if (r < nrows && c < ncols)
                val = __ldg(reinterpret_cast<const uint4 *>(src + r * ld_g + c));
            if (row_scale != nullptr) {
                T *x = reinterpret_cast<T *>(&val);
                float sc = row_scale[r];
#pragma unroll
                for (int j = 0; j < 8; j++)
                    x[j] = Elem<T>::from_f(sc * Elem<T>::to_f(x[j]));
            }
            *reinterpret_cast<uint4 *>(dst + r * ld_s + c) = val;
        }
    } else {
        for (int e = tid; e < CHUNK * COLS; e += NTH) {
            int r = e / COLS, c = e % COLS;
            float x = 0.0f;
            if (r < nrows && c < ncols)
                x = Elem<T>::to_f(src[r * ld_g + c]);
            if (row_scale != nullptr)
                x *= row_scale[r];
            dst[r * ld_s + c] = Elem<T>::from_f(x);
        }
    }
}

/* In-place L2 norm of smem rows [0, nrows): x / sqrt(sum x^2 + 1e-6) in fp32, rounded to T.
 * One warp per row; the lane-strided partial sums meet in a fixed shuffle tree (deterministic). */
template <typename T, int COLS, int NW>
__device__ __forceinline__ void l2norm_rows(T *s, int ld, int nrows, int warp, int lane) {
    for (int r = warp; r < nrows; r += NW) {
        float ss = 0.0f;
#pragma unroll
        for (int c = lane; c < COLS; c += 32) {
            float x = Elem<T>::to_f(s[r * ld + c]);
            ss += x * x;
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            ss += __shfl_xor_sync(0xffffffffu, ss, o);
        float inv = 1.0f / sqrtf(ss + (float)GDP_L2NORM_EPS);
#pragma unroll
        for (int c = lane; c < COLS; c += 32)
            s[r * ld + c] = Elem<T>::from_f(Elem<T>::to_f(s[r * ld + c]) * inv);
    }
}

/* ================= stage 1: WY factors per expanded chunk ================= */
template <typename T, int KP> struct WySmem {
    T k[CHUNK][KP + PAD];  /* keys, then beta 2^Gk K                        */
    T vb[CHUNK][VB + PAD]; /* one 64-column block of beta V                  */
    T ai[CHUNK][CHUNK + PAD];
    float a[CHUNK][CHUNK + 4];
    float x[CHUNK][CHUNK + 4]; /* (I + A)^-1 in fp32                          */
    float tmp[3][16][16];
    float beta[CHUNK];
    float gk[CHUNK];
};

/* Work split: one 128-thread block per (expanded chunk descriptor, head); warp w owns rows
 * [16w, 16w+16) of A, w and u; the 64x64 triangular inverse runs on CUDA cores in fp32. */
template <typename T, int KP>
__global__ void __launch_bounds__(128) chunk_wy_kernel(const ChunkParams p) {
    constexpr int NTH = 128;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    WySmem<T, KP> &s = *reinterpret_cast<WySmem<T, KP> *>(smem_raw);
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

    /* keys, beta, Gk */
    load_input_tile<T, KP, NTH>(&s.k[0][0], KP + PAD, static_cast<const T *>(p.k) + (row0 * H + hd) * p.K,
                                (int64_t)H * p.K, n, p.K, p.k_vec, nullptr, tid);
    if (tid < CHUNK) {
        float b = 0.0f, gk = 0.0f;
        if (tid < n) {
            b = load_any(p.beta, p.beta_dtype, (row0 + tid) * H + hd);
            gk = p.gk[(row0 + tid) * H + hd];
        }
        s.beta[tid] = b;
        s.gk[tid] = gk;
    }
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
            int r = e / VPR, c = (e % VPR) * 8;
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
                int r = r0 + g + (e >> 1) * 8, c = nt * 8 + 2 * t4 + (e & 1);
                float val = 0.0f;
                if (c < r && r < n) /* exponent <= 0 here: no overflow */
                    val = acc[nt][e] * exp2f(s.gk[r] - s.gk[c]) * s.beta[r];
                s.a[r][c] = val;
            }
        /* the inverse starts at zero: its blocks above the diagonal stay zero */
        for (int e = tid; e < CHUNK * CHUNK; e += NTH)
            s.x[e >> 6][e & 63] = 0.0f;
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
    /* Off-diagonal blocks, block row by block row: X_rc = -D_r sum_{c <= q < r} A_rq X_qc. */
    for (int rb = 1; rb < 4; rb++) {
        for (int e = tid; e < rb * 256; e += NTH) {
            int cb = e >> 8, rr = (e >> 4) & 15, cc = e & 15;
            float acc = 0.0f;
            for (int q = cb * 16; q < rb * 16; q++)
                acc += s.a[rb * 16 + rr][q] * s.x[q][cb * 16 + cc];
            s.tmp[cb][rr][cc] = acc;
        }
        __syncthreads();
        for (int e = tid; e < rb * 256; e += NTH) {
            int cb = e >> 8, rr = (e >> 4) & 15, cc = e & 15;
            float acc = 0.0f;
#pragma unroll
            for (int q = 0; q < 16; q++)
                acc += s.x[rb * 16 + rr][rb * 16 + q] * s.tmp[cb][q][cc];
            s.x[rb * 16 + rr][cb * 16 + cc] = -acc;
        }
        __syncthreads();
    }
    /* Ai rounded to T; keys become beta 2^Gk K (rounded to T). */
    for (int e = tid; e < CHUNK * CHUNK; e += NTH) {
        int r = e >> 6, c = e & 63;
        s.ai[r][c] = Elem<T>::from_f(s.x[r][c]);
    }
    for (int e = tid; e < CHUNK * KP; e += NTH) {
        int r = e / KP, c = e % KP;
        float f = s.beta[r] * exp2f(s.gk[r]);
        s.k[r][c] = Elem<T>::from_f(f * Elem<T>::to_f(s.k[r][c]));
    }
    __syncthreads();

    const int r0 = warp * 16;
    /* w = Ai (beta 2^Gk K): Ai is lower triangular, so only k-steps up to the warp's rows. */
#pragma unroll
    for (int cb = 0; cb < KP / 64; cb++) {
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
                frag_a(a, &s.ai[0][0], CHUNK + PAD, r0, ks * 16, lane);
#pragma unroll
                for (int pp = 0; pp < 4; pp++) {
                    uint32_t b[4];
                    frag_b_kn(b, &s.k[0][0], KP + PAD, ks * 16, cb * 64 + pp * 16, lane);
                    Elem<T>::mma(acc[2 * pp], a, b[0], b[1]);
                    Elem<T>::mma(acc[2 * pp + 1], a, b[2], b[3]);
                }
            }
        }
        T *w = static_cast<T *>(p.w) + (row0 * H + hd) * KP + cb * 64;
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                int r = r0 + g + hh * 8, c = nt * 8 + 2 * t4;
                if (r < n)
                    *reinterpret_cast<uint32_t *>(w + (int64_t)r * H * KP + c) =
                        Elem<T>::pack(acc[nt][2 * hh], acc[nt][2 * hh + 1]);
            }
    }

    /* u = Ai (beta V), one 64-column block of V at a time. */
    for (int vb = 0; vb < p.VP / VB; vb++) {
        if (vb > 0)
            __syncthreads(); /* the previous block's reads of s.vb are done */
        const int ncols = min(VB, p.V - vb * VB);
        load_input_tile<T, VB, NTH>(&s.vb[0][0], VB + PAD,
                                    static_cast<const T *>(p.v) + (row0 * H + hd) * p.V + vb * VB,
                                    (int64_t)H * p.V, n, ncols, p.v_vec, s.beta, tid);
        __syncthreads();
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
                frag_a(a, &s.ai[0][0], CHUNK + PAD, r0, ks * 16, lane);
#pragma unroll
                for (int pp = 0; pp < 4; pp++) {
                    uint32_t b[4];
                    frag_b_kn(b, &s.vb[0][0], VB + PAD, ks * 16, pp * 16, lane);
                    Elem<T>::mma(acc[2 * pp], a, b[0], b[1]);
                    Elem<T>::mma(acc[2 * pp + 1], a, b[2], b[3]);
                }
            }
        }
        T *u = static_cast<T *>(p.u) + (row0 * H + hd) * p.VP + vb * VB;
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                int r = r0 + g + hh * 8, c = nt * 8 + 2 * t4;
                if (r < n)
                    *reinterpret_cast<uint32_t *>(u + (int64_t)r * H * p.VP + c) =
                        Elem<T>::pack(acc[nt][2 * hh], acc[nt][2 * hh + 1]);
            }
    }
}

/* ================= stage 2: sequential state sweep ================= */
template <typename T, int KP> struct StateSmem {
    T w[2][CHUNK][KP + PAD];
    T k[2][CHUNK][KP + PAD];
    T u[2][CHUNK][VB + PAD]; /* u of the chunk, overwritten by the decayed v_new */
    T s[KP][VB + PAD];       /* 16-bit copy of the running state                */
    float g[2][CHUNK];
};

/* Work split: one block of KP threads per (sequence, head, 64 value columns), looping over the
 * sequence's expanded chunks in order; warp w keeps state rows [32w, 32w+32) in fp32 registers,
 * and the 64x64 v_new tile is split among the warps by rows (and by column halves for KP 256). */
template <typename T, int KP>
__global__ void __launch_bounds__(KP) chunk_state_kernel(const ChunkParams p) {
    constexpr int NW = KP / 32, NTH = KP;
    constexpr int VMT = NW == 2 ? 2 : 1; /* m16 tiles of v_new per warp */
    constexpr int VNT = NW == 8 ? 4 : 8; /* n8 tiles of v_new per warp  */
    extern __shared__ __align__(16) unsigned char smem_raw[];
    StateSmem<T, KP> &s = *reinterpret_cast<StateSmem<T, KP> *>(smem_raw);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t4 = lane & 3;
    const int vb = blockIdx.x, hd = blockIdx.y, i = blockIdx.z, H = p.H;
    const int64_t bos = p.cu[i];
    const int64_t len_dp = ((int64_t)p.cu[i + 1] - bos) * p.M;
    const int nt_dp = (int)((len_dp + CHUNK - 1) / CHUNK);
    const int64_t coff = p.coff[i];
    const int vr0 = NW == 2 ? warp * 32 : (warp & 3) * 16; /* v_new tile rows of this warp   */
    const int vc0 = NW == 8 ? (warp >> 2) * 32 : 0;        /* v_new tile columns of this warp */
    const int sr0 = warp * 32;                             /* state rows of this warp         */

    /* state in registers: S[mt][nt] covers rows sr0 + 16 mt + {g, g+8}, cols 8 nt + 2 t4 + {0, 1} */
    float S[2][8][4];
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int r = sr0 + mt * 16 + g + (e >> 1) * 8, c = vb * VB + nt * 8 + 2 * t4 + (e & 1);
                float x = 0.0f;
                if (p.h0 != nullptr && r < p.K && c < p.V)
                    x = load_any(p.h0, p.h0_dtype, (((int64_t)i * H + hd) * p.K + r) * p.V + c);
                S[mt][nt][e] = x;
            }

    auto issue = [&](int ct, int b) {
        const int64_t rowc = bos * p.M + (int64_t)ct * CHUNK;
        const int nc = (int)min((int64_t)CHUNK, len_dp - (int64_t)ct * CHUNK);
        constexpr int VPR = KP / 8;
        const T *wsrc = static_cast<const T *>(p.w), *ksrc = static_cast<const T *>(p.kn);
        const T *usrc = static_cast<const T *>(p.u);
#pragma unroll 4
        for (int e = tid; e < CHUNK * VPR; e += NTH) {
            int r = e / VPR, c = (e % VPR) * 8;
            bool ok = r < nc;
            int64_t off = ((rowc + (ok ? r : 0)) * H + hd) * KP + c;
            cp_async16(&s.w[b][r][c], wsrc + off, ok);
            cp_async16(&s.k[b][r][c], ksrc + off, ok);
        }
        for (int e = tid; e < CHUNK * (VB / 8); e += NTH) {
            int r = e / (VB / 8), c = (e % (VB / 8)) * 8;
            bool ok = r < nc;
            cp_async16(&s.u[b][r][c], usrc + ((rowc + (ok ? r : 0)) * H + hd) * p.VP + vb * VB + c, ok);
        }
        for (int r = tid; r < CHUNK; r += NTH) {
            if (r < nc)
                cp_async4(&s.g[b][r], p.gk + (rowc + r) * H + hd);
            else
                s.g[b][r] = 0.0f;
        }
        cp_async_commit();
    };

    if (nt_dp > 0)
        issue(0, 0);
    for (int ct = 0; ct < nt_dp; ct++) {
        const int b = ct & 1;
        const int nc = (int)min((int64_t)CHUNK, len_dp - (int64_t)ct * CHUNK);
        const bool store_h = (ct % p.M) == 0;
        const int64_t hrow = coff + ct / p.M;
        /* 16-bit state for w S (and the output stage); fp32 chunk states straight from registers */
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int nt = 0; nt < 8; nt++)
#pragma unroll
                for (int hh = 0; hh < 2; hh++) {
                    int r = sr0 + mt * 16 + g + hh * 8, c = nt * 8 + 2 * t4;
                    *reinterpret_cast<uint32_t *>(&s.s[r][c]) = Elem<T>::pack(S[mt][nt][2 * hh], S[mt][nt][2 * hh + 1]);
                }
        if (store_h && p.chunk_states != nullptr && hrow < p.cs_rows) {
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int nt = 0; nt < 8; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        int r = sr0 + mt * 16 + g + (e >> 1) * 8, c = vb * VB + nt * 8 + 2 * t4 + (e & 1);
                        if (r < p.K && c < p.V)
                            store_any(p.chunk_states, p.cs_dtype, ((hrow * H + hd) * p.K + r) * p.V + c, S[mt][nt][e]);
                    }
        }
        cp_async_wait_all();
        __syncthreads(); /* chunk ct landed, s.s complete, every warp done with chunk ct - 1 */
        if (ct + 1 < nt_dp)
            issue(ct + 1, b ^ 1);
        if (store_h && hrow < p.h_rows) {
            T *hs = static_cast<T *>(p.hs) + ((hrow * H + hd) * KP) * p.VP + vb * VB;
            for (int e = tid; e < KP * (VB / 8); e += NTH) {
                int r = e / (VB / 8), c = (e % (VB / 8)) * 8;
                *reinterpret_cast<uint4 *>(hs + (int64_t)r * p.VP + c) = *reinterpret_cast<const uint4 *>(&s.s[r][c]);
            }
        }

        /* v_new = u - w S over this warp's tile */
        float P[VMT][VNT][4];
#pragma unroll
        for (int mt = 0; mt < VMT; mt++)
#pragma unroll
            for (int nt = 0; nt < VNT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    P[mt][nt][e] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < KP; kk += 16) {
            uint32_t a[VMT][4];
#pragma unroll
            for (int mt = 0; mt < VMT; mt++)
                frag_a(a[mt], &s.w[b][0][0], KP + PAD, vr0 + mt * 16, kk, lane);
#pragma unroll
            for (int pp = 0; pp < VNT / 2; pp++) {
                uint32_t bb[4];
                frag_b_kn(bb, &s.s[0][0], VB + PAD, kk, vc0 + pp * 16, lane);
#pragma unroll
                for (int mt = 0; mt < VMT; mt++) {
                    Elem<T>::mma(P[mt][2 * pp], a[mt], bb[0], bb[1]);
                    Elem<T>::mma(P[mt][2 * pp + 1], a[mt], bb[2], bb[3]);
                }
            }
        }
        const float gl = s.g[b][nc - 1];
        T *vnew = static_cast<T *>(p.u) + ((bos * p.M + (int64_t)ct * CHUNK) * H + hd) * p.VP + vb * VB;
#pragma unroll
        for (int mt = 0; mt < VMT; mt++)
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                const int r = vr0 + mt * 16 + g + hh * 8;
                const bool ok = r < nc;
                const float f = ok ? exp2f(gl - s.g[b][r]) : 0.0f;
#pragma unroll
                for (int nt = 0; nt < VNT; nt++) {
                    const int c = vc0 + nt * 8 + 2 * t4;
                    T *up = &s.u[b][r][c];
                    float v0 = Elem<T>::to_f(up[0]) - P[mt][nt][2 * hh];
                    float v1 = Elem<T>::to_f(up[1]) - P[mt][nt][2 * hh + 1];
                    if (ok)
                        *reinterpret_cast<uint32_t *>(vnew + (int64_t)r * H * p.VP + c) = Elem<T>::pack(v0, v1);
                    *reinterpret_cast<uint32_t *>(up) = Elem<T>::pack(v0 * f, v1 * f);
                }
            }
        __syncthreads(); /* decayed v_new complete */

        /* S = 2^gl S + K^T (decayed v_new) */
        const float dec = exp2f(gl);
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int nt = 0; nt < 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    S[mt][nt][e] *= dec;
#pragma unroll
        for (int ks = 0; ks < 4; ks++) {
            if (ks * 16 < nc) { /* rows past the chunk's end are zero */
                uint32_t a[2][4];
#pragma unroll
                for (int mt = 0; mt < 2; mt++)
                    frag_a_trans(a[mt], &s.k[b][0][0], KP + PAD, sr0 + mt * 16, ks * 16, lane);
#pragma unroll
                for (int pp = 0; pp < 4; pp++) {
                    uint32_t bb[4];
                    frag_b_kn(bb, &s.u[b][0][0], VB + PAD, ks * 16, pp * 16, lane);
#pragma unroll
                    for (int mt = 0; mt < 2; mt++) {
                        Elem<T>::mma(S[mt][2 * pp], a[mt], bb[0], bb[1]);
                        Elem<T>::mma(S[mt][2 * pp + 1], a[mt], bb[2], bb[3]);
                    }
                }
            }
        }
    }

    /* final state: the cache slot (in place, cache dtype) or the dense final_state */
    void *dst = nullptr;
    int dtype = 0;
    int64_t base = 0;
    if (p.state != nullptr) {
        int slot = p.slots != nullptr ? p.slots[i] : i;
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
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int nt = 0; nt < 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int r = sr0 + mt * 16 + g + (e >> 1) * 8, c = vb * VB + nt * 8 + 2 * t4 + (e & 1);
                    if (r < p.K && c < p.V)
                        store_any(dst, dtype, base + (int64_t)r * p.V + c, S[mt][nt][e]);
                }
    }
}

/* ================= stage 3: outputs per token chunk ================= */
template <typename T, int KP> struct OutSmem {
    T q[CHUNK][KP + PAD];
    T h[KP][VB + PAD];
    T k[CHUNK][KP + PAD];
    T v[CHUNK][VB + PAD];
    float g[CHUNK];
};

/* Work split: one 128-thread block per (token chunk descriptor, head, 64 value columns); warp w
 * owns output rows [16w, 16w+16) and, the mask being causal, only score columns < 16w + 16. */
template <typename T, int KP>
__global__ void __launch_bounds__(128) chunk_out_kernel(const ChunkParams p) {
    constexpr int NTH = 128;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    OutSmem<T, KP> &s = *reinterpret_cast<OutSmem<T, KP> *>(smem_raw);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t4 = lane & 3;
    const int hd = blockIdx.y, vb = blockIdx.z, H = p.H;
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

    load_input_tile<T, KP, NTH>(&s.q[0][0], KP + PAD, static_cast<const T *>(p.q) + (t0 * H + hd) * p.K,
                                (int64_t)H * p.K, n, p.K, p.q_vec, nullptr, tid);
    {
        const T *hs = static_cast<const T *>(p.hs) + ((hrow * H + hd) * KP) * p.VP + vb * VB;
        for (int e = tid; e < KP * (VB / 8); e += NTH) {
            int r = e / (VB / 8), c = (e % (VB / 8)) * 8;
            cp_async16(&s.h[r][c], hs + (int64_t)r * p.VP + c, true);
        }
        cp_async_commit();
    }
    if (tid < CHUNK)
        s.g[tid] = tid < n ? p.gq[(t0 + tid) * H + hd] : 0.0f;
    cp_async_wait_all();
    __syncthreads();
    if (p.l2norm) {
        l2norm_rows<T, KP, NTH / 32>(&s.q[0][0], KP + PAD, n, warp, lane);
        __syncthreads();
    }

    const int r0 = warp * 16;
    float acc[8][4];
#pragma unroll
    for (int nt = 0; nt < 8; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            acc[nt][e] = 0.0f;
    /* Q h */
#pragma unroll
    for (int kk = 0; kk < KP; kk += 16) {
        uint32_t a[4];
        frag_a(a, &s.q[0][0], KP + PAD, r0, kk, lane);
#pragma unroll
        for (int pp = 0; pp < 4; pp++) {
            uint32_t b[4];
            frag_b_kn(b, &s.h[0][0], VB + PAD, kk, pp * 16, lane);
            Elem<T>::mma(acc[2 * pp], a, b[0], b[1]);
            Elem<T>::mma(acc[2 * pp + 1], a, b[2], b[3]);
        }
    }
    const float gq_lo = s.g[r0 + g], gq_hi = s.g[r0 + g + 8];
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

    for (int m = 0; m < p.M; m++) {
        __syncthreads(); /* the previous copy's s.k / s.v reads are done */
        {
            const T *ksrc = static_cast<const T *>(p.kn), *vsrc = static_cast<const T *>(p.u);
            constexpr int VPR = KP / 8;
            for (int e = tid; e < CHUNK * VPR; e += NTH) {
                int r = e / VPR, c = (e % VPR) * 8;
                bool ok = r < n;
                int64_t row = (t0 + (ok ? r : 0)) * p.M + m;
                cp_async16(&s.k[r][c], ksrc + (row * H + hd) * KP + c, ok);
            }
            for (int e = tid; e < CHUNK * (VB / 8); e += NTH) {
                int r = e / (VB / 8), c = (e % (VB / 8)) * 8;
                bool ok = r < n;
                int64_t row = (t0 + (ok ? r : 0)) * p.M + m;
                cp_async16(&s.v[r][c], vsrc + (row * H + hd) * p.VP + vb * VB + c, ok);
            }
            cp_async_commit();
            cp_async_wait_all();
        }
        __syncthreads();

        /* scores of this warp's rows against token columns < 16 (warp + 1) */
        float sc[8][4];
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                sc[nt][e] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < KP; kk += 16) {
            uint32_t a[4];
            frag_a(a, &s.q[0][0], KP + PAD, r0, kk, lane);
#pragma unroll
            for (int pp = 0; pp < 4; pp++) {
                if (pp <= warp) {
                    uint32_t b[4];
                    frag_b_nk(b, &s.k[0][0], KP + PAD, kk, pp * 16, lane);
                    Elem<T>::mma(sc[2 * pp], a, b[0], b[1]);
                    Elem<T>::mma(sc[2 * pp + 1], a, b[2], b[3]);
                }
            }
        }
        /* token-causal mask and decay ratio, rounded to T as the A operand of P V */
        uint32_t pa[4][4];
#pragma unroll
        for (int nt = 0; nt < 8; nt++) {
            float pv[4];
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int tau = r0 + g + (e >> 1) * 8, sig = nt * 8 + 2 * t4 + (e & 1);
                float gt = (e >> 1) ? gq_hi : gq_lo;
                pv[e] = (sig <= tau && tau < n) ? sc[nt][e] * exp2f(gt - s.g[sig]) : 0.0f;
            }
            pa[nt >> 1][(nt & 1) * 2 + 0] = Elem<T>::pack(pv[0], pv[1]);
            pa[nt >> 1][(nt & 1) * 2 + 1] = Elem<T>::pack(pv[2], pv[3]);
        }
#pragma unroll
        for (int ks = 0; ks < 4; ks++) {
            if (ks <= warp) {
#pragma unroll
                for (int pp = 0; pp < 4; pp++) {
                    uint32_t b[4];
                    frag_b_kn(b, &s.v[0][0], VB + PAD, ks * 16, pp * 16, lane);
                    Elem<T>::mma(acc[2 * pp], pa[ks], b[0], b[1]);
                    Elem<T>::mma(acc[2 * pp + 1], pa[ks], b[2], b[3]);
                }
            }
        }
    }

    /* o = scale * acc, rows < n, columns < V */
    T *o = static_cast<T *>(p.o) + (t0 * H + hd) * p.V;
#pragma unroll
    for (int nt = 0; nt < 8; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int r = r0 + g + (e >> 1) * 8, c = vb * VB + nt * 8 + 2 * t4 + (e & 1);
            if (r < n && c < p.V)
                o[(int64_t)r * H * p.V + c] = Elem<T>::from_f(acc[nt][e] * p.scale);
        }
}

/* Work split: one block per token row; rows before cu_seqlens[N] leave at once, tail rows
 * (padding tokens, which no chunk owns) are zeroed over all H * V elements. */
__global__ void __launch_bounds__(256) zero_tail_kernel(uint16_t *__restrict__ o, const int32_t *__restrict__ cu,
                                                        int n_seq, int64_t row_elems) {
    const int64_t t = blockIdx.x;
    const int64_t end = n_seq > 0 ? cu[n_seq] : 0;
    if (t < end)
        return;
    for (int64_t e = threadIdx.x; e < row_elems; e += blockDim.x)
        o[t * row_elems + e] = 0;
}

/* ---- dispatch of the templated stages over (dtype, padded K) ---- */
template <typename T, int KP> struct Stages {
    static size_t wy_smem() { return sizeof(WySmem<T, KP>); }
    static size_t state_smem() { return sizeof(StateSmem<T, KP>); }
    static size_t out_smem() { return sizeof(OutSmem<T, KP>); }

    static cudaError_t launch(const ChunkParams &p, int64_t num_chunks, int64_t num_chunks_dp, cudaStream_t st) {
        cudaError_t err;
        if (num_chunks_dp > 0 && p.H > 0) {
            err = cudaFuncSetAttribute(chunk_wy_kernel<T, KP>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)wy_smem());
            if (err != cudaSuccess)
                return err;
            chunk_wy_kernel<T, KP><<<dim3((unsigned)num_chunks_dp, (unsigned)p.H), 128, wy_smem(), st>>>(p);
        }
        GDP_CHUNK_STAGE_MARK(2, st);
        if (p.N > 0 && p.H > 0) {
            err = cudaFuncSetAttribute(chunk_state_kernel<T, KP>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)state_smem());
            if (err != cudaSuccess)
                return err;
            chunk_state_kernel<T, KP><<<dim3((unsigned)(p.VP / VB), (unsigned)p.H, (unsigned)p.N), KP, state_smem(),
                                        st>>>(p);
        }
        GDP_CHUNK_STAGE_MARK(3, st);
        if (num_chunks > 0 && p.H > 0) {
            err = cudaFuncSetAttribute(chunk_out_kernel<T, KP>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)out_smem());
            if (err != cudaSuccess)
                return err;
            chunk_out_kernel<T, KP><<<dim3((unsigned)num_chunks, (unsigned)p.H, (unsigned)(p.VP / VB)), 128,
                                      out_smem(), st>>>(p);
        }
        GDP_CHUNK_STAGE_MARK(4, st);
        return cudaGetLastError();
    }
};

template <typename T>
cudaError_t launch_stages(const ChunkParams &p, int64_t num_chunks, int64_t num_chunks_dp, cudaStream_t st) {
    switch (p.KP) {
    case 64: return Stages<T, 64>::launch(p, num_chunks, num_chunks_dp, st);
    case 128: return Stages<T, 128>::launch(p, num_chunks, num_chunks_dp, st);
    case 256: return Stages<T, 256>::launch(p, num_chunks, num_chunks_dp, st);
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
    err = a->q.dtype == GDP_DTYPE_BF16 ? launch_stages<__nv_bfloat16>(p, num_chunks, num_chunks_dp, stream)
                                       : launch_stages<__half>(p, num_chunks, num_chunks_dp, stream);
    if (err != cudaSuccess)
        return cuda_fail(op, "launching the chunk stages", err);
    if (T > 0) {
        zero_tail_kernel<<<(unsigned)T, 256, 0, stream>>>((uint16_t *)a->o.data, p.cu, p.N, H * V);
        err = cudaGetLastError();
        if (err != cudaSuccess)
            return cuda_fail(op, "launching the tail zero-fill", err);
    }
    GDP_CHUNK_STAGE_MARK(5, stream);
    return GDP_STATUS_SUCCESS;
}
