/*
 * mbarrier.cuh: the block's synchronization primitives beyond __syncthreads: named barriers,
 * mbarriers (sm_80 arrive and wait, sm_90 transaction counts) and the copy engine's bulk copy
 * that completes on one. Shared by the chunk op's roles (chunk/mma.cuh and its stages) and the
 * decode op's ring kernel (recurrent_ring.cuh).
 */
#ifndef GDP_MBARRIER_CUH
#define GDP_MBARRIER_CUH

#include <stdint.h>

namespace {

/* The 32-bit shared-window address of a shared-memory pointer (what the shared-state spaces of
 * PTX take). */
__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* ---- named barriers (the roles of a block that sync apart from the rest) ---- */
__device__ __forceinline__ void bar_sync(int id, int count) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void bar_arrive(int id, int count) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
/* ---- mbarriers: a stage's FULL and EMPTY signals between a block's roles (the chunk op's fused
 * kernel and state sweep, the decode op's ring kernel) ---- */
__device__ __forceinline__ void mbar_init(uint64_t *bar, int count) {
    asm volatile("mbarrier.init.shared.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t *bar) {
    asm volatile("mbarrier.arrive.shared.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}
/* true once the phase of the given parity has completed (acquire: the arrivers' reads are done) */
__device__ __forceinline__ bool mbar_test(uint64_t *bar, int parity) {
    uint32_t ok;
    asm volatile("{\n .reg .pred p;\n mbarrier.test_wait.parity.shared.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(ok)
                 : "r"(smem_u32(bar)), "r"(parity)
                 : "memory");
    return ok != 0;
}

/* Blocks until the phase of the given parity has completed. try_wait suspends the thread in
 * hardware until the phase completes or a time limit passes, where a test_wait loop issues an
 * instruction every few cycles: on the state sweep of one long sequence (1 x 16384) the waiting
 * warps' test_wait loop was 27 % of the kernel's executed instructions, issue slots taken from
 * the warps on the same scheduler (ncu, kernels/NOTES-chunk.md, twentieth session). */
__device__ __forceinline__ void mbar_wait(uint64_t *bar, int parity) {
    uint32_t done;
    do {
        asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(smem_u32(bar)), "r"(parity)
                     : "memory");
    } while (!done);
}
/* Makes this thread's mbarrier initializations visible to the copy engine (the async proxy), before
 * the block barrier after which copies may complete on them. */
__device__ __forceinline__ void fence_mbar_init() {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}

/* This thread's arrival, announcing tx_bytes more to come from the copy engine (tma_load_2d): the
 * phase completes once every arrival is in and those bytes have landed. */
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t *bar, uint32_t tx_bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
    __trap(); /* sm_90 and later only (as tma_load_2d) */
#else
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(tx_bytes)
                 : "memory");
#endif
}

/* Orders this thread's earlier shared-memory accesses (the generic proxy) before later accesses by
 * the async proxy to the same bytes: wgmma reading what the thread stored, or the copy engine
 * refilling a stage the thread wrote. Run by each such thread before the barrier or release. */
__device__ __forceinline__ void fence_proxy_async_smem() {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900 /* before sm_90 there is no async proxy to order against */
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

/* One contiguous copy by the copy engine (sm_90 cp.async.bulk): bytes (a multiple of 16) from
 * global src to shared dst (both 16-byte aligned), counted against bar's announced bytes
 * (mbar_arrive_expect_tx). The shared::cluster window takes the block's own shared address in
 * a launch without clusters. */
__device__ __forceinline__ void bulk_copy_g2s(void *dst, const void *src, uint32_t bytes, uint64_t *bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
    __trap(); /* no copy engine before sm_90: the launchers never take this path there */
#else
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                     smem_u32(dst)),
                 "l"(src), "r"(bytes), "r"(smem_u32(bar))
                 : "memory");
#endif
}

} // namespace

#endif /* GDP_MBARRIER_CUH */
