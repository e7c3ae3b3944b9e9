/*
 * chain_timer.cuh: the developer tools' timing of one launch form (kernels/dev/gemv_floor.cu,
 * gemm_skinny.cu): a chain of launches over distinct copies of the weight, captured as one CUDA
 * graph, warmed up, replayed `replays` times; the median replay over the chain's length is the us a
 * launch, so a launch's boundary in a replayed graph is in it, as in the layer's graph. Header-only,
 * no library dependency; a failing runtime call prints and exits (dev_check.cuh's CK).
 */
#ifndef GDP_DEV_CHAIN_TIMER_CUH
#define GDP_DEV_CHAIN_TIMER_CUH

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cuda_runtime.h>

#include "dev_check.cuh"

/* launch(c, stream) issues the launch over copy c; us a launch, the median of `replays` replays. */
template <typename Launch> float chain_median_us(cudaStream_t s, int copies, int replays, Launch launch) {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    for (int c = 0; c < copies; c++)
        launch(c, s);
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    for (int w = 0; w < 3; w++)
        CK(cudaGraphLaunch(ge, s));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::vector<float> t;
    for (int rep = 0; rep < replays; rep++) {
        CK(cudaEventRecord(e0, s));
        CK(cudaGraphLaunch(ge, s));
        CK(cudaEventRecord(e1, s));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        t.push_back(ms * 1000.0f / copies);
    }
    std::sort(t.begin(), t.end());
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    return t[t.size() / 2];
}

#endif /* GDP_DEV_CHAIN_TIMER_CUH */
