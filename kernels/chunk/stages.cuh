/*
 * stages.cuh: the host-side dispatch of the chunk op's templated stages: Stages<T, KP> gives
 * each stage's shared memory and launches WY, state sweep and outputs in order for one
 * (dtype, padded K), choosing the state sweep's value-column block width and pipeline depth;
 * launch_stages<T> switches the runtime padded K into those instances. The cumsums and the
 * zero tail are enqueued by the launcher (launch.cu) around it.
 */
#ifndef GDP_CHUNK_STAGES_CUH
#define GDP_CHUNK_STAGES_CUH

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "common.cuh"
#include "fused.cuh"
#include "out.cuh"
#include "state.cuh"
#include "tensor_map.h"
#include "wy.cuh"

#include "src/internal.h" /* gdp_chunk_state_vb: the sweep's column block, shared with the auto choice */
#include "src/phase.h" /* GDP_CHUNK_MARK_* and GDP_CHUNK_STAGE_MARK, the profile's stage marks */

namespace {

/* The launcher's run-time choices for the staged chain (launch.cu reads them from the
 * environment): state_vb, the sweep's column block (64, 32, 16) or 0 to choose it here;
 * state_copy, who issues the sweep's copies (STATE_COPY_*, state.cuh); wy_tf32, WY's inverse
 * with its off-diagonal products on tf32 tensor cores (else all on CUDA cores in fp32). */
struct StageOptions {
    int state_vb;
    int state_copy;
    bool wy_tf32;
};

/* ---- the state sweep's tensor maps (STATE_COPY_TMA; tensor_map.h) ---- */
/* StateMaps (state.cuh) for one launch: w and the keys [T M][H KP] with boxes of 64 x (KP + PAD),
 * u [T M][H VP] with boxes of 64 x (VB + PAD): the stage tiles' padded rows, copied as they are. */
inline bool make_state_maps(const ChunkParams &p, int kp, int vb, StateMaps *m) {
    const int64_t rows = p.T * p.M;
    return encode_tile_map(m->w, p.w, rows, (int64_t)p.H * kp, kp + PAD, CHUNK) &&
           encode_tile_map(m->k, p.kn, rows, (int64_t)p.H * kp, kp + PAD, CHUNK) &&
           encode_tile_map(m->u, p.u, rows, (int64_t)p.H * p.VP, vb + PAD, CHUNK);
}

/* ---- dispatch of the templated stages over (dtype, padded K, pipeline depth, column block) ---- */
template <typename T, int KP> struct Stages {
    static size_t wy_smem(int vp) { return sizeof(WySmem<T, KP>) + (size_t)CHUNK * (vp + PAD) * sizeof(T); }
    static size_t out_smem() { return OutLayout<T, KP>::total; }

    template <int STAGES, int VB, int COPY> static cudaError_t launch_state(const ChunkParams &p, cudaStream_t st) {
        const size_t smem = sizeof(StateSmem<T, KP, STAGES, VB>);
        cudaError_t err = cudaFuncSetAttribute(chunk_state_kernel<T, KP, STAGES, VB, COPY>,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (err != cudaSuccess)
            return err;
        StateMaps maps{};
        if constexpr (COPY == STATE_COPY_TMA) {
            if (!make_state_maps(p, KP, VB, &maps)) /* a driver without the encoder: cp.async's producer */
                return launch_state<STAGES, VB, STATE_COPY_PRODUCER>(p, st);
        }
        chunk_state_kernel<T, KP, STAGES, VB, COPY><<<dim3((unsigned)(p.VP / VB), (unsigned)p.H, (unsigned)p.N),
                                                      KP * 2 + (COPY != STATE_COPY_WARPS ? 32 : 0), smem, st>>>(p, maps);
        return cudaSuccess;
    }
    template <int STAGES, int COPY> static cudaError_t launch_state_vb(const ChunkParams &p, int vb, cudaStream_t st) {
        switch (vb) {
        case 64: return launch_state<STAGES, 64, COPY>(p, st);
        case 32: return launch_state<STAGES, 32, COPY>(p, st);
        case 16: return launch_state<STAGES, 16, COPY>(p, st);
        default: return cudaErrorInvalidValue; /* the launcher passes only these three */
        }
    }
    template <int STAGES>
    static cudaError_t launch_state_copy(const ChunkParams &p, int vb, int copy, cudaStream_t st) {
        switch (copy) {
        case STATE_COPY_WARPS: return launch_state_vb<STAGES, STATE_COPY_WARPS>(p, vb, st);
        case STATE_COPY_PRODUCER: return launch_state_vb<STAGES, STATE_COPY_PRODUCER>(p, vb, st);
        case STATE_COPY_TMA: /* a box row holds at most 256 elements: K = 256 keeps cp.async */
            if constexpr (KP + PAD <= 256)
                return launch_state_vb<STAGES, STATE_COPY_TMA>(p, vb, st);
            else
                return launch_state_vb<STAGES, STATE_COPY_PRODUCER>(p, vb, st);
        default: return cudaErrorInvalidValue; /* the launcher passes only these three */
        }
    }

    template <bool TF32> static cudaError_t launch_wy(const ChunkParams &p, int64_t num_chunks_dp, cudaStream_t st) {
        const size_t smem = wy_smem(p.VP);
        cudaError_t err =
            cudaFuncSetAttribute(chunk_wy_kernel<T, KP, TF32>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (err != cudaSuccess)
            return err;
        chunk_wy_kernel<T, KP, TF32><<<dim3((unsigned)num_chunks_dp, (unsigned)p.H), 128, smem, st>>>(p);
        return cudaSuccess;
    }

    /* sms: multiprocessors of the device. With at most one state block per SM the deeper
     * pipeline costs no occupancy (K <= 128; K = 256 has room for two stages only). */
    static cudaError_t launch(const ChunkParams &p, int64_t num_chunks, int64_t num_chunks_dp, int sms,
                              const StageOptions &opt, cudaStream_t st) {
        cudaError_t err;
        if (num_chunks_dp > 0) {
            err = opt.wy_tf32 ? launch_wy<true>(p, num_chunks_dp, st) : launch_wy<false>(p, num_chunks_dp, st);
            if (err != cudaSuccess)
                return err;
        }
        GDP_CHUNK_STAGE_MARK(GDP_CHUNK_MARK_WY, st);
        if (p.N > 0) {
            const int vb = opt.state_vb != 0 ? opt.state_vb : gdp_chunk_state_vb(p.VP, p.H, p.N, sms);
            const int64_t blocks = (int64_t)(p.VP / vb) * p.H * p.N;
            if (KP <= 128 && blocks <= sms)
                err = launch_state_copy<KP <= 128 ? 4 : 2>(p, vb, opt.state_copy, st);
            else
                err = launch_state_copy<2>(p, vb, opt.state_copy, st);
            if (err != cudaSuccess)
                return err;
        }
        GDP_CHUNK_STAGE_MARK(GDP_CHUNK_MARK_STATE, st);
        if (num_chunks > 0) {
            err = cudaFuncSetAttribute(chunk_out_kernel<T, KP>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)out_smem());
            if (err != cudaSuccess)
                return err;
            chunk_out_kernel<T, KP><<<dim3((unsigned)num_chunks, (unsigned)p.H, (unsigned)((p.VP + OB - 1) / OB)),
                                      256, out_smem(), st>>>(p);
        }
        GDP_CHUNK_STAGE_MARK(GDP_CHUNK_MARK_OUT, st);
        return cudaGetLastError();
    }
};

template <typename T>
cudaError_t launch_stages(const ChunkParams &p, int64_t num_chunks, int64_t num_chunks_dp, int sms,
                          const StageOptions &opt, cudaStream_t st) {
    switch (p.KP) {
    case 64: return Stages<T, 64>::launch(p, num_chunks, num_chunks_dp, sms, opt, st);
    case 128: return Stages<T, 128>::launch(p, num_chunks, num_chunks_dp, sms, opt, st);
    case 256: return Stages<T, 256>::launch(p, num_chunks, num_chunks_dp, sms, opt, st);
    default: return cudaErrorInvalidValue; /* the workspace plan only produces the three above */
    }
}

} // namespace

#endif /* GDP_CHUNK_STAGES_CUH */
