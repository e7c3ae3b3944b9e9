/*
 * wgmma.cuh: Hopper warpgroup MMA (wgmma, sm_90a) for the one-pass chunk kernel to come
 * (kernels/NOTES-chunk.md, "The one-pass Hopper kernel"): 16-bit tiles in shared memory in the
 * 128-byte-swizzled panel layout that TMA's SWIZZLE_128B writes, their matrix descriptors for
 * K-major and MN-major operands, and the m64n64k16 and m64n128k16 bf16 -> fp32 products with
 * both operands in shared memory. Checked by kernels/dev/wgmma_check.cu against a double-precision product.
 *
 * The panel layout. A tile of R rows x C 16-bit columns (C a multiple of 64) is C / 64 panels of
 * R rows x 64 columns, each 1024-byte aligned, rows 128 bytes apart; inside a row the 16-byte
 * chunk j (columns 8j .. 8j + 7) sits at chunk j ^ (row % 8) (Swizzle<3,4,3> of the address). A
 * wgmma reads such a panel as
 *   - K-major (imm-trans 0): rows are M (or N) and columns K: start = the row block's first row,
 *     + 2 bytes a column of the k step inside the panel; SBO = 1024 (8 rows), LBO unused (1);
 *   - MN-major (imm-trans 1): rows are K and columns M (or N): start = the k step's first row;
 *     SBO = 1024 (8 K rows), LBO = the byte distance between the 64-column panels (used when the
 *     operand's M or N extent spans more than one panel).
 * (Descriptor bits: start >> 4 in 0-13, LBO >> 4 in 16-29, SBO >> 4 in 32-45, base offset 0 in
 * 49-51 for 1024-byte aligned panels, swizzle mode 1 = 128 B in 62-63.)
 */
#ifndef GDP_CHUNK_WGMMA_CUH
#define GDP_CHUNK_WGMMA_CUH

#include <stdint.h>

#include <type_traits>

#include "mma.cuh" /* smem_u32, the mbarrier and copy-engine helpers beside these */

namespace {

constexpr int WG_PANEL_COLS = 64;                    /* 16-bit columns a panel: 128 bytes a row */
constexpr int WG_ROW_BYTES = 128;

/* Byte offset of element (r, c) of a panel-layout tile of `rows` rows. */
__host__ __device__ constexpr uint32_t wg_offset(int rows, int r, int c) {
    return (uint32_t)(c / WG_PANEL_COLS) * (uint32_t)rows * WG_ROW_BYTES + (uint32_t)r * WG_ROW_BYTES +
           ((((uint32_t)(c % WG_PANEL_COLS) >> 3) ^ ((uint32_t)r & 7u)) << 4) + ((uint32_t)(c & 7) << 1);
}

/* The descriptor of a 128-byte-swizzled operand starting at byte address `start` (shared window). */
__device__ __forceinline__ uint64_t wg_desc(uint32_t start, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((start & 0x3FFFFu) >> 4) | ((uint64_t)((lbo & 0x3FFFFu) >> 4) << 16) |
           ((uint64_t)((sbo & 0x3FFFFu) >> 4) << 32) | (1ull << 62);
}
/* The descriptor of the operand that starts off bytes into tile (both 16-byte aligned). The start
 * field is the shared address over 16 in 14 bits, which holds the whole 228 KB window, so tile + off
 * is the tile's descriptor plus off / 16: the tile's is formed once and a k step adds a constant.
 * (Built from each step's address, the field's masks kept the compiler from folding it: the
 * descriptors were 9 % of the Hopper kernel's executed instructions, ncu, twenty-second session.) */
__device__ __forceinline__ uint64_t wg_desc_at(const void *tile, uint32_t off, uint32_t lbo, uint32_t sbo) {
    return wg_desc(smem_u32(tile), lbo, sbo) + (uint64_t)(off >> 4);
}
/* K-major operand: rows [r0, r0 + 64 (or the N extent)) of a tile of `rows` rows, the k step of 16
 * columns at column k0. */
__device__ __forceinline__ uint64_t wg_desc_kmajor(const void *tile, int rows, int r0, int k0) {
    const uint32_t off = (uint32_t)(k0 / WG_PANEL_COLS) * (uint32_t)rows * WG_ROW_BYTES + (uint32_t)r0 * WG_ROW_BYTES +
                         (uint32_t)(k0 % WG_PANEL_COLS) * 2u;
    return wg_desc_at(tile, off, 16, 1024);
}
/* MN-major operand: the k step of 16 rows at row k0 of a tile of `rows` rows, its M (or N) extent
 * from column c0 on, across panels `rows` x 128 bytes apart. c0 a multiple of 64, or of 8 inside a
 * panel for an extent that ends in it (the 32-column halves of a 64-column tile: the start moves by
 * 16-byte chunks within the row and the swizzle, a function of the address bits, still applies;
 * wgmma_check's offset case). */
__device__ __forceinline__ uint64_t wg_desc_mnmajor(const void *tile, int rows, int k0, int c0) {
    const uint32_t panel = (uint32_t)rows * WG_ROW_BYTES;
    const uint32_t off =
        (uint32_t)(c0 / WG_PANEL_COLS) * panel + (uint32_t)k0 * WG_ROW_BYTES + (uint32_t)(c0 % WG_PANEL_COLS) * 2u;
    return wg_desc_at(tile, off, panel, 1024);
}

/* A warpgroup's register budget from here on (setmaxnreg, sm_90a): dec gives registers back to
 * the block's pool, inc waits until the pool holds enough. N a multiple of 8 in [24, 256]; every
 * warp of the warpgroup executes it. */
template <int N> __device__ __forceinline__ void setmaxnreg_dec() {
    static_assert(N % 8 == 0 && N >= 24 && N <= 256, "setmaxnreg: a multiple of 8 in [24, 256]");
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N> __device__ __forceinline__ void setmaxnreg_inc() {
    static_assert(N % 8 == 0 && N >= 24 && N <= 256, "setmaxnreg: a multiple of 8 in [24, 256]");
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/* (Shared memory written by ordinary stores and read next by wgmma: fence_proxy_async_smem, mma.cuh,
 * in each writing thread before the barrier that publishes the writes.) */

/* Pins each accumulator's last register write before this point: without it NVVM may sink a write
 * (the output's row scaling before P v_new, a state decay) past wgmma.fence, and ptxas then injects a
 * warpgroup.arrive before the wgmma that reads the register (warning C7519), which waits for every
 * wgmma in flight. An empty asm that reads and writes each register cannot move across the fence's. */
template <int R> __device__ __forceinline__ void wg_fence_operands(float (&d)[R]) {
#pragma unroll
    for (int i = 0; i < R; i++)
        asm volatile("" : "+f"(d[i])::"memory");
}

/* The operand lists of the two product shapes (32 and 64 accumulators a thread), shared by the
 * bf16 and fp16 forms. */
#define GDP_WG_D32(d)                                                                                                  \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),      \
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),        \
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),       \
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define GDP_WG_D64(d)                                                                                                  \
    GDP_WG_D32(d), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]),         \
        "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]),       \
        "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]),       \
        "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),       \
        "+f"(d[63])
#define GDP_WG_R32                                                                                                     \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                                          \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define GDP_WG_R64                                                                                                     \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                                          \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "                                 \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "                                 \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"

#define GDP_WG_D16(d)                                                                                                  \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),      \
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
#define GDP_WG_R16 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"

/* D (+)= A B for a 64 x 32 x 16 step (d: n8 tile j in d[4j .. 4j + 3], j < 4): the Hopper chunk
 * kernel's scores, half the key columns a warpgroup. */
template <int TA, int TB, typename T = __nv_bfloat16>
__device__ __forceinline__ void wg_mma_m64n32k16(float (&d)[16], uint64_t da, uint64_t db, int accumulate) {
    if constexpr (std::is_same<T, __half>::value)
        asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %18, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 " GDP_WG_R16 ", %16, %17, p, 1, 1, %19, %20;\n}\n"
                     : GDP_WG_D16(d)
                     : "l"(da), "l"(db), "r"(accumulate), "n"(TA), "n"(TB));
    else
        asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %18, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 " GDP_WG_R16 ", %16, %17, p, 1, 1, %19, %20;\n}\n"
                     : GDP_WG_D16(d)
                     : "l"(da), "l"(db), "r"(accumulate), "n"(TA), "n"(TB));
}

/* D (+)= A B for a 64 x 64 x 16 step, 16-bit operands (T: bf16 or half) from shared memory, fp32
 * accumulators in the m16n8 order per warp (warp w rows 16 w + {g, g + 8}, n8 tile j in
 * d[4j .. 4j + 3]). TA / TB: 1 for MN-major A / B. accumulate 0: D = A B. */
template <int TA, int TB, typename T = __nv_bfloat16>
__device__ __forceinline__ void wg_mma_m64n64k16(float (&d)[32], uint64_t da, uint64_t db, int accumulate) {
    if constexpr (std::is_same<T, __half>::value)
        asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %34, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " GDP_WG_R32 ", %32, %33, p, 1, 1, %35, %36;\n}\n"
                     : GDP_WG_D32(d)
                     : "l"(da), "l"(db), "r"(accumulate), "n"(TA), "n"(TB));
    else
        asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %34, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " GDP_WG_R32 ", %32, %33, p, 1, 1, %35, %36;\n}\n"
                     : GDP_WG_D32(d)
                     : "l"(da), "l"(db), "r"(accumulate), "n"(TA), "n"(TB));
}

/* The same for a 64 x 128 x 16 step (d: n8 tile j in d[4j .. 4j + 3], j < 16): the state update's
 * shape (NOTES-chunk.md, "The one-pass Hopper kernel"). */
template <int TA, int TB, typename T = __nv_bfloat16>
__device__ __forceinline__ void wg_mma_m64n128k16(float (&d)[64], uint64_t da, uint64_t db, int accumulate) {
    if constexpr (std::is_same<T, __half>::value)
        asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %66, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " GDP_WG_R64 ", %64, %65, p, 1, 1, %67, %68;\n}\n"
                     : GDP_WG_D64(d)
                     : "l"(da), "l"(db), "r"(accumulate), "n"(TA), "n"(TB));
    else
        asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %66, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " GDP_WG_R64 ", %64, %65, p, 1, 1, %67, %68;\n}\n"
                     : GDP_WG_D64(d)
                     : "l"(da), "l"(db), "r"(accumulate), "n"(TA), "n"(TB));
}

/* D (+)= A B for a 64 x N x 16 step, N = 32, 64 or 128 (d: N / 2 accumulators a thread). */
template <int N, int TA, int TB, typename T>
__device__ __forceinline__ void wg_mma(float (&d)[N / 2], uint64_t da, uint64_t db, int accumulate) {
    static_assert(N == 32 || N == 64 || N == 128, "wgmma shapes held: 64 x {32, 64, 128} x 16");
    if constexpr (N == 32)
        wg_mma_m64n32k16<TA, TB, T>(d, da, db, accumulate);
    else if constexpr (N == 64)
        wg_mma_m64n64k16<TA, TB, T>(d, da, db, accumulate);
    else
        wg_mma_m64n128k16<TA, TB, T>(d, da, db, accumulate);
}

/* D (+)= the sum over KS k steps of A_ks B_ks (64 x N x 16 each; da(ks), db(ks) give the descriptors),
 * as one commit group: the caller waits (wg_wait) before it reads D. ZERO: D starts at 0, else the
 * product accumulates onto D's registers (fenced first, as every wgmma after register writes). */
template <int N, int TA, int TB, typename T, int KS, bool ZERO, typename DescA, typename DescB>
__device__ __forceinline__ void wg_gemm(float (&d)[N / 2], DescA da, DescB db) {
    if constexpr (ZERO)
#pragma unroll
        for (int i = 0; i < N / 2; i++)
            d[i] = 0.0f;
    wg_fence_operands(d);
    wg_fence();
#pragma unroll
    for (int ks = 0; ks < KS; ks++)
        wg_mma<N, TA, TB, T>(d, da(ks), db(ks), 1);
    wg_commit();
}

} // namespace

#endif /* GDP_CHUNK_WGMMA_CUH */
