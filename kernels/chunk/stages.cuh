/*
 * stages.cuh: the host-side dispatch of the chunk op's templated stages: Stages<T, KP> gives
 * each stage's shared memory and launches WY, state sweep and outputs in order for one
 * (dtype, padded K), choosing the state sweep's pipeline depth; launch_stages<T> switches the
 * runtime padded K into those instances. The cumsums and the zero tail are enqueued by the
 * launcher (launch.cu) around it.
 */
#ifndef GDP_CHUNK_STAGES_CUH
#define GDP_CHUNK_STAGES_CUH

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "common.cuh"
#include "out.cuh"
#include "state.cuh"
#include "wy.cuh"

/* Developer hook: kernels/dev/chunk_stages.cu defines it to record an event after each stage. */
#ifndef GDP_CHUNK_STAGE_MARK
#define GDP_CHUNK_STAGE_MARK(stage, stream) ((void)0)
#endif

namespace {

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

} // namespace

#endif /* GDP_CHUNK_STAGES_CUH */
