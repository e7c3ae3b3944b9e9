/*
 * decode_ceiling.cu: developer lab for the decode op's memory side: the time the row kernel's
 * access scheme needs with no arithmetic, the ceiling its compute chain is measured against
 * (kernels/NOTES-ops.md v10). 4096 items of 64 KB (B=256, H=16, K=V=128 fp32 state; 32 KB for
 * the bf16 state's bytes), read and written in place by: a copy to another buffer; an in-place
 * grid-stride read-modify-write; a resident grid walking items with the item in registers; the
 * same with the next item streamed by cp.async into per-thread shared-memory cells (the row
 * kernel's scheme), each with W dummy FMAs per element to stand for the compute. Median of 20
 * launches, L2 flushed (a 256 MB memset) before each; prints us and TB/s per variant.
 * Build: cmake -DGDP_BUILD_DECODE_DEV=ON ... && cmake --build <dir> --target bench_decode_ceiling
 */
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); exit(1); } } while (0)

constexpr int THREADS = 256;

__global__ void copy_sep(const float4 *__restrict__ s, float4 *__restrict__ d, long n) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
        d[i] = s[i];
}
__global__ void rmw(float4 *x, long n) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        float4 v = x[i];
        v.x *= 1.0001f; v.y *= 1.0001f; v.z *= 1.0001f; v.w *= 1.0001f;
        x[i] = v;
    }
}
template <int R>
__device__ __forceinline__ void work(float (&st)[R][4], int w) {
    for (int k = 0; k < w; k++)
#pragma unroll
        for (int i = 0; i < R; i++)
#pragma unroll
            for (int c = 0; c < 4; c++) st[i][c] = fmaf(st[i][c], 1.0000001f, 1e-30f);
}
template <int R>
__global__ void __launch_bounds__(THREADS, 2) item_regs(float4 *x, long items, int w) {
    for (long it = blockIdx.x; it < items; it += gridDim.x) {
        float4 *base = x + it * (R * THREADS);
        float st[R][4];
#pragma unroll
        for (int i = 0; i < R; i++) { float4 v = base[i * THREADS + threadIdx.x]; st[i][0] = v.x; st[i][1] = v.y; st[i][2] = v.z; st[i][3] = v.w; }
        work<R>(st, w);
        __syncthreads();
#pragma unroll
        for (int i = 0; i < R; i++) base[i * THREADS + threadIdx.x] = make_float4(st[i][0], st[i][1], st[i][2], st[i][3]);
    }
}
__device__ __forceinline__ void cp16(void *dst, const void *src) {
    unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src) : "memory");
}
template <int R>
__global__ void __launch_bounds__(THREADS, 2) item_cp(float4 *x, long items, int w) {
    extern __shared__ float4 cells[];
    long it = blockIdx.x;
    if (it >= items) return;
#pragma unroll
    for (int i = 0; i < R; i++) cp16(&cells[i * THREADS + threadIdx.x], x + it * (R * THREADS) + i * THREADS + threadIdx.x);
    asm volatile("cp.async.commit_group;\n" ::: "memory");
    for (; it < items; it += gridDim.x) {
        asm volatile("cp.async.wait_all;\n" ::: "memory");
        float st[R][4];
#pragma unroll
        for (int i = 0; i < R; i++) { float4 v = cells[i * THREADS + threadIdx.x]; st[i][0] = v.x; st[i][1] = v.y; st[i][2] = v.z; st[i][3] = v.w; }
        const long nx = it + gridDim.x;
        if (nx < items) {
#pragma unroll
            for (int i = 0; i < R; i++) cp16(&cells[i * THREADS + threadIdx.x], x + nx * (R * THREADS) + i * THREADS + threadIdx.x);
            asm volatile("cp.async.commit_group;\n" ::: "memory");
        }
        work<R>(st, w);
        __syncthreads();
        float4 *base = x + it * (R * THREADS);
#pragma unroll
        for (int i = 0; i < R; i++) base[i * THREADS + threadIdx.x] = make_float4(st[i][0], st[i][1], st[i][2], st[i][3]);
    }
}

static char *flushbuf;
static void flush() { CK(cudaMemset(flushbuf, 1, 256 << 20)); }

template <class F> static float timeit(F f) {
    cudaEvent_t a, b; CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
    std::vector<float> t;
    f(); CK(cudaDeviceSynchronize());
    for (int r = 0; r < 20; r++) {
        flush();
        CK(cudaEventRecord(a)); f(); CK(cudaEventRecord(b)); CK(cudaEventSynchronize(b));
        float ms; CK(cudaEventElapsedTime(&ms, a, b)); t.push_back(ms * 1000.0f);
    }
    CK(cudaGetLastError());
    std::sort(t.begin(), t.end());
    return t[10];
}

int main() {
    int sms; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    CK(cudaMalloc(&flushbuf, 256 << 20));
    const long items = 4096;
    const long n16 = items * 16 * THREADS; // float4 of 64 KB items
    float4 *x, *y; CK(cudaMalloc(&x, n16 * 16)); CK(cudaMalloc(&y, n16 * 16));
    CK(cudaMemset(x, 0, n16 * 16)); CK(cudaMemset(y, 0, n16 * 16));
    const double bytes64 = 2.0 * n16 * 16, bytes32 = bytes64 / 2;
    auto rep = [&](const char *name, double bytes, float us) { printf("%-44s %8.1f us %7.2f TB/s\n", name, us, bytes / us / 1e6); };
    rep("copy separate (fp32 B=256 bytes)", bytes64, timeit([&] { copy_sep<<<sms * 8, THREADS>>>(x, y, n16); }));
    rep("rmw in place", bytes64, timeit([&] { rmw<<<sms * 8, THREADS>>>(x, n16); }));
    rep("rmw in place (bf16 bytes)", bytes32, timeit([&] { rmw<<<sms * 8, THREADS>>>(x, n16 / 2); }));
    CK(cudaFuncSetAttribute(item_cp<16>, cudaFuncAttributeMaxDynamicSharedMemorySize, 16 * THREADS * 16));
    CK(cudaFuncSetAttribute(item_cp<8>, cudaFuncAttributeMaxDynamicSharedMemorySize, 8 * THREADS * 16));
    for (int blocks_per_sm : {1, 2}) {
        for (int w : {0, 2, 4, 8, 16}) {
            char nm[96];
            snprintf(nm, sizeof nm, "item regs 64KB, %d/SM, W=%d", blocks_per_sm, w);
            rep(nm, bytes64, timeit([&] { item_regs<16><<<sms * blocks_per_sm, THREADS>>>(x, items, w); }));
            snprintf(nm, sizeof nm, "item cp.async 64KB, %d/SM, W=%d", blocks_per_sm, w);
            rep(nm, bytes64, timeit([&] { item_cp<16><<<sms * blocks_per_sm, THREADS, 16 * THREADS * 16>>>(x, items, w); }));
            snprintf(nm, sizeof nm, "item cp.async 32KB (bf16), %d/SM, W=%d", blocks_per_sm, w);
            rep(nm, bytes32, timeit([&] { item_cp<8><<<sms * blocks_per_sm, THREADS, 8 * THREADS * 16>>>(x, items, w); }));
        }
    }
    // more resident blocks with smaller items (32 KB each, fp32 half-items): 4/SM
    CK(cudaFuncSetAttribute(item_cp<8>, cudaFuncAttributeMaxDynamicSharedMemorySize, 8 * THREADS * 16));
    for (int w : {0, 4, 8}) {
        char nm[96];
        snprintf(nm, sizeof nm, "item cp.async 32KB x 8192, 3/SM, W=%d", w);
        rep(nm, bytes64, timeit([&] { item_cp<8><<<sms * 3, THREADS, 8 * THREADS * 16>>>(x, 2 * items, w); }));
    }
    return 0;
}
