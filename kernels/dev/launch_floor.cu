/*
 * launch_floor.cu: what a kernel boundary costs on this GPU, against a grid-wide barrier inside one
 * persistent kernel: the measurement under the decision between a decode layer of five launches and
 * one persistent kernel with barriers between its phases (kernels/NOTES-ops.md, thirty-third session).
 * A developer tool with no library dependency:
 *   nvcc -O3 -arch=sm_90 -o launch_floor kernels/dev/launch_floor.cu && ./launch_floor
 * Each case is captured as one CUDA graph and replayed (as gdp-run replays its step), timed by events
 * over REPLAYS replays after a warm-up, for a grid of every SM's resident blocks of 256 threads:
 *   - one empty kernel;
 *   - a chain of K empty kernels (K launches in a row, the stream's order between them);
 *   - the same chain with programmatic dependent launch (each kernel starts while the one before
 *     drains, and waits for it with griddepcontrol.wait);
 *   - one kernel with K grid barriers (a counter and a generation word in global memory; a
 *     cooperative launch, so every block is resident);
 *   - the same K phases where each block also reads its share of BYTES (16-byte loads), between the
 *     barriers or as K kernels, so the barrier's cost shows beside real memory traffic.
 * Prints one line a case: us a replay and, past the first phase, us a phase (without reads: a
 * boundary alone, a kernel's launch, ramp and drain or a grid barrier).
 */
#include <cstdio>
#include <cstdlib>

#include <cuda_runtime.h>

#include "dev_check.cuh"


constexpr int THREADS = 256, K = 10, REPLAYS = 200;
constexpr size_t BYTES = 8u << 20; /* read per phase by the whole grid: about a layer's out_proj weight */

struct Args {
    const uint4 *src; /* BYTES of data to read, or NULL */
    uint4 *sink;      /* one value a block, so the reads are not dropped */
    unsigned *count, *gen;
    int phases;
};

__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

/* A block's share of one phase's reads (grid-strided 16-byte loads), folded into one value. */
__device__ __forceinline__ void read_share(const Args &a, int phase) {
    if (a.src == nullptr)
        return;
    const size_t n = BYTES / sizeof(uint4), stride = (size_t)gridDim.x * blockDim.x;
    uint4 acc = make_uint4(0, 0, 0, 0);
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const uint4 v = __ldcg(a.src + i);
        acc.x ^= v.x, acc.y ^= v.y, acc.z ^= v.z, acc.w ^= v.w;
    }
    if ((acc.x ^ acc.y ^ acc.z ^ acc.w) == 0x9e3779b9u + (unsigned)phase) /* never, but not provably */
        a.sink[blockIdx.x] = acc;
}

/* Every block of the grid arrives, the last one opens the next generation; acquire/release through
 * __threadfence around a volatile spin. */
__device__ __forceinline__ void grid_barrier(unsigned *count, unsigned *gen) {
    __syncthreads();
    if (threadIdx.x == 0) {
        volatile unsigned *vgen = gen;
        const unsigned g = *vgen;
        __threadfence();
        if (atomicAdd(count, 1u) == gridDim.x - 1) {
            *count = 0;
            __threadfence();
            atomicAdd(gen, 1u);
        } else {
            while (*vgen == g)
                __nanosleep(32);
        }
        __threadfence();
    }
    __syncthreads();
}

__global__ void __launch_bounds__(THREADS) phase_kernel(Args a) { read_share(a, 0); }

__global__ void __launch_bounds__(THREADS) phase_kernel_pdl(Args a) {
    pdl_trigger(); /* the next kernel may be scheduled now; it waits for this one itself */
    pdl_wait();
    read_share(a, 0);
}

__global__ void __launch_bounds__(THREADS) barrier_kernel(Args a) {
    for (int p = 0; p < a.phases; p++) {
        read_share(a, p);
        grid_barrier(a.count, a.gen);
    }
}

enum Case { ONE, CHAIN, CHAIN_PDL, BARRIERS };

/* Whether the barrier kernel is launched cooperatively (cleared, with a note, if a graph cannot hold a
 * cooperative launch here: the grid is the device's resident blocks and nothing else runs, so every
 * block is resident anyway). */
static bool g_cooperative = true;

static void enqueue(Case c, const Args &a, int grid, cudaStream_t s) {
    if (c == ONE) {
        phase_kernel<<<grid, THREADS, 0, s>>>(a);
    } else if (c == CHAIN) {
        for (int k = 0; k < K; k++)
            phase_kernel<<<grid, THREADS, 0, s>>>(a);
    } else if (c == CHAIN_PDL) {
        for (int k = 0; k < K; k++) {
            cudaLaunchConfig_t cfg = {};
            cudaLaunchAttribute attr[1];
            attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
            attr[0].val.programmaticStreamSerializationAllowed = 1;
            cfg.gridDim = dim3(grid), cfg.blockDim = dim3(THREADS), cfg.stream = s, cfg.attrs = attr, cfg.numAttrs = 1;
            CK(cudaLaunchKernelEx(&cfg, phase_kernel_pdl, a));
        }
    } else {
        Args b = a;
        b.phases = K;
        cudaLaunchConfig_t cfg = {};
        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeCooperative;
        attr[0].val.cooperative = 1;
        cfg.gridDim = dim3(grid), cfg.blockDim = dim3(THREADS), cfg.stream = s, cfg.attrs = attr;
        cfg.numAttrs = g_cooperative ? 1 : 0;
        CK(cudaLaunchKernelEx(&cfg, barrier_kernel, b));
    }
    CK(cudaGetLastError());
}

/* us a replay of the case captured as one graph */
static double time_case(Case c, const Args &a, int grid, cudaStream_t s) {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    if (c == BARRIERS && g_cooperative) { /* can a graph hold the cooperative launch? */
        CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        cudaLaunchConfig_t cfg = {};
        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeCooperative;
        attr[0].val.cooperative = 1;
        cfg.gridDim = dim3(grid), cfg.blockDim = dim3(THREADS), cfg.stream = s, cfg.attrs = attr, cfg.numAttrs = 1;
        Args b = a;
        b.phases = K;
        const cudaError_t le = cudaLaunchKernelEx(&cfg, barrier_kernel, b);
        const cudaError_t ee = cudaStreamEndCapture(s, &g);
        cudaError_t ie = cudaErrorUnknown;
        if (le == cudaSuccess && ee == cudaSuccess)
            ie = cudaGraphInstantiate(&ge, g, 0);
        if (ie != cudaSuccess) {
            printf("# a graph here does not hold a cooperative launch (%s): the barrier kernel runs as a plain launch "
                   "of resident blocks\n", cudaGetErrorString(le != cudaSuccess ? le : ee != cudaSuccess ? ee : ie));
            (void)cudaGetLastError();
            g_cooperative = false;
        } else {
            CK(cudaGraphExecDestroy(ge));
        }
        if (ee == cudaSuccess)
            CK(cudaGraphDestroy(g));
    }
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    enqueue(c, a, grid, s);
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    for (int i = 0; i < 20; i++)
        CK(cudaGraphLaunch(ge, s));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaEventRecord(e0, s));
    for (int i = 0; i < REPLAYS; i++)
        CK(cudaGraphLaunch(ge, s));
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    return ms * 1e3 / REPLAYS;
}

int main() {
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    int per_sm = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, barrier_kernel, THREADS, 0));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    uint4 *src, *sink;
    unsigned *sync;
    CK(cudaMalloc(&src, BYTES));
    CK(cudaMemset(src, 1, BYTES));
    CK(cudaMalloc(&sync, 2 * sizeof(unsigned)));
    CK(cudaMemset(sync, 0, 2 * sizeof(unsigned)));
    printf("# launch_floor: %s, %d SMs, %d resident blocks of %d threads an SM; K = %d, %d replays a case\n",
           prop.name, prop.multiProcessorCount, per_sm, THREADS, K, REPLAYS);
    printf("# %-34s %6s %12s %18s\n", "case", "grid", "us a replay", "us a phase past 1");
    static const char *const names[4] = {"one kernel", "chain of K kernels", "chain of K kernels, PDL",
                                         "one kernel, K grid barriers"};
    for (int per = 1; per <= per_sm && per <= 2; per++) {
        const int grid = prop.multiProcessorCount * per;
        CK(cudaMalloc(&sink, (size_t)grid * sizeof(uint4)));
        for (int reads = 0; reads < 2; reads++) {
            const Args a = {reads ? src : nullptr, sink, sync, sync + 1, 1};
            const double one = time_case(ONE, a, grid, s);
            for (int c = ONE; c <= BARRIERS; c++) {
                const double t = c == ONE ? one : time_case((Case)c, a, grid, s);
                /* (the case - one phase alone) / (K - 1): a phase and its boundary (a kernel's launch, ramp
                 * and drain, or a grid barrier); without reads, the boundary alone */
                const double per_phase = c == ONE ? 0.0 : (t - one) / (K - 1);
                printf("  %-34s %6d %12.2f %18.2f%s\n", names[c], grid, t, per_phase,
                       reads ? "   (each phase reads 8 MB)" : "");
            }
        }
        CK(cudaFree(sink));
    }
    CK(cudaFree(src));
    CK(cudaFree(sync));
    CK(cudaStreamDestroy(s));
    return 0;
}
