/*
 * gemv_floor.cu: how fast a one-to-four-row bf16 GEMV can stream the decode layer's projection
 * weights on this GPU, against a plain read of the same bytes: the measurement under issue 11's
 * B = 1 layer step, where ncu puts cuBLASLt's in_proj (7728 x 2048, 31.7 MB) at 14.7 us and the
 * gated norm with out_proj (2048 x 2048, 8.4 MB) at 11.8 us on the H100 (thirty-fourth session),
 * against 9.5 and 2.5 us of bytes at the copy rate. A developer tool that links nothing of the
 * library (it includes its GEMV product's helpers):
 *   nvcc -O3 -arch=sm_90 -Iinclude -Ikernels -o gemv_floor kernels/dev/gemv_floor.cu && ./gemv_floor [l2]
 * Each case is a chain of launches over distinct copies of the weight (together over three times the
 * L2, so no launch finds its weight in L2, as in a layer step whose weights exceed it), captured as
 * one CUDA graph and replayed; us a launch = a replay's median time / the chain's length, so a
 * launch's boundary (about 1 us in a replayed graph: launch_floor.cu) is in every figure, as in the
 * layer's graph. Cases, per shape and row count:
 *   - read: every block streams its share of the weight (16-byte loads, four in flight a thread):
 *     the floor a kernel of this size reaches;
 *   - warp u4: a warp a column, four 16-byte chunks a lane in flight, then the next four, A read a
 *     chunk at a time behind `if (r < rows)`: gemv_sums' source form (two trips at k = 2048), though
 *     ptxas schedules it differently here (it sinks the weight's loads too; in the library, with
 *     its `idx < k` guards, it issues them together: kernels/NOTES-ops.md, thirty-fourth session);
 *   - u4 / u8 A-reg, A-smem: four or eight chunks a trip with A's chunks loaded beside the weight's
 *     (clamped rows, no branch) or staged in shared memory by the block first; u4 / u8 fence: A-reg
 *     with every sum made to depend on a word of every load of the trip (x & 0 with a run-time 0), so
 *     that ptxas cannot sink the loads between the multiplies (it does, to save registers: SASS);
 *     u4 / u8 smem fence: A staged in shared memory, the fence over the weight's loads only;
 *   - ksplit2 / ksplit4: 2 or 4 warps a column, each a contiguous part of k in one trip, the partial
 *     sums added in a fixed order through shared memory (more warps, more bytes in flight early);
 *   - w2 u4 (A-reg): a warp two columns, four chunks each in flight (the library's CPW = 2 form);
 *   - bulk: a warp a column moved whole into shared memory by the copy engine (one cp.async.bulk
 *     on the warp's mbarrier), A staged in shared memory, no load held in registers.
 * With the argument `l2` every launch of the chain reads the same copy instead, so after the first
 * the weight is an L2 hit (31.7 + 8.4 MB fit the L2 of an H100 or H200): what a launch would cost if
 * its weight had been sent to L2 ahead of it (e.g. under the layer step's latency-bound kernels).
 * Every GEMV's C is checked against a host product of the same bf16 values (relative error < 1e-2).
 */
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "chunk/mma.cuh" /* mbarriers */
#include "gemv_math.cuh"
#include "dev/chain_timer.cuh"
#include "dev/dev_check.cuh"


typedef __nv_bfloat16 bf16;
constexpr int WARPS = GEMV_WARPS, REPLAYS = 30;

/* load_stream, dot8 and warp_sum: the library's own (gemv_math.cuh, norm_math.cuh), so every form here
 * streams and sums as gemv_sums does */
struct Args {
    int rows, n, k;
    const bf16 *A; /* [rows, k] */
    const bf16 *B; /* [n, k] */
    bf16 *C;       /* [rows, n] */
    uint4 *sink;
    uint32_t zero; /* 0 at run time, unknown to the compiler: the fence's mask */
};

/* the plain read of B's bytes: grid-strided, four 16-byte loads in flight a thread */
__global__ void __launch_bounds__(256) read_kernel(const Args a) {
    const size_t n16 = (size_t)a.n * a.k / 8, stride = (size_t)gridDim.x * blockDim.x;
    const uint4 *src = reinterpret_cast<const uint4 *>(a.B);
    uint32_t acc = 0;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n16; i += 4 * stride) {
        uint4 v[4];
#pragma unroll
        for (int u = 0; u < 4; u++)
            v[u] = load_stream(src + i + u * stride);
#pragma unroll
        for (int u = 0; u < 4; u++)
            acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    for (; i < n16; i += stride) {
        const uint4 v = load_stream(src + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9e3779b9u) /* never, but not provably */
        a.sink[blockIdx.x] = make_uint4(acc, 0, 0, 0);
}

/* A warp CPW columns, U chunks of 8 elements a lane per trip (k a multiple of 256). AM: how A is
 * read: 0 as the library's gemv_sums (a 16-byte __ldg a row a chunk, inside `if (r < rows)`, which
 * ptxas turns into one dependent L2 trip a chunk after the weight's loads: the SASS shows it), 1 every
 * row's chunks of the trip loaded with the weight's (a clamped row, no branch), 2 the block's A staged
 * in shared memory first. */
template <int R, int CPW, int U, int AM> __global__ void __launch_bounds__(WARPS * 32) warp_kernel(const Args a) {
    extern __shared__ uint4 a_smem[];
    const int lane = threadIdx.x & 31;
    const int64_t col0 = ((int64_t)blockIdx.x * WARPS + (threadIdx.x >> 5)) * CPW;
    if (AM == 2 || AM == 4) {
        const int n16 = a.rows * a.k / 8;
        for (int i = threadIdx.x; i < n16; i += blockDim.x)
            a_smem[i] = __ldg(reinterpret_cast<const uint4 *>(a.A) + i);
        __syncthreads();
    }
    if (col0 >= a.n)
        return;
    float acc[R][CPW] = {};
    const bf16 *brow[CPW];
#pragma unroll
    for (int c = 0; c < CPW; c++)
        brow[c] = a.B + (col0 + c < a.n ? col0 + c : col0) * (int64_t)a.k;
    for (int base = 0; base < a.k; base += 256 * U) {
        uint4 bv[CPW][U];
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int c = 0; c < CPW; c++)
                bv[c][u] = load_stream(brow[c] + base + u * 256 + lane * 8);
        if (AM == 1 || AM == 3) {
            uint4 av[R][U];
#pragma unroll
            for (int u = 0; u < U; u++)
#pragma unroll
                for (int r = 0; r < R; r++)
                    av[r][u] = __ldg(reinterpret_cast<const uint4 *>(a.A + (r < a.rows ? r : 0) * a.k + base + u * 256 +
                                                                      lane * 8));
            if (AM == 3) { /* the fence: every sum starts from a word of every load, so ptxas cannot put a
                            * multiply before any load (it sinks them to save registers otherwise) */
                uint32_t dep = 0;
#pragma unroll
                for (int u = 0; u < U; u++) {
#pragma unroll
                    for (int c = 0; c < CPW; c++)
                        dep ^= bv[c][u].x;
#pragma unroll
                    for (int r = 0; r < R; r++)
                        dep ^= av[r][u].x;
                }
                const float z = __uint_as_float(dep & a.zero);
#pragma unroll
                for (int r = 0; r < R; r++)
#pragma unroll
                    for (int c = 0; c < CPW; c++)
                        acc[r][c] += z;
            }
#pragma unroll
            for (int u = 0; u < U; u++)
#pragma unroll
                for (int r = 0; r < R; r++)
#pragma unroll
                    for (int c = 0; c < CPW; c++)
                        acc[r][c] = dot8<bf16>(acc[r][c], av[r][u], bv[c][u]);
            continue;
        }
        if (AM == 4) { /* the fence over the weight's loads only (A from shared memory) */
            uint32_t dep = 0;
#pragma unroll
            for (int u = 0; u < U; u++)
#pragma unroll
                for (int c = 0; c < CPW; c++)
                    dep ^= bv[c][u].x;
#pragma unroll
            for (int r = 0; r < R; r++)
#pragma unroll
                for (int c = 0; c < CPW; c++)
                    acc[r][c] = __uint_as_float(__float_as_uint(acc[r][c]) | (dep & a.zero));
        }
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int r = 0; r < R; r++) {
                if (r < a.rows) {
                    const int at = r * a.k + base + u * 256 + lane * 8;
                    const uint4 av = AM >= 2 ? a_smem[at / 8] : __ldg(reinterpret_cast<const uint4 *>(a.A + at));
#pragma unroll
                    for (int c = 0; c < CPW; c++)
                        acc[r][c] = dot8<bf16>(acc[r][c], av, bv[c][u]);
                }
            }
    }
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int c = 0; c < CPW; c++) {
            const float v = warp_sum(acc[r][c]);
            if (lane == 0 && r < a.rows && col0 + c < a.n)
                a.C[r * a.n + col0 + c] = __float2bfloat16_rn(v);
        }
}

/* S warps a column, warp s summing k's part [s k / S, (s + 1) k / S) in one trip (k / S / 256
 * chunks a lane, at most 8), the parts added in order s = 0 .. S-1 through shared memory. */
template <int R, int S> __global__ void __launch_bounds__(WARPS * 32) ksplit_kernel(const Args a) {
    constexpr int COLS = WARPS / S, UMAX = 8;
    __shared__ float part[WARPS][R];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, s = warp % S;
    const int64_t col = (int64_t)blockIdx.x * COLS + warp / S;
    const int span = a.k / S, chunks = span / 256;
    float acc[R] = {};
    if (col < a.n) {
        const bf16 *b = a.B + col * (int64_t)a.k + s * span;
        uint4 bv[UMAX];
#pragma unroll
        for (int u = 0; u < UMAX; u++)
            if (u < chunks)
                bv[u] = load_stream(b + u * 256 + lane * 8);
#pragma unroll
        for (int u = 0; u < UMAX; u++)
            if (u < chunks)
#pragma unroll
                for (int r = 0; r < R; r++)
                    if (r < a.rows) {
                        const uint4 av =
                            __ldg(reinterpret_cast<const uint4 *>(a.A + r * a.k + s * span + u * 256 + lane * 8));
                        acc[r] = dot8<bf16>(acc[r], av, bv[u]);
                    }
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
        const float v = warp_sum(acc[r]);
        if (lane == 0)
            part[warp][r] = v;
    }
    __syncthreads();
    if (s == 0 && lane < R && lane < a.rows && col < a.n) {
        float v = 0.0f;
#pragma unroll
        for (int t = 0; t < S; t++)
            v += part[warp + t][lane];
        a.C[lane * a.n + col] = __float2bfloat16_rn(v);
    }
}

/* A warp a column by the copy engine: lane 0 moves the whole column (k elements, one
 * cp.async.bulk) into the warp's shared buffer, counted on the warp's mbarrier, while the block
 * stages A in shared memory; then the lanes multiply from shared memory in gemv_sums' order (chunk
 * lane * 8 + 256 i). No register holds a load in flight, so occupancy is set by shared memory. */
__device__ __forceinline__ void bulk_copy(void *dst, const void *src, uint32_t bytes, uint64_t *bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                     smem_u32(dst)),
                 "l"(src), "r"(bytes), "r"(smem_u32(bar))
                 : "memory");
}
template <int R> __global__ void __launch_bounds__(WARPS * 32) bulk_kernel(const Args a) {
    extern __shared__ __align__(128) unsigned char bulk_smem[];
    uint64_t *bar = reinterpret_cast<uint64_t *>(bulk_smem);
    bf16 *As = reinterpret_cast<bf16 *>(bulk_smem + 128);
    bf16 *Bs = As + ((a.rows * a.k + 63) / 64) * 64;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t col = (int64_t)blockIdx.x * WARPS + warp;
    if (threadIdx.x < WARPS)
        mbar_init(&bar[threadIdx.x], 1);
    fence_mbar_init();
    __syncthreads();
    if (lane == 0 && col < a.n) {
        mbar_arrive_expect_tx(&bar[warp], (uint32_t)a.k * 2u);
        bulk_copy(Bs + warp * a.k, a.B + col * a.k, (uint32_t)a.k * 2u, &bar[warp]);
    }
    const int n16 = a.rows * a.k / 8;
    for (int i = threadIdx.x; i < n16; i += blockDim.x)
        reinterpret_cast<uint4 *>(As)[i] = __ldg(reinterpret_cast<const uint4 *>(a.A) + i);
    __syncthreads();
    if (col >= a.n)
        return;
    mbar_wait(&bar[warp], 0);
    float acc[R] = {};
    for (int idx = lane * 8; idx < a.k; idx += 256) {
        const uint4 b = *reinterpret_cast<const uint4 *>(Bs + warp * a.k + idx);
#pragma unroll
        for (int r = 0; r < R; r++)
            if (r < a.rows)
                acc[r] = dot8<bf16>(acc[r], *reinterpret_cast<const uint4 *>(As + r * a.k + idx), b);
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
        const float v = warp_sum(acc[r]);
        if (lane == 0 && r < a.rows)
            a.C[r * a.n + col] = __float2bfloat16_rn(v);
    }
}

struct Case {
    const char *name;
    void (*launch)(const Args &, cudaStream_t, int sms);
    bool checks;
};

template <int R> void launch_read(const Args &a, cudaStream_t s, int sms) { read_kernel<<<sms * 8, 256, 0, s>>>(a); }
template <int R, int CPW, int U, int AM> void launch_warp(const Args &a, cudaStream_t s, int) {
    const int64_t warps = (a.n + CPW - 1) / CPW;
    const size_t smem = AM == 2 || AM == 4 ? (size_t)a.rows * a.k * sizeof(bf16) : 0;
    warp_kernel<R, CPW, U, AM><<<(unsigned)((warps + WARPS - 1) / WARPS), WARPS * 32, smem, s>>>(a);
}
template <int R, int S> void launch_ksplit(const Args &a, cudaStream_t s, int) {
    constexpr int COLS = WARPS / S;
    ksplit_kernel<R, S><<<(unsigned)((a.n + COLS - 1) / COLS), WARPS * 32, 0, s>>>(a);
}

template <int R> void launch_bulk(const Args &a, cudaStream_t s, int) {
    const size_t smem = 128 + (size_t)((a.rows * a.k + 63) / 64) * 64 * sizeof(bf16) + (size_t)WARPS * a.k * sizeof(bf16);
    static size_t allowed = 0; /* once an instantiation and size, not at every captured launch */
    if (smem > allowed) {
        CK(cudaFuncSetAttribute(bulk_kernel<R>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        allowed = smem;
    }
    bulk_kernel<R><<<(unsigned)((a.n + WARPS - 1) / WARPS), WARPS * 32, smem, s>>>(a);
}
template <int R> std::vector<Case> cases() {
    return {{"read", launch_read<R>, false},
            {"warp u4", launch_warp<R, 1, 4, 0>, true},
            {"u4 A-reg", launch_warp<R, 1, 4, 1>, true},
            {"u4 A-smem", launch_warp<R, 1, 4, 2>, true},
            {"u4 fence", launch_warp<R, 1, 4, 3>, true},
            {"u8 A-reg", launch_warp<R, 1, 8, 1>, true},
            {"u8 fence", launch_warp<R, 1, 8, 3>, true},
            {"u8 A-smem", launch_warp<R, 1, 8, 2>, true},
            {"u4 smem fence", launch_warp<R, 1, 4, 4>, true},
            {"u8 smem fence", launch_warp<R, 1, 8, 4>, true},
            {"w2 u4", launch_warp<R, 2, 4, 0>, true},
            {"w2 u4 A-reg", launch_warp<R, 2, 4, 1>, true},
            {"w2 u4 fence", launch_warp<R, 2, 4, 3>, true},
            {"ksplit2", launch_ksplit<R, 2>, true},
            {"ksplit4", launch_ksplit<R, 4>, true},
            {"bulk", launch_bulk<R>, true}};
}

static float bf(bf16 x) { return __bfloat162float(x); }

/* One shape at R rows: the chain over the copies for every case. */
template <int R>
void run_shape(int n, int k, int rows, int sms, size_t l2, cudaStream_t s, uint4 *sink, bool resident) {
    const size_t bytes = (size_t)n * k * sizeof(bf16);
    const int launches = (int)std::max<size_t>(4, (3 * l2 + bytes - 1) / bytes);
    const int copies = resident ? 1 : launches;
    std::vector<bf16> hb((size_t)n * k), ha((size_t)rows * k);
    uint32_t seed = 12345;
    auto rnd = [&]() { seed = seed * 1664525u + 1013904223u; return ((seed >> 8) & 0xffff) / 32768.0f - 1.0f; };
    for (auto &x : hb)
        x = __float2bfloat16_rn(rnd() * 0.05f);
    for (auto &x : ha)
        x = __float2bfloat16_rn(rnd());
    std::vector<bf16 *> dB(copies);
    for (int c = 0; c < copies; c++) {
        CK(cudaMalloc(&dB[c], bytes));
        CK(cudaMemcpy(dB[c], hb.data(), bytes, cudaMemcpyHostToDevice));
    }
    bf16 *dA, *dC;
    CK(cudaMalloc(&dA, ha.size() * sizeof(bf16)));
    CK(cudaMalloc(&dC, (size_t)rows * n * sizeof(bf16)));
    CK(cudaMemcpy(dA, ha.data(), ha.size() * sizeof(bf16), cudaMemcpyHostToDevice));
    std::vector<float> ref((size_t)rows * n);
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < n; j++) {
            double acc = 0;
            for (int i = 0; i < k; i++)
                acc += (double)bf(ha[(size_t)r * k + i]) * bf(hb[(size_t)j * k + i]);
            ref[(size_t)r * n + j] = (float)acc;
        }
    for (const Case &cs : cases<R>()) {
        Args a = {rows, n, k, dA, dB[0], dC, sink, 0u};
        /* check on copy 0 */
        double worst = 0.0;
        if (cs.checks) {
            CK(cudaMemset(dC, 0xff, (size_t)rows * n * sizeof(bf16)));
            cs.launch(a, s, sms);
            CK(cudaStreamSynchronize(s));
            std::vector<bf16> hc((size_t)rows * n);
            CK(cudaMemcpy(hc.data(), dC, hc.size() * sizeof(bf16), cudaMemcpyDeviceToHost));
            double num = 0, den = 0;
            for (size_t i = 0; i < hc.size(); i++) {
                const double d = bf(hc[i]) - ref[i];
                num += d * d, den += (double)ref[i] * ref[i];
            }
            worst = std::sqrt(num / (den > 0 ? den : 1));
        }
        const float med = chain_median_us(s, launches, REPLAYS, [&](int c, cudaStream_t st) {
            a.B = dB[resident ? 0 : c];
            cs.launch(a, st, sms);
        });
        printf("  %-9s n %5d k %5d rows %d  copies %2d  %8.2f us a launch  %6.2f TB/s", cs.name, n, k, rows, copies, med,
               bytes / (med * 1e-6) / 1e12);
        if (cs.checks)
            printf("  rel rms %.2e%s", worst, worst < 1e-2 ? "" : "  WRONG");
        printf("\n");
    }
    for (bf16 *p : dB)
        CK(cudaFree(p));
    CK(cudaFree(dA));
    CK(cudaFree(dC));
}

int main(int argc, char **argv) {
    const bool resident = argc > 1 && std::string(argv[1]) == "l2";
    if (argc > 1 && !resident) {
        printf("usage: %s [l2]\n", argv[0]);
        return 2;
    }
    int dev = 0;
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, dev));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    uint4 *sink;
    CK(cudaMalloc(&sink, (size_t)prop.multiProcessorCount * 64 * sizeof(uint4)));
    printf("# gemv_floor: %s, %d SMs, L2 %d MB; bf16 weight [n, k], rows x k activations, a chain of launches over "
           "%s, graph-replayed, median of %d\n",
           prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20,
           resident ? "ONE copy (the weight an L2 hit)" : "distinct copies (3x L2)", REPLAYS);
    const int shapes[2][2] = {{7728, 2048}, {2048, 2048}};
    for (const auto &sh : shapes) {
        run_shape<1>(sh[0], sh[1], 1, prop.multiProcessorCount, prop.l2CacheSize, s, sink, resident);
        run_shape<4>(sh[0], sh[1], 4, prop.multiProcessorCount, prop.l2CacheSize, s, sink, resident);
    }
    return 0;
}
