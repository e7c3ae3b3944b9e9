/*
 * mma.cuh: the warp-level tensor-core and copy primitives the chunk op's stages share:
 * Elem<T> (16-bit conversions and the matching mma.sync m16n8k16), ldmatrix loads, cp.async
 * copies and the m16n8k16 fragment loaders. These are the sm_80 instructions the current
 * stages also run on Hopper; kept apart so each stage header reads as its algorithm only.
 */
#ifndef GDP_CHUNK_MMA_CUH
#define GDP_CHUNK_MMA_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "../mbarrier.cuh" /* smem_u32, named barriers, mbarriers, fences */

namespace {

/* ---- 16-bit element traits: conversions and the matching mma instruction ---- */
template <typename T> struct Elem;

template <> struct Elem<__nv_bfloat16> {
    static __device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
    static __device__ __forceinline__ __nv_bfloat16 from_f(float x) { return __float2bfloat16_rn(x); }
    static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
        __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
        return *reinterpret_cast<uint32_t *>(&v);
    }
    /* the two elements of a 32-bit word (the low one first), as to_f gives them: one shared load a pair */
    static __device__ __forceinline__ void unpack(uint32_t w, float &lo, float &hi) {
        lo = __uint_as_float(w << 16);
        hi = __uint_as_float(w & 0xffff0000u);
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
    static __device__ __forceinline__ void unpack(uint32_t w, float &lo, float &hi) {
        const float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&w));
        lo = f.x;
        hi = f.y;
    }
    static __device__ __forceinline__ void mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                     "{%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

/* ---- shared-memory matrix loads and async copies ---- */

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
/* Two 8x8 16-bit matrices, transposed; lanes 0-15 give the row addresses (lanes 16-31 are ignored). */
__device__ __forceinline__ void ldsm_x2_t(uint32_t r[2], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(smem_u32(p))
                 : "memory");
}
/* Two 8x8 16-bit matrices; lanes 0-15 give the row addresses (lanes 16-31 are ignored). */
__device__ __forceinline__ void ldsm_x2(uint32_t r[2], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
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

template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

/* 4-byte copy; valid == false writes zeros and reads nothing. */
__device__ __forceinline__ void cp_async4z(void *dst, const void *src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_u32(dst)), "l"(src), "r"(valid ? 4 : 0)
                 : "memory");
}

/* The one-pass kernels' aux threads (fused.cuh, hopper.cuh): chunk c + 1's loads go into the other
 * stage once the state side has released it (its EMPTY mbarrier, arrived on for chunk c - 1; chunk
 * 0 and 1 find their stages free). try_issue tests without blocking, or waits (block), and runs
 * issue() once the stage is free, at most once a chunk. Each thread issues its own copies when it
 * sees the stage free (the next chunk's wait and barrier gather them), so the threads need not
 * agree on the moment. */
struct NextChunkLoads {
    uint64_t *empty; /* the other stage's EMPTY mbarrier */
    int c;           /* the chunk being worked on: chunks 0 and 1 find their stages free */
    int parity;      /* the phase of chunk c - 1's release: the other stage's ((c - 1) / 2)-th use */
    bool pending;    /* a chunk c + 1 exists and its loads are not issued yet */
    __device__ __forceinline__ NextChunkLoads(uint64_t *empty_other, int chunk, int nchunks)
        : empty(empty_other), c(chunk), parity(((chunk - 1) >> 1) & 1), pending(chunk + 1 < nchunks) {}
    template <typename Issue> __device__ __forceinline__ void try_issue(bool block, Issue issue) {
        if (!pending)
            return;
        if (c >= 1) {
            if (!block && !mbar_test(empty, parity))
                return;
            mbar_wait(empty, parity);
        }
        issue();
        pending = false;
    }
};

/* One tile by the copy engine (sm_90 TMA): the box of the 2-D tensor map `map` (a __grid_constant__
 * kernel parameter) at column x, row y, written densely to dst (128-byte aligned, 1024 with the
 * 128-byte swizzle); elements outside the map's extent land as zeros. The bytes count against
 * bar's announced bytes. The state sweep's producer (GDP_CHUNK_STATE_COPY=tma) and wgmma_check. */
__device__ __forceinline__ void tma_load_2d(void *dst, const void *map, int x, int y, uint64_t *bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
    __trap(); /* no copy engine before sm_90: the launchers never take this path there */
#else
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
                 "[%4];\n" ::"r"(smem_u32(dst)),
                 "l"(map), "r"(x), "r"(y), "r"(smem_u32(bar))
                 : "memory");
#endif
}
/* The mbarrier's arrival of this thread once all its earlier cp.async copies have landed (counted
 * against the barrier's expected arrivals: .noinc). */
__device__ __forceinline__ void cp_async_mbar_arrive(uint64_t *bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared.b64 [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}

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
/* B fragment of the single n8 tile [n0, n0+8) x k [k0, k0+16), B row-major [k][n]: lanes 0-15
 * address the same rows as frag_b_kn's matrices 0 and 1, so b[0], b[1] are bit for bit what
 * frag_b_kn returns in b[0], b[1] for a tile starting at n0 (used where a warp owns one n8 tile). */
template <typename T>
__device__ __forceinline__ void frag_b_kn_x1(uint32_t b[2], const T *s, int ld, int k0, int n0, int lane) {
    ldsm_x2_t(b, s + (k0 + ((lane >> 3) & 1) * 8 + (lane & 7)) * ld + n0);
}
/* The same for B stored row-major [n][k] (B = S^T, as in Q K^T). */
template <typename T>
__device__ __forceinline__ void frag_b_nk(uint32_t b[4], const T *s, int ld, int k0, int n0, int lane) {
    ldsm_x4(b, s + (n0 + (lane >> 4) * 8 + (lane & 7)) * ld + k0 + ((lane >> 3) & 1) * 8);
}

/* The B fragment of the single n8 tile [n0, n0+8) x k [k0, k0+16) for B row-major [n][k]:
 * lanes 0-15 address the rows frag_b_nk's matrices 0 and 1 would for a pair starting at n0, so
 * b[0], b[1] are bit for bit that pair's b[0], b[1] (or, for a pair starting at n0 - 8, its
 * b[2], b[3]). */
template <typename T>
__device__ __forceinline__ void frag_b_nk_x1(uint32_t b[2], const T *s, int ld, int k0, int n0, int lane) {
    ldsm_x2(b, s + (n0 + (lane & 7)) * ld + k0 + ((lane >> 3) & 1) * 8);
}

/* ---- warp-level tile products (16 rows of A a warp; the k dimension walked in order, so every
 * user sums in the same order as the loops these replace) ---- */
template <int NT> __device__ __forceinline__ void zero_tiles(float (&acc)[NT][4]) {
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            acc[nt][e] = 0.0f;
}

/* acc += A[r0 : r0 + 16, 0 : KP] B[0 : KP, c0 : c0 + 8 NT]; A row-major, B row-major [k][n]. */
template <typename T, int KP, int NT>
__device__ __forceinline__ void mma_rows_kn(float (&acc)[NT][4], const T *a, int lda, int r0, const T *b, int ldb,
                                            int c0, int lane) {
    static_assert(NT % 2 == 0, "pairs of n8 tiles");
#pragma unroll
    for (int kk = 0; kk < KP; kk += 16) {
        uint32_t af[4];
        frag_a(af, a, lda, r0, kk, lane);
#pragma unroll
        for (int pp = 0; pp < NT / 2; pp++) {
            uint32_t bf[4];
            frag_b_kn(bf, b, ldb, kk, c0 + pp * 16, lane);
            Elem<T>::mma(acc[2 * pp], af, bf[0], bf[1]);
            Elem<T>::mma(acc[2 * pp + 1], af, bf[2], bf[3]);
        }
    }
}

/* acc += A[r0 : r0 + 16, 0 : KP] B^T over the 8 NT columns of B rows from 16 pp0 (B row-major
 * [n][k], as keys in Q K^T; NT = 8: all 64 rows from pp0 = 0): column pairs past pmax, right of a
 * causal diagonal, are skipped. */
template <typename T, int KP, int NT>
__device__ __forceinline__ void mma_rows_nk(float (&acc)[NT][4], const T *a, int lda, int r0, const T *b, int ldb,
                                            int pp0, int pmax, int lane) {
    static_assert(NT % 2 == 0, "pairs of n8 tiles");
#pragma unroll
    for (int kk = 0; kk < KP; kk += 16) {
        uint32_t af[4];
        frag_a(af, a, lda, r0, kk, lane);
#pragma unroll
        for (int pp = 0; pp < NT / 2; pp++) {
            if (pp0 + pp <= pmax) {
                uint32_t bf[4];
                frag_b_nk(bf, b, ldb, kk, (pp0 + pp) * 16, lane);
                Elem<T>::mma(acc[2 * pp], af, bf[0], bf[1]);
                Elem<T>::mma(acc[2 * pp + 1], af, bf[2], bf[3]);
            }
        }
    }
}

/* acc += A[r0 : r0 + 16, 0 : 64] B[0 : 64, c0 : c0 + 8 NT] for a lower-triangular 64-column A:
 * only the k slabs starting at or before kmax (the last row any output row needs). */
template <typename T, int NT>
__device__ __forceinline__ void mma_rows_tri(float (&acc)[NT][4], const T *a, int lda, int r0, int kmax, const T *b,
                                             int ldb, int c0, int lane) {
    static_assert(NT % 2 == 0, "pairs of n8 tiles");
#pragma unroll
    for (int ks = 0; ks < 4; ks++) {
        if (ks * 16 <= kmax) {
            uint32_t af[4];
            frag_a(af, a, lda, r0, ks * 16, lane);
#pragma unroll
            for (int pp = 0; pp < NT / 2; pp++) {
                uint32_t bf[4];
                frag_b_kn(bf, b, ldb, ks * 16, c0 + pp * 16, lane);
                Elem<T>::mma(acc[2 * pp], af, bf[0], bf[1]);
                Elem<T>::mma(acc[2 * pp + 1], af, bf[2], bf[3]);
            }
        }
    }
}

/* The state update over a chunk: S[m0 : m0 + 16, c0 : c0 + 8 NT] = dec S + K^T D over the chunk's
 * rows [0, n) (K row-major [row][k], D row-major [row][n], D already decayed to the chunk's end);
 * 16-row slabs past n are zero and skipped. */
template <typename T, int NT>
__device__ __forceinline__ void state_decay_update(float (&S)[NT][4], float dec, const T *k, int ldk, int m0, int n,
                                                   const T *d, int ldd, int c0, int lane) {
    static_assert(NT % 2 == 0, "pairs of n8 tiles");
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            S[nt][e] *= dec;
#pragma unroll
    for (int ks = 0; ks < 4; ks++) {
        if (ks * 16 < n) {
            uint32_t af[4];
            frag_a_trans(af, k, ldk, m0, ks * 16, lane);
#pragma unroll
            for (int pp = 0; pp < NT / 2; pp++) {
                uint32_t bf[4];
                frag_b_kn(bf, d, ldd, ks * 16, c0 + pp * 16, lane);
                Elem<T>::mma(S[2 * pp], af, bf[0], bf[1]);
                Elem<T>::mma(S[2 * pp + 1], af, bf[2], bf[3]);
            }
        }
    }
}

} // namespace

#endif /* GDP_CHUNK_MMA_CUH */
