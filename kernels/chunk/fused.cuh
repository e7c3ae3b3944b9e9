/*
 * fused.cuh: chunk_fused_kernel, the chunk op in one pass (GDP_CHUNK_PATH=fused): one block
 * per (sequence, head, 64 value columns) walks the sequence's expanded chunks in order with the
 * fp32 state in registers, and nothing but the inputs, o and the states touches device memory
 * (the staged path moves keys, w, u, v_new and the chunk-entry states through the workspace:
 * about 1.9 GB on 8 x 2048, H 16, K = V = 128, M 2, against 0.4 GB here).
 *
 * Per expanded chunk c (64 rows of the expanded stream, rows t*M + m), with S the fp32 state
 * entering it and S16 its 16-bit copy (gdp-math.md 3, written without w and u):
 *   Gk     chunk-local cumsum of g (copy 0 of each token carries it), base 2, by a warp scan
 *   K, Q   L2-normalized in fp32 and rounded (if asked); Q holds the tokens whose LAST copy
 *          lies in this chunk (at most 64 of them)
 *   A      beta_r 2^(Gk_r - Gk_s) <k_r, k_s> for s < r, in fp32; X = (I + A)^-1 in place
 *   X'     V - 2^Gk (K S16), rounded (= (w S - u) / (X diag beta) of the staged path, so
 *   v_new  = bf16(X diag(beta)) X'   w and u are never formed; FlashQLA's form)
 *   o_t    scale (2^Gk[r_t] q_t S16 + sum_{r <= r_t} 2^(Gk[r_t] - Gk[r]) <q_t, k_r> v_new_r),
 *          r_t the row of token t's last copy: exact for any M, since the chunk's rows before
 *          r_t are all of t's predecessors inside the chunk and S holds the rest
 *   S      2^gl S + K^T (2^(gl - Gk) v_new), gl = Gk of the chunk's last row
 * The value columns of S evolve independently, so blocks of 64 columns share nothing but the
 * recomputed A, X and scores. Chunk states (fp32, entering each token chunk = expanded chunk
 * c with c % M == 0), the final state or the cache slot are written as the staged sweep does.
 *
 * Work split: 8 warps. A: warps 0-3, rows 16w; X': warps 4-7, rows 16(w-4), all 64 columns;
 * the 64 x 64 triangular inverse as in the WY stage (16 x 16 diagonal blocks by forward
 * substitution, then block rows), in place over A; v_new and o: warp w owns rows 16(w % 4)
 * and columns 32(w / 4); the state: rows 16(w % (KP/16)), columns 64 / (8 / (KP/16)) each.
 * Shared memory about 109 KB at K = 128, so two blocks share an SM and hide each other's
 * barriers and loads; the next chunk's tiles are prefetched into L2 one chunk ahead.
 * Deterministic: fixed-order sums everywhere, no atomics.
 */
#ifndef GDP_CHUNK_FUSED_CUH
#define GDP_CHUNK_FUSED_CUH

#include <stdint.h>

#include "common.cuh"
#include "mma.cuh"
#include "tile.cuh"

namespace {

// CUDA kernels

constexpr int FUSED_THREADS = 256;
constexpr int FUSED_VB = 64; /* value columns per block */

template <typename T, int KP> struct FusedSmem {
    T k[CHUNK][KP + PAD];          /* keys of the chunk (normalized)                   */
    T q[CHUNK][KP + PAD];          /* queries of the tokens ending in the chunk        */
    T s[KP][FUSED_VB + PAD];       /* S16: the state entering the chunk, 16-bit        */
    T v[CHUNK][FUSED_VB + PAD];    /* V, then X' = V - 2^Gk (K S16)                    */
    T vn[CHUNK][FUSED_VB + PAD];   /* v_new                                            */
    T vd[CHUNK][FUSED_VB + PAD];   /* 2^(gl - Gk) v_new, the state update's operand    */
    T ai[CHUNK][CHUNK + PAD];      /* (I + A)^-1 diag(beta), 16-bit                     */
    float a[CHUNK][CHUNK + 4];     /* A, then (I + A)^-1 in place                       */
    float tmp[16][3 * 16 + 4];     /* one block row of sum_q A_rq X_qc                  */
    float gk[CHUNK];               /* g per row (copy 0 of a token), then Gk           */
    float gam[CHUNK];              /* 2^Gk                                             */
    float beta[CHUNK];
};

/* The rows of chunk c of a sequence: n expanded rows from local row lo; the nq tokens from tf
 * whose last copy lies in them. */
struct FusedChunk {
    int64_t lo;
    int n, tf, nq;
};
__device__ __forceinline__ FusedChunk fused_chunk(int c, int64_t len, int M) {
    FusedChunk ch;
    ch.lo = (int64_t)c * CHUNK;
    const int64_t len_dp = len * M;
    ch.n = (int)min((int64_t)CHUNK, len_dp - ch.lo);
    ch.tf = (int)(ch.lo / M);
    const int64_t tl = min(len - 1, (ch.lo + ch.n - M) / M);
    ch.nq = (int)(tl - ch.tf + 1);
    return ch;
}

/* Brings [ptr, ptr + bytes) into L2 without holding registers. */
__device__ __forceinline__ void fused_prefetch_l2(const void *ptr, int bytes) {
    const uintptr_t first = reinterpret_cast<uintptr_t>(ptr) & ~(uintptr_t)127;
    const uintptr_t last = reinterpret_cast<uintptr_t>(ptr) + (uintptr_t)bytes - 1;
    for (uintptr_t a = first; a <= last; a += 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(a));
}

template <typename T, int KP>
__global__ void __launch_bounds__(FUSED_THREADS, 2) chunk_fused_kernel(const ChunkParams p) {
    constexpr int NTH = FUSED_THREADS, NW = NTH / 32, VB = FUSED_VB;
    constexpr int RT = KP / 16;     /* state row tiles: 4 (K 64) or 8 (K 128)    */
    constexpr int CGW = NW / RT;    /* warps per state row tile: 2 or 1          */
    constexpr int SCOLS = VB / CGW; /* state columns per warp: 32 or 64          */
    constexpr int SNT = SCOLS / 8;  /* n8 tiles of state per warp: 4 or 8        */
    static_assert(RT * CGW == NW && SNT % 2 == 0, "state split");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    FusedSmem<T, KP> &s = *reinterpret_cast<FusedSmem<T, KP> *>(smem_raw);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t4 = lane & 3;
    const int vb = blockIdx.x, hd = blockIdx.y, i = blockIdx.z, H = p.H, M = p.M;
    const int64_t bos = p.cu[i];
    const int64_t len = (int64_t)p.cu[i + 1] - bos;
    const int nchunks = (int)((len * M + CHUNK - 1) / CHUNK);
    const int64_t coff = p.coff[i];
    const int vcol0 = vb * VB, vcols = min(VB, p.V - vcol0);
    const int sr0 = (warp % RT) * 16, sc0 = (warp / RT) * SCOLS;

    /* state in registers: S[nt] covers rows sr0 + {g, g+8}, block columns sc0 + 8 nt + 2 t4 + {0, 1} */
    float S[SNT][4];
#pragma unroll
    for (int nt = 0; nt < SNT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int r = sr0 + g + (e >> 1) * 8, c = vcol0 + sc0 + nt * 8 + 2 * t4 + (e & 1);
            float x = 0.0f;
            if (p.h0 != nullptr && r < p.K && c < p.V)
                x = load_any(p.h0, p.h0_dtype, (((int64_t)i * H + hd) * p.K + r) * p.V + c);
            S[nt][e] = x;
        }
    auto put_state16 = [&]() {
#pragma unroll
        for (int nt = 0; nt < SNT; nt++)
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                const int r = sr0 + g + hh * 8, c = sc0 + nt * 8 + 2 * t4;
                *reinterpret_cast<uint32_t *>(&s.s[r][c]) = Elem<T>::pack(S[nt][2 * hh], S[nt][2 * hh + 1]);
            }
    };
    const int64_t ld_k = (int64_t)H * p.K, ld_v = (int64_t)H * p.V;
    /* Starts the copies of chunk c's keys, values and queries (one group); g and beta by plain loads. */
    auto issue = [&](int c) {
        const FusedChunk ch = fused_chunk(c, len, M);
        const int64_t rowc = bos * M + ch.lo;
        const T *ksrc = static_cast<const T *>(p.k) + (rowc * H + hd) * p.K;
        const T *vsrc = static_cast<const T *>(p.v) + (rowc * H + hd) * p.V + vcol0;
        const T *qsrc = static_cast<const T *>(p.q) + ((bos + ch.tf) * H + hd) * p.K;
        if (p.k_vec)
            tile_async<T, NTH>(&s.k[0][0], KP + PAD, ksrc, ld_k, ch.n, KP, p.K, tid);
        else
            tile_scalar<T, NTH>(&s.k[0][0], KP + PAD, ksrc, ld_k, ch.n, KP, p.K, tid);
        if (p.v_vec)
            tile_async<T, NTH>(&s.v[0][0], VB + PAD, vsrc, ld_v, ch.n, VB, vcols, tid);
        else
            tile_scalar<T, NTH>(&s.v[0][0], VB + PAD, vsrc, ld_v, ch.n, VB, vcols, tid);
        if (p.q_vec)
            tile_async<T, NTH>(&s.q[0][0], KP + PAD, qsrc, ld_k, ch.nq, KP, p.K, tid);
        else
            tile_scalar<T, NTH>(&s.q[0][0], KP + PAD, qsrc, ld_k, ch.nq, KP, p.K, tid);
        cp_async_commit();
        if (tid < CHUNK) {
            float gr = 0.0f, b = 0.0f;
            if (tid < ch.n) {
                const int64_t lr = ch.lo + tid;
                if (p.g_raw != nullptr && lr % M == 0)
                    gr = p.g_raw[(bos + lr / M) * H + hd];
                b = load_any(p.beta, p.beta_dtype, (rowc + tid) * H + hd);
            }
            s.gk[tid] = gr;
            s.beta[tid] = b;
        }
    };
    /* Chunk c's rows into L2 (one row or row piece per thread), for the copies a chunk later. */
    auto prefetch = [&](int c) {
        const FusedChunk ch = fused_chunk(c, len, M);
        const int64_t rowc = bos * M + ch.lo;
        const size_t es = sizeof(T);
        if (tid < ch.n) {
            fused_prefetch_l2(static_cast<const T *>(p.k) + ((rowc + tid) * H + hd) * p.K, (int)(p.K * es));
        } else if (tid >= 64 && tid - 64 < ch.n) {
            fused_prefetch_l2(static_cast<const T *>(p.v) + ((rowc + tid - 64) * H + hd) * p.V + vcol0,
                              (int)(vcols * es));
        } else if (tid >= 128 && tid - 128 < ch.nq) {
            fused_prefetch_l2(static_cast<const T *>(p.q) + ((bos + ch.tf + tid - 128) * H + hd) * p.K,
                              (int)(p.K * es));
        }
    };

    put_state16();
    if (nchunks > 0)
        issue(0);
    for (int c = 0; c < nchunks; c++) {
        const FusedChunk ch = fused_chunk(c, len, M);
        const int n = ch.n, nq = ch.nq;
        /* the fp32 state entering token chunk c / M */
        if (c % M == 0 && p.chunk_states != nullptr) {
            const int64_t hrow = coff + c / M;
            if (hrow < p.cs_rows) {
#pragma unroll
                for (int nt = 0; nt < SNT; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int r = sr0 + g + (e >> 1) * 8, cc = vcol0 + sc0 + nt * 8 + 2 * t4 + (e & 1);
                        if (r < p.K && cc < p.V)
                            store_any(p.chunk_states, p.cs_dtype, ((hrow * H + hd) * p.K + r) * p.V + cc, S[nt][e]);
                    }
            }
        }
        cp_async_wait<0>();
        __syncthreads(); /* (1) K, V, Q, g, beta and S16 in shared memory */
        if (c + 1 < nchunks)
            prefetch(c + 1);

        /* Gk: a warp scan over the 64 rows (two per lane), base 2 as the cumsum kernel */
        if (warp == 0) {
            const float a0 = s.gk[2 * lane], a1 = s.gk[2 * lane + 1];
            float x = a0 + a1;
#pragma unroll
            for (int d = 1; d < 32; d <<= 1) {
                const float y = __shfl_up_sync(0xffffffffu, x, d);
                if (lane >= d)
                    x += y;
            }
            float ex = __shfl_up_sync(0xffffffffu, x, 1);
            if (lane == 0)
                ex = 0.0f;
            const float g0 = (ex + a0) * GDP_RCP_LN2, g1 = ((ex + a0) + a1) * GDP_RCP_LN2;
            s.gk[2 * lane] = g0;
            s.gk[2 * lane + 1] = g1;
            s.gam[2 * lane] = exp2f(g0);
            s.gam[2 * lane + 1] = exp2f(g1);
        }
        if (p.l2norm) {
            l2norm_rows<T, KP, NW>(&s.k[0][0], KP + PAD, n, warp, lane);
            l2norm_rows<T, KP, NW>(&s.q[0][0], KP + PAD, nq, warp, lane);
        }
        __syncthreads(); /* (2) */

        if (warp < 4) {
            /* A[r][s] = beta_r 2^(Gk_r - Gk_s) <k_r, k_s> for s < r < n, else 0 (every column written) */
            const int r0 = warp * 16;
            float acc[8][4];
#pragma unroll
            for (int nt = 0; nt < 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    acc[nt][e] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < KP; kk += 16) {
                uint32_t a[4];
                frag_a(a, &s.k[0][0], KP + PAD, r0, kk, lane);
#pragma unroll
                for (int pp = 0; pp < 4; pp++) {
                    if (pp <= warp) {
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
                    const int r = r0 + g + (e >> 1) * 8, cc = nt * 8 + 2 * t4 + (e & 1);
                    float val = 0.0f;
                    if (cc < r && r < n) /* exponent <= 0 here: no overflow */
                        val = acc[nt][e] * exp2f(s.gk[r] - s.gk[cc]) * s.beta[r];
                    s.a[r][cc] = val;
                }
        } else {
            /* X' = V - 2^Gk (K S16), rows 16 (warp - 4), all 64 columns, in place over V */
            const int r0 = (warp - 4) * 16;
            float acc[8][4];
#pragma unroll
            for (int nt = 0; nt < 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    acc[nt][e] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < KP; kk += 16) {
                uint32_t a[4];
                frag_a(a, &s.k[0][0], KP + PAD, r0, kk, lane);
#pragma unroll
                for (int pp = 0; pp < 4; pp++) {
                    uint32_t b[4];
                    frag_b_kn(b, &s.s[0][0], VB + PAD, kk, pp * 16, lane);
                    Elem<T>::mma(acc[2 * pp], a, b[0], b[1]);
                    Elem<T>::mma(acc[2 * pp + 1], a, b[2], b[3]);
                }
            }
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                const int r = r0 + g + hh * 8;
                const float f = s.gam[r];
#pragma unroll
                for (int nt = 0; nt < 8; nt++) {
                    T *vp = &s.v[r][nt * 8 + 2 * t4];
                    const float x0 = Elem<T>::to_f(vp[0]) - f * acc[nt][2 * hh];
                    const float x1 = Elem<T>::to_f(vp[1]) - f * acc[nt][2 * hh + 1];
                    *reinterpret_cast<uint32_t *>(vp) = Elem<T>::pack(x0, x1);
                }
            }
        }
        __syncthreads(); /* (3) A and X' complete */

        /* (I + A)^-1 in place: diagonal 16 x 16 blocks by forward substitution, one thread a column
         * (the 16 threads of a block are in one warp: a warp barrier before the in-place write) */
        if (tid < 64) {
            const int b = tid >> 4, cc = tid & 15, base = b * 16;
            float x[16];
#pragma unroll
            for (int r = 0; r < 16; r++) {
                float v = (r == cc) ? 1.0f : 0.0f;
#pragma unroll
                for (int q = 0; q < 16; q++)
                    if (q < r)
                        v -= s.a[base + r][base + q] * x[q];
                x[r] = v;
            }
            __syncwarp();
#pragma unroll
            for (int r = 0; r < 16; r++)
                s.a[base + r][base + cc] = x[r];
        }
        __syncthreads();
        /* block rows: X_rc = -X_rr sum_{c <= q < r} A_rq X_qc. Row block rb's blocks left of the
         * diagonal still hold A when its sums are formed (all of them before any is overwritten),
         * the rows above already hold X. */
#pragma unroll
        for (int rb = 1; rb < 4; rb++) {
            const int rp = tid & 7, cq = tid >> 3, cb = cq >> 2, col = cq * 4;
            const bool active = tid < 32 * rb;
            if (active) {
                float acc[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
                for (int jb = cb; jb < rb; jb++) {
#pragma unroll
                    for (int q = 0; q < 16; q++) {
                        const float4 xv = *reinterpret_cast<const float4 *>(&s.a[jb * 16 + q][col]);
                        const float a0 = s.a[rb * 16 + 2 * rp][jb * 16 + q];
                        const float a1 = s.a[rb * 16 + 2 * rp + 1][jb * 16 + q];
                        acc[0][0] += a0 * xv.x; acc[0][1] += a0 * xv.y; acc[0][2] += a0 * xv.z; acc[0][3] += a0 * xv.w;
                        acc[1][0] += a1 * xv.x; acc[1][1] += a1 * xv.y; acc[1][2] += a1 * xv.z; acc[1][3] += a1 * xv.w;
                    }
                }
                *reinterpret_cast<float4 *>(&s.tmp[2 * rp][col]) = make_float4(acc[0][0], acc[0][1], acc[0][2], acc[0][3]);
                *reinterpret_cast<float4 *>(&s.tmp[2 * rp + 1][col]) =
                    make_float4(acc[1][0], acc[1][1], acc[1][2], acc[1][3]);
            }
            __syncthreads();
            if (active) {
                float acc[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
                for (int q = 0; q < 16; q++) {
                    const float4 tv = *reinterpret_cast<const float4 *>(&s.tmp[q][col]);
                    const float d0 = s.a[rb * 16 + 2 * rp][rb * 16 + q], d1 = s.a[rb * 16 + 2 * rp + 1][rb * 16 + q];
                    acc[0][0] += d0 * tv.x; acc[0][1] += d0 * tv.y; acc[0][2] += d0 * tv.z; acc[0][3] += d0 * tv.w;
                    acc[1][0] += d1 * tv.x; acc[1][1] += d1 * tv.y; acc[1][2] += d1 * tv.z; acc[1][3] += d1 * tv.w;
                }
                *reinterpret_cast<float4 *>(&s.a[rb * 16 + 2 * rp][col]) =
                    make_float4(-acc[0][0], -acc[0][1], -acc[0][2], -acc[0][3]);
                *reinterpret_cast<float4 *>(&s.a[rb * 16 + 2 * rp + 1][col]) =
                    make_float4(-acc[1][0], -acc[1][1], -acc[1][2], -acc[1][3]);
            }
            __syncthreads();
        }
        /* X diag(beta), rounded once */
        for (int e = tid; e < CHUNK * CHUNK / 4; e += NTH) {
            const int r = e >> 4, cc = (e & 15) * 4;
            const float4 xv = *reinterpret_cast<const float4 *>(&s.a[r][cc]);
            *reinterpret_cast<uint2 *>(&s.ai[r][cc]) =
                make_uint2(Elem<T>::pack(xv.x * s.beta[cc], xv.y * s.beta[cc + 1]),
                           Elem<T>::pack(xv.z * s.beta[cc + 2], xv.w * s.beta[cc + 3]));
        }
        __syncthreads(); /* (4) */

        const int rg = warp & 3, r0 = rg * 16, c0 = (warp >> 2) * 32;
        const float gl = s.gk[n - 1];
        {
            /* v_new = (X diag beta) X' over this warp's 16 x 32 piece; the triangle ends at its rows */
            float acc[4][4];
#pragma unroll
            for (int nt = 0; nt < 4; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    acc[nt][e] = 0.0f;
#pragma unroll
            for (int ks = 0; ks < 4; ks++) {
                if (ks <= rg) {
                    uint32_t a[4];
                    frag_a(a, &s.ai[0][0], CHUNK + PAD, r0, ks * 16, lane);
#pragma unroll
                    for (int pp = 0; pp < 2; pp++) {
                        uint32_t b[4];
                        frag_b_kn(b, &s.v[0][0], VB + PAD, ks * 16, c0 + pp * 16, lane);
                        Elem<T>::mma(acc[2 * pp], a, b[0], b[1]);
                        Elem<T>::mma(acc[2 * pp + 1], a, b[2], b[3]);
                    }
                }
            }
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                const int r = r0 + g + hh * 8;
                const float f = r < n ? exp2f(gl - s.gk[r]) : 0.0f;
#pragma unroll
                for (int nt = 0; nt < 4; nt++) {
                    const int cc = c0 + nt * 8 + 2 * t4;
                    const float v0 = acc[nt][2 * hh], v1 = acc[nt][2 * hh + 1];
                    *reinterpret_cast<uint32_t *>(&s.vn[r][cc]) = Elem<T>::pack(v0, v1);
                    *reinterpret_cast<uint32_t *>(&s.vd[r][cc]) = Elem<T>::pack(v0 * f, v1 * f);
                }
            }
        }
        __syncthreads(); /* (5) v_new and its decayed copy complete */

        /* outputs of the tokens ending in this chunk: query rows r0 + {g, g+8}, columns c0.. */
        if (r0 < nq) {
            const int qa = r0 + g, qb = r0 + g + 8;
            const int ra = qa < nq ? (int)((int64_t)(ch.tf + qa) * M + M - 1 - ch.lo) : -1;
            const int rb_ = qb < nq ? (int)((int64_t)(ch.tf + qb) * M + M - 1 - ch.lo) : -1;
            const int qlast = min(r0 + 15, nq - 1);
            const int rmax = (int)((int64_t)(ch.tf + qlast) * M + M - 1 - ch.lo); /* the warp's last row */
            float acc[4][4];
#pragma unroll
            for (int nt = 0; nt < 4; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    acc[nt][e] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < KP; kk += 16) { /* Q S16 */
                uint32_t a[4];
                frag_a(a, &s.q[0][0], KP + PAD, r0, kk, lane);
#pragma unroll
                for (int pp = 0; pp < 2; pp++) {
                    uint32_t b[4];
                    frag_b_kn(b, &s.s[0][0], VB + PAD, kk, c0 + pp * 16, lane);
                    Elem<T>::mma(acc[2 * pp], a, b[0], b[1]);
                    Elem<T>::mma(acc[2 * pp + 1], a, b[2], b[3]);
                }
            }
            const float ga = ra >= 0 ? s.gk[ra] : 0.0f, gb = rb_ >= 0 ? s.gk[rb_] : 0.0f;
            const float fa = ra >= 0 ? s.gam[ra] : 0.0f, fb = rb_ >= 0 ? s.gam[rb_] : 0.0f;
#pragma unroll
            for (int nt = 0; nt < 4; nt++) {
                acc[nt][0] *= fa;
                acc[nt][1] *= fa;
                acc[nt][2] *= fb;
                acc[nt][3] *= fb;
            }
            /* per 16 key rows: scores, token-causal mask and decay ratio rounded to T, times v_new */
#pragma unroll
            for (int ks = 0; ks < 4; ks++) {
                if (ks * 16 <= rmax) {
                    float sc[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
                    for (int kk = 0; kk < KP; kk += 16) {
                        uint32_t a[4], bk[4];
                        frag_a(a, &s.q[0][0], KP + PAD, r0, kk, lane);
                        frag_b_nk(bk, &s.k[0][0], KP + PAD, kk, ks * 16, lane);
                        Elem<T>::mma(sc[0], a, bk[0], bk[1]);
                        Elem<T>::mma(sc[1], a, bk[2], bk[3]);
                    }
                    uint32_t pa[4];
#pragma unroll
                    for (int h2 = 0; h2 < 2; h2++) {
                        float pv[4];
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            const int row = (e >> 1) ? rb_ : ra, sig = ks * 16 + h2 * 8 + 2 * t4 + (e & 1);
                            const float gt = (e >> 1) ? gb : ga;
                            pv[e] = sig <= row ? sc[h2][e] * exp2f(gt - s.gk[sig]) : 0.0f;
                        }
                        pa[h2 * 2 + 0] = Elem<T>::pack(pv[0], pv[1]);
                        pa[h2 * 2 + 1] = Elem<T>::pack(pv[2], pv[3]);
                    }
#pragma unroll
                    for (int pp = 0; pp < 2; pp++) {
                        uint32_t bv[4];
                        frag_b_kn(bv, &s.vn[0][0], VB + PAD, ks * 16, c0 + pp * 16, lane);
                        Elem<T>::mma(acc[2 * pp], pa, bv[0], bv[1]);
                        Elem<T>::mma(acc[2 * pp + 1], pa, bv[2], bv[3]);
                    }
                }
            }
            T *o = static_cast<T *>(p.o) + ((bos + ch.tf) * H + hd) * p.V + vcol0;
#pragma unroll
            for (int nt = 0; nt < 4; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int qi = r0 + g + (e >> 1) * 8, cc = c0 + nt * 8 + 2 * t4 + (e & 1);
                    if (qi < nq && cc < vcols)
                        o[(int64_t)qi * H * p.V + cc] = Elem<T>::from_f(acc[nt][e] * p.scale);
                }
        }

        /* S = 2^gl S + K^T (decayed v_new) */
        const float dec = exp2f(gl);
#pragma unroll
        for (int nt = 0; nt < SNT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                S[nt][e] *= dec;
#pragma unroll
        for (int ks = 0; ks < 4; ks++) {
            if (ks * 16 < n) { /* rows past the chunk's end are zero */
                uint32_t a[4];
                frag_a_trans(a, &s.k[0][0], KP + PAD, sr0, ks * 16, lane);
#pragma unroll
                for (int pp = 0; pp < SNT / 2; pp++) {
                    uint32_t bb[4];
                    frag_b_kn(bb, &s.vd[0][0], VB + PAD, ks * 16, sc0 + pp * 16, lane);
                    Elem<T>::mma(S[2 * pp], a, bb[0], bb[1]);
                    Elem<T>::mma(S[2 * pp + 1], a, bb[2], bb[3]);
                }
            }
        }
        __syncthreads(); /* (6) every read of this chunk's tiles and of S16 done */
        put_state16();
        if (c + 1 < nchunks)
            issue(c + 1);
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
        for (int nt = 0; nt < SNT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = sr0 + g + (e >> 1) * 8, c = vcol0 + sc0 + nt * 8 + 2 * t4 + (e & 1);
                if (r < p.K && c < p.V)
                    store_any(dst, dtype, base + (int64_t)r * p.V + c, S[nt][e]);
            }
    }
}

/* The fused path takes 16-bit inputs with K <= 128 and V <= 128 (padded K 64 or 128; V in blocks
 * of 64); anything else runs the staged kernels. */
inline bool fused_fits(const ChunkParams &p) { return (p.KP == 64 || p.KP == 128) && p.VP <= 128; }

template <typename T, int KP> cudaError_t launch_fused_kp(const ChunkParams &p, cudaStream_t st) {
    const size_t smem = sizeof(FusedSmem<T, KP>);
    cudaError_t err =
        cudaFuncSetAttribute(chunk_fused_kernel<T, KP>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (err != cudaSuccess)
        return err;
    if (p.N > 0)
        chunk_fused_kernel<T, KP><<<dim3((unsigned)(p.VP / FUSED_VB), (unsigned)p.H, (unsigned)p.N), FUSED_THREADS,
                                    smem, st>>>(p);
    return cudaGetLastError();
}

template <typename T> cudaError_t launch_fused(const ChunkParams &p, cudaStream_t st) {
    return p.KP == 64 ? launch_fused_kp<T, 64>(p, st) : launch_fused_kp<T, 128>(p, st);
}

} // namespace

#endif /* GDP_CHUNK_FUSED_CUH */
