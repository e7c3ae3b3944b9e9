/*
 * chain_timer.cuh: the developer tools' timing of one launch form (kernels/dev/gemv_floor.cu,
 * gemm_skinny.cu): a chain of launches over distinct copies of the weight, captured as one CUDA
 * graph, warmed up, replayed `replays` times; the median replay over the chain's length is the us a
 * launch, so a launch's boundary in a replayed graph is in it, as in the layer's graph. Header-only,
 * no library dependency; a failing runtime call prints and exits (these are tools, not the library).
 */
#ifndef GDP_DEV_CHAIN_TIMER_CUH
#define GDP_DEV_CHAIN_TIMER_CUH

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cuda_runtime.h>

inline void chain_check(cudaError_t e, const char *what) {
    if (e != cudaSuccess) {
        fprintf(stderr, "chain_timer: %s failed: %s\n", what, cudaGetErrorString(e));
        exit(1);
    }
}

/* launch(c, stream) issues the launch over copy c; us a launch, the median of `replays` replays. */
template <typename Launch> float chain_median_us(cudaStream_t s, int copies, int replays, Launch launch) {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    chain_check(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), "cudaStreamBeginCapture");
    for (int c = 0; c < copies; c++)
        launch(c, s);
    chain_check(cudaStreamEndCapture(s, &g), "cudaStreamEndCapture");
    chain_check(cudaGraphInstantiate(&ge, g, 0), "cudaGraphInstantiate");
    for (int w = 0; w < 3; w++)
        chain_check(cudaGraphLaunch(ge, s), "cudaGraphLaunch");
    cudaEvent_t e0, e1;
    chain_check(cudaEventCreate(&e0), "cudaEventCreate");
    chain_check(cudaEventCreate(&e1), "cudaEventCreate");
    std::vector<float> t;
    for (int rep = 0; rep < replays; rep++) {
        chain_check(cudaEventRecord(e0, s), "cudaEventRecord");
        chain_check(cudaGraphLaunch(ge, s), "cudaGraphLaunch");
        chain_check(cudaEventRecord(e1, s), "cudaEventRecord");
        chain_check(cudaEventSynchronize(e1), "cudaEventSynchronize");
        float ms;
        chain_check(cudaEventElapsedTime(&ms, e0, e1), "cudaEventElapsedTime");
        t.push_back(ms * 1000.0f / copies);
    }
    std::sort(t.begin(), t.end());
    chain_check(cudaEventDestroy(e0), "cudaEventDestroy");
    chain_check(cudaEventDestroy(e1), "cudaEventDestroy");
    chain_check(cudaGraphExecDestroy(ge), "cudaGraphExecDestroy");
    chain_check(cudaGraphDestroy(g), "cudaGraphDestroy");
    return t[t.size() / 2];
}

#endif /* GDP_DEV_CHAIN_TIMER_CUH */
