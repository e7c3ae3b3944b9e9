/*
 * chunk_stages.cu: developer lab for the chunk op: per-stage times (cumsum, WY, state sweep,
 * outputs, tail) of gdp_chunk_gated_delta_product_varlen on the prefill rows of
 * docs/performance.md. It compiles kernels/chunk/launch.cu into itself with GDP_CHUNK_STAGE_MARK
 * recording a CUDA event after each stage, and links the rest of libgdp statically.
 * With --fused-phases it runs GDP_CHUNK_PATH=fused and prints, per row, the clock64 cycles per
 * chunk of each phase of the fused kernel's aux and state warps (block 0; fused.cuh's marks).
 * With --hopper-phases the same for the Hopper kernel (GDP_CHUNK_PATH=hopper, hopper.cuh's marks: one
 * thread of the aux warpgroup and one of the first state warpgroup; rows it does not take say so).
 * The file includes kernels/chunk/hopper.cu too, so the binary is built for sm_90a and runs on a
 * compute capability 9.0 device only.
 * With --fused-alone it times the fused kernel (median of 10, us) whole, with the aux warps' math
 * left out and with the state warps' math left out (outputs then wrong): what each role costs
 * alone beside the other's loads and barriers.
 * With --state-phases it runs the staged path and prints, per row, the clock64 cycles per chunk
 * step of each phase of the state sweep (block 0, thread 0 and thread 224: warps 0 and 7; state.cuh's
 * marks), with the column block the op chose or GDP_CHUNK_STATE_VB.
 * With --split-timeline [CSV] it runs GDP_CHUNK_PATH=hopper with max_seqlen set and prints, for the rows the
 * segment split takes, when each of pass 1's items ran (MAIN and F: their chunks, start and end, ns a chunk,
 * the SMs' busy share), then when the fix-up's steps ended and the correction's blocks ran, slot by slot
 * (whether the correction overlaps the fix-up), every item and block into CSV (hopper_split.cuh's
 * GDP_HOPPER_ITEM_MARK and GDP_HOPPER_TAIL_MARK; no stage events are recorded in this mode).
 * With --dump DIR it instead writes inputs, outputs and the workspace intermediates of two small
 * shapes (DIR/dump_k128.safetensors, DIR/dump_k100.safetensors) for offline stage-by-stage checks.
 * Built with GDP_HOPPER_DEV_SKIP=1, 2 or 3 (the bench_hopper_skip1..3 targets) the Hopper kernel in it
 * leaves out the aux warpgroup's math, the state side's, or both (hopper.cuh): under
 * GDP_CHUNK_PATH=hopper the 'total' column then times the other role's chain and the loads alone.
 * Build: cmake -DGDP_BUILD_CHUNK_DEV=ON ... && cmake --build <dir> --target bench_chunk_stages
 */
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

/* the chunk kernels' stage marks record this lab's events (lab_stage_mark below), not the profile's:
 * defined before src/phase.h, whose default it replaces */
#define GDP_CHUNK_STAGE_MARK(mark, stream) lab_stage_mark((mark), (stream))
#include "src/phase.h" /* GDP_CHUNK_MARK_* */

static cudaEvent_t g_stage_events[GDP_CHUNK_MARK_END + 1];
/* Event s after stage s (launch.cu's GDP_CHUNK_MARK_* ids BEGIN to END); the fused path's one
 * mark records the events of CUMSUM to OUT at once: its kernel then counts as the cumsum stage,
 * the next three are empty. The Hopper split's marks (hopper.cu) do the same, each after its
 * launches: the last one leaves the whole split in the cumsum column. */
static bool g_lab_marks_off; /* --split-timeline: an event between the split's launches would serialize them */
static void lab_stage_mark(int mark, cudaStream_t stream) {
    if (g_lab_marks_off)
        return;
    if (mark >= GDP_CHUNK_MARK_FUSED)
        for (int s = GDP_CHUNK_MARK_CUMSUM; s <= GDP_CHUNK_MARK_OUT; s++)
            cudaEventRecord(g_stage_events[s], stream);
    else
        cudaEventRecord(g_stage_events[mark], stream);
}
/* --fused-phases: thread 0 (aux) and thread 128 (state) of block (0, 0, 0) of the fused kernel
 * add up the clock64 cycles of each phase (fused.cuh's marks) */
__device__ unsigned long long g_fused_cycles[2][8];
__device__ unsigned long long g_fused_last[2];
#define GDP_FUSED_PHASE_MARK(role, phase)                                                            \
    do {                                                                                             \
        if (blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 && threadIdx.x == (role) * 128) {  \
            const unsigned long long t_ = clock64();                                                 \
            if (g_fused_last[(role)] != 0)                                                           \
                g_fused_cycles[(role)][(phase)] += t_ - g_fused_last[(role)];                        \
            g_fused_last[(role)] = t_;                                                               \
        }                                                                                            \
    } while (0)
/* --state-phases: threads 0 and 224 (warps 0 and 7) of block (0, 0, 0) of the state sweep add up
 * the clock64 cycles of each phase of their chunk steps in registers and store the sums once at
 * the end (state.cuh's marks; a global store per mark made block 0, and so the stage, about 70 %
 * slower at 1 x 16384). Off unless g_state_phases_on: the stage times then pay one load a block. */
__device__ unsigned long long g_state_cycles[2][8];
__device__ int g_state_phases_on;
#define GDP_STATE_PHASE_DECL()                                                                       \
    unsigned long long sp_cyc_[8] = {0, 0, 0, 0, 0, 0, 0, 0}, sp_last_ = 0;                          \
    const bool sp_on_ = g_state_phases_on && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 && \
                        (threadIdx.x == 0 || threadIdx.x == 224)
#define GDP_STATE_PHASE_MARK(phase)                                                                  \
    do {                                                                                             \
        if (sp_on_) {                                                                                \
            const unsigned long long t_ = clock64();                                                 \
            if (sp_last_ != 0)                                                                       \
                sp_cyc_[(phase)] += t_ - sp_last_;                                                   \
            sp_last_ = t_;                                                                           \
        }                                                                                            \
    } while (0)
#define GDP_STATE_PHASE_FLUSH()                                                                      \
    do {                                                                                             \
        if (sp_on_)                                                                                  \
            for (int p_ = 0; p_ < 8; p_++)                                                           \
                g_state_cycles[threadIdx.x != 0][p_] = sp_cyc_[p_];                                  \
    } while (0)
/* --fused-alone: 1 leaves out the aux warps' math, 2 the state warps' (fused.cuh's skip hook) */
__device__ int g_fused_skip;
#define GDP_FUSED_DEV_SKIP(role) (g_fused_skip == (role) + 1)
/* --hopper-phases: thread 0 (aux) and thread 128 (the first state warpgroup) of block (0, 0, 0) of the
 * Hopper kernel add up 32-bit clock deltas per phase in registers (hopper.cuh's marks) and store
 * them once at the end, so the marked warps pay a clock read and an add a mark */
__device__ unsigned long long g_hopper_cycles[2][8];
__device__ int g_hopper_phases_on;
#define GDP_HOPPER_PHASES 1
struct HopPhases {
    unsigned int cyc[8], last;
    bool on;
    __device__ __forceinline__ HopPhases() : last(0) {
        on = g_hopper_phases_on && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 &&
             (threadIdx.x == 0 || threadIdx.x == 128);
        for (int i = 0; i < 8; i++)
            cyc[i] = 0;
    }
    __device__ __forceinline__ void mark(int phase) {
        if (on) {
            const unsigned int t = (unsigned int)clock64();
            if (last != 0)
                cyc[phase] += t - last;
            last = t;
        }
    }
    __device__ __forceinline__ void flush(int role) {
        if (on)
            for (int i = 0; i < 8; i++)
                g_hopper_cycles[role][i] = cyc[i];
    }
};
/* --split-timeline: every block of the split's pass 1 that runs an item records its SM, its chunks and the
 * global timer (ns) at its start and end (hopper_split.cuh's GDP_HOPPER_ITEM_MARK), by kind (0 MAIN, 1 F)
 * and record (item x heads + head) */
constexpr int TL_MAX = 16384;
__device__ unsigned long long g_tl_t[2][TL_MAX][2];
__device__ int g_tl_sm[2][TL_MAX], g_tl_chunks[2][TL_MAX];
__device__ int g_tl_on;
__device__ __forceinline__ unsigned long long tl_now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ int tl_smid() {
    unsigned s;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
    return (int)s;
}
#define GDP_HOPPER_ITEM_MARK(kind, rec, chunks, begin)                                                \
    do {                                                                                             \
        if (g_tl_on && (rec) < TL_MAX) {                                                             \
            g_tl_t[(kind)][(rec)][(begin) ? 0 : 1] = tl_now();                                       \
            if (begin) {                                                                             \
                g_tl_sm[(kind)][(rec)] = tl_smid();                                                  \
                g_tl_chunks[(kind)][(rec)] = (chunks);                                               \
            }                                                                                        \
        }                                                                                            \
    } while (0)
/* --split-timeline, the launches after pass 1: every fix-up block's global timer at its start (slot 0) and after
 * each step j (slot j), every correction block's at its start, when its S_j is in and at its end (slots 0-2),
 * with its SM and tag (the fix-up's sequence, the correction's slot e); hopper_split.cuh's GDP_HOPPER_TAIL_MARK */
constexpr int TT_MAX = 8192, TT_SLOTS = 16;
__device__ unsigned long long g_tt_t[2][TT_MAX][TT_SLOTS];
__device__ int g_tt_sm[2][TT_MAX], g_tt_tag[2][TT_MAX];
#define GDP_HOPPER_TAIL_MARK(kind, rec, slot, tag)                                                    \
    do {                                                                                             \
        if (g_tl_on && (rec) < TT_MAX && (slot) < TT_SLOTS) {                                        \
            g_tt_t[(kind)][(rec)][(slot)] = tl_now();                                                \
            if ((slot) == 0) {                                                                       \
                g_tt_sm[(kind)][(rec)] = tl_smid();                                                  \
                g_tt_tag[(kind)][(rec)] = (tag);                                                     \
            }                                                                                        \
        }                                                                                            \
    } while (0)
#include "../chunk/launch.cu"
#include "../chunk/hopper.cu" /* the Hopper kernel in this translation unit too (built for sm_90a) */
#include "src/workspace.h"

#define DEV_CHECK(call)                                                                              \
    do {                                                                                             \
        auto r_ = (call);                                                                            \
        if ((int)r_ != 0) {                                                                          \
            std::fprintf(stderr, "%s failed (%d): %s\n", #call, (int)r_, gdp_last_error());           \
            std::exit(1);                                                                            \
        }                                                                                            \
    } while (0)

/* --state-phases / --hopper-phases: one call with the kernel's phase marks switched on (flag), after
 * three warm-ups; the two threads' cycles per phase from the kernel's cycles symbol. */
template <typename Cycles>
static void phases_call(gdp_ctx_t ctx, const gdp_chunk_args *a, Cycles &cycles_sym, int &flag_sym,
                        unsigned long long (&cyc)[2][8]) {
    for (int it = 0; it < 3; it++)
        DEV_CHECK(gdp_chunk_gated_delta_product_varlen(ctx, a));
    DEV_CHECK(cudaDeviceSynchronize());
    unsigned long long zero[2][8] = {{0}};
    const int on = 1, off = 0;
    DEV_CHECK(cudaMemcpyToSymbol(cycles_sym, zero, sizeof zero));
    DEV_CHECK(cudaMemcpyToSymbol(flag_sym, &on, sizeof on));
    DEV_CHECK(gdp_chunk_gated_delta_product_varlen(ctx, a));
    DEV_CHECK(cudaDeviceSynchronize());
    DEV_CHECK(cudaMemcpyToSymbol(flag_sym, &off, sizeof off));
    DEV_CHECK(cudaMemcpyFromSymbol(cyc, cycles_sym, sizeof zero));
}
/* --split-timeline, after pass 1's summary: the fix-up's blocks (when the first started, when the last of them
 * finished each step j) and the correction's by slot e (its blocks, the first start, the median time its S_j was
 * in, the last end, how many of them started before the fix-up's last block ended), in us from pass 1's first
 * start t0; every block into csv (kind 2 the fix-up, slot j's time in the chunks column's place: one line a
 * step; kind 3 the correction: start, S_j in, end). The two launches run as the library issues them (the marks
 * here record into the lab's own arrays; no event sits between them). */
static void split_tail_timeline(const char *label, unsigned long long t0, unsigned long long t1, FILE *csv) {
    static unsigned long long t[2][TT_MAX][TT_SLOTS];
    static int sm[2][TT_MAX], tag[2][TT_MAX];
    DEV_CHECK(cudaMemcpyFromSymbol(t, g_tt_t, sizeof t));
    DEV_CHECK(cudaMemcpyFromSymbol(sm, g_tt_sm, sizeof sm));
    DEV_CHECK(cudaMemcpyFromSymbol(tag, g_tt_tag, sizeof tag));
    const auto us = [&](unsigned long long x) { return x == 0 ? -1.0 : ((double)x - (double)t0) * 1e-3; };
    double fix_first = 1e30, fix_last_end = 0;
    std::vector<double> step_end(TT_SLOTS, 0);
    int nfix = 0;
    for (int r = 0; r < TT_MAX; r++) {
        if (t[0][r][0] == 0)
            continue;
        nfix++;
        fix_first = std::min(fix_first, us(t[0][r][0]));
        for (int j = 1; j < TT_SLOTS && t[0][r][j] != 0; j++) {
            step_end[j] = std::max(step_end[j], us(t[0][r][j]));
            fix_last_end = std::max(fix_last_end, us(t[0][r][j]));
            if (csv != nullptr)
                std::fprintf(csv, "%s,2,%d,%d,%d,%.0f,%.0f\n", label, r, sm[0][r], j, us(t[0][r][0]) * 1e3,
                             us(t[0][r][j]) * 1e3);
        }
    }
    if (nfix == 0) {
        std::printf("  fix-up: no block ran a step\n");
        return;
    }
    std::printf("  fix-up %d blocks (pass 1 ended %.1f us): first start %.1f us; the last block's end of step", nfix,
                (double)(t1 - t0) * 1e-3, fix_first);
    for (int j = 1; j < TT_SLOTS && step_end[j] > 0; j++)
        std::printf(" %d: %.1f", j, step_end[j]);
    std::printf(" us\n");
    int max_e = -1;
    for (int r = 0; r < TT_MAX; r++)
        if (t[1][r][0] != 0)
            max_e = std::max(max_e, tag[1][r]);
    double cor_last = 0;
    for (int e = 0; e <= max_e; e++) {
        std::vector<double> in;
        double first = 1e30, last = 0;
        int n = 0, early = 0;
        for (int r = 0; r < TT_MAX; r++) {
            if (t[1][r][0] == 0 || tag[1][r] != e)
                continue;
            n++;
            first = std::min(first, us(t[1][r][0]));
            in.push_back(us(t[1][r][1]));
            last = std::max(last, us(t[1][r][2]));
            early += us(t[1][r][0]) < fix_last_end;
            if (csv != nullptr)
                std::fprintf(csv, "%s,3,%d,%d,%d,%.0f,%.0f,%.0f\n", label, r, sm[1][r], e, us(t[1][r][0]) * 1e3,
                             us(t[1][r][1]) * 1e3, us(t[1][r][2]) * 1e3);
        }
        if (n == 0)
            continue;
        std::sort(in.begin(), in.end());
        cor_last = std::max(cor_last, last);
        std::printf("  correction slot %d: %d blocks, first start %.1f, S_j in (median) %.1f, last end %.1f us; %d "
                    "started before the fix-up's end\n",
                    e, n, first, in[in.size() / 2], last, early);
    }
    std::printf("  tail: fix-up %.1f -> %.1f us, corrections end %.1f us\n", fix_first, fix_last_end, cor_last);
}

/* --split-timeline: one call (after three warm-ups) with the items' marks on; per kind the items, their chunks,
 * when they started and ended (us from the first start), the mean ns a chunk, and the SMs' busy share of the
 * pass; every record into csv (kind, record, sm, chunks, start, end in ns from the first start). */
static void split_timeline(gdp_ctx_t ctx, const gdp_chunk_args *a, const char *label, FILE *csv) {
    for (int it = 0; it < 3; it++)
        DEV_CHECK(gdp_chunk_gated_delta_product_varlen(ctx, a));
    DEV_CHECK(cudaDeviceSynchronize());
    static unsigned long long t[2][TL_MAX][2];
    static int sm[2][TL_MAX], chunks[2][TL_MAX];
    std::memset(t, 0, sizeof t);
    DEV_CHECK(cudaMemcpyToSymbol(g_tl_t, t, sizeof t));
    {
        static unsigned long long zero_tail[2][TT_MAX][TT_SLOTS];
        DEV_CHECK(cudaMemcpyToSymbol(g_tt_t, zero_tail, sizeof zero_tail));
    }
    const int on = 1, off = 0;
    DEV_CHECK(cudaMemcpyToSymbol(g_tl_on, &on, sizeof on));
    DEV_CHECK(gdp_chunk_gated_delta_product_varlen(ctx, a));
    DEV_CHECK(cudaDeviceSynchronize());
    DEV_CHECK(cudaMemcpyToSymbol(g_tl_on, &off, sizeof off));
    DEV_CHECK(cudaMemcpyFromSymbol(t, g_tl_t, sizeof t));
    DEV_CHECK(cudaMemcpyFromSymbol(sm, g_tl_sm, sizeof sm));
    DEV_CHECK(cudaMemcpyFromSymbol(chunks, g_tl_chunks, sizeof chunks));
    unsigned long long t0 = ~0ull, t1 = 0;
    for (int k = 0; k < 2; k++)
        for (int r = 0; r < TL_MAX; r++)
            if (t[k][r][0] != 0) {
                t0 = std::min(t0, t[k][r][0]);
                t1 = std::max(t1, t[k][r][1]);
            }
    if (t0 == ~0ull) {
        std::printf("%-28s (no split item ran: segments of %d)\n", label, gdp_cuda_chunk_hopper_last_segment());
        return;
    }
    int sms = 0;
    DEV_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    double busy = 0;
    std::printf("%-28s segments of %d, pass 1 %.1f us\n", label, gdp_cuda_chunk_hopper_last_segment(), (t1 - t0) * 1e-3);
    for (int k = 0; k < 2; k++) {
        int n = 0, cmin = 1 << 30, cmax = 0;
        double s_first = 1e30, s_last = 0, e_last = 0, ns_chunk = 0, chunk_sum = 0;
        for (int r = 0; r < TL_MAX; r++) {
            if (t[k][r][0] == 0)
                continue;
            const double s_ = (double)(t[k][r][0] - t0), e_ = (double)(t[k][r][1] - t0);
            n++;
            cmin = std::min(cmin, chunks[k][r]);
            cmax = std::max(cmax, chunks[k][r]);
            s_first = std::min(s_first, s_), s_last = std::max(s_last, s_), e_last = std::max(e_last, e_);
            ns_chunk += e_ - s_;
            chunk_sum += chunks[k][r];
            busy += e_ - s_;
            if (csv != nullptr)
                std::fprintf(csv, "%s,%d,%d,%d,%d,%.0f,%.0f\n", label, k, r, sm[k][r], chunks[k][r], s_, e_);
        }
        std::printf("  %-4s %5d items of %d-%d chunks: started %.1f-%.1f us, last end %.1f us, %.0f ns a chunk\n",
                    k == 0 ? "MAIN" : "F", n, n ? cmin : 0, cmax, n ? s_first * 1e-3 : 0.0, s_last * 1e-3, e_last * 1e-3,
                    chunk_sum > 0 ? ns_chunk / chunk_sum : 0.0);
    }
    std::printf("  SMs busy %.1f %% of the pass (%d SMs)\n", 100.0 * busy / ((double)sms * (double)(t1 - t0)), sms);
    split_tail_timeline(label, t0, t1, csv);
}

/* The two threads' rows: cycles per step of each phase and their sum. */
static void print_phases(const char *label, const char *const (&tags)[2], const unsigned long long (&cyc)[2][8],
                         double steps) {
    for (int w = 0; w < 2; w++) {
        std::printf("%-28s %s", w == 0 ? label : "", tags[w]);
        double sum = 0;
        for (int ph = 0; ph < 8; ph++) {
            std::printf(" %7.0f", cyc[w][ph] / steps);
            sum += cyc[w][ph] / steps;
        }
        std::printf("  = %7.0f\n", sum);
    }
}

struct Row {
    const char *label;
    int H, K, V, M, n;
    int lens[8];
};

static const Row ROWS[] = {
    {"H16 K128 V128 M2 8x2048", 16, 128, 128, 2, 8, {2048, 2048, 2048, 2048, 2048, 2048, 2048, 2048}},
    {"H16 K128 V128 M3 8x2048", 16, 128, 128, 3, 8, {2048, 2048, 2048, 2048, 2048, 2048, 2048, 2048}},
    {"H16 K128 V128 M2 1x16384", 16, 128, 128, 2, 1, {16384}},
    {"H16 K128 V128 M2 varlen(8)", 16, 128, 128, 2, 8, {1000, 37, 5000, 64, 2500, 7000, 400, 299}},
    {"H32 K128 V64 M3 4x2048", 32, 128, 64, 3, 4, {2048, 2048, 2048, 2048}},
    {"H16 K64 V128 M2 8x2048", 16, 64, 128, 2, 8, {2048, 2048, 2048, 2048, 2048, 2048, 2048, 2048}},
};

/* Work split: one thread per element; a hash of the index gives a value in [lo, hi). */
__global__ void fill_kernel(void *p, int64_t n, int bf16, float lo, float hi, uint32_t seed) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    uint32_t x = (uint32_t)i * 2654435761u ^ seed;
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    float f = lo + (hi - lo) * (float)(x >> 8) * (1.0f / 16777216.0f);
    if (bf16)
        static_cast<__nv_bfloat16 *>(p)[i] = __float2bfloat16_rn(f);
    else
        static_cast<float *>(p)[i] = f;
}

static void *filled(int64_t n, int bf16, float lo, float hi, uint32_t seed) {
    void *p;
    DEV_CHECK(cudaMalloc(&p, (size_t)n * (bf16 ? 2 : 4)));
    fill_kernel<<<(unsigned)((n + 255) / 256), 256>>>(p, n, bf16, lo, hi, seed);
    DEV_CHECK(cudaGetLastError());
    return p;
}

static gdp_tensor view(void *data, gdp_dtype_t dt, int32_t ndim, int64_t a, int64_t b = 0, int64_t c = 0,
                       int64_t d = 0) {
    int64_t shape[4] = {a, b, c, d};
    gdp_tensor t;
    gdp_tensor_init(&t, data, dt, ndim, shape);
    return t;
}

/* ---- dump mode: inputs, outputs and every workspace intermediate of two small shapes, as
 * safetensors, for a stage-by-stage comparison with an offline model ---- */
struct Blob {
    std::string name, dtype;
    std::vector<int64_t> shape;
    std::vector<char> bytes;
};

static void add_host(std::vector<Blob> &out, const char *name, const char *dtype, std::vector<int64_t> shape,
                     const void *p, size_t bytes) {
    Blob b{name, dtype, shape, std::vector<char>(bytes)};
    std::memcpy(b.bytes.data(), p, bytes);
    out.push_back(b);
}

static void add_dev(std::vector<Blob> &out, const char *name, const char *dtype, std::vector<int64_t> shape,
                    const void *p, size_t bytes) {
    Blob b{name, dtype, shape, std::vector<char>(bytes)};
    DEV_CHECK(cudaMemcpy(b.bytes.data(), p, bytes, cudaMemcpyDeviceToHost));
    out.push_back(b);
}

static void write_safetensors(const char *path, const std::vector<Blob> &blobs) {
    std::string hdr = "{";
    size_t off = 0;
    for (size_t i = 0; i < blobs.size(); i++) {
        const Blob &b = blobs[i];
        hdr += (i ? "," : "") + std::string("\"") + b.name + "\":{\"dtype\":\"" + b.dtype + "\",\"shape\":[";
        for (size_t d = 0; d < b.shape.size(); d++)
            hdr += (d ? "," : "") + std::to_string(b.shape[d]);
        hdr += "],\"data_offsets\":[" + std::to_string(off) + "," + std::to_string(off + b.bytes.size()) + "]}";
        off += b.bytes.size();
    }
    hdr += "}";
    while (hdr.size() % 8)
        hdr += " ";
    FILE *f = std::fopen(path, "wb");
    if (!f) {
        std::fprintf(stderr, "cannot write %s\n", path);
        std::exit(1);
    }
    uint64_t n = hdr.size();
    std::fwrite(&n, 8, 1, f);
    std::fwrite(hdr.data(), 1, hdr.size(), f);
    for (const Blob &b : blobs)
        std::fwrite(b.bytes.data(), 1, b.bytes.size(), f);
    std::fclose(f);
}

static uint64_t g_rng = 88172645463325252ull;
static float urand(float lo, float hi) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return lo + (hi - lo) * (float)((g_rng >> 40) * (1.0 / 16777216.0));
}

static void dump_case(const char *path, int M, int H, int K, int V, std::vector<int32_t> lens, int64_t T) {
    const int64_t N = (int64_t)lens.size();
    std::vector<int32_t> cu(N + 1, 0);
    for (int64_t i = 0; i < N; i++)
        cu[i + 1] = cu[i] + lens[i];
    int64_t nc, ncdp;
    DEV_CHECK(gdp_max_chunk_counts(T, N, M, &nc, &ncdp));
    std::vector<int32_t> ci(2 * nc), cidp(2 * ncdp), co(N + 1);
    DEV_CHECK(gdp_build_chunk_descriptors(cu.data(), (int32_t)N, M, T, ci.data(), cidp.data(), co.data(), &nc, &ncdp));
    auto bf = [](int64_t n, float lo, float hi) {
        std::vector<uint16_t> h(n);
        for (auto &x : h)
            x = gdp_float_to_bf16(urand(lo, hi));
        return h;
    };
    auto hq = bf(T * H * K, -1, 1), hk = bf(T * M * H * K, -1, 1), hv = bf(T * M * H * V, -1, 1);
    auto hb = bf(T * M * H, 0, 1);
    std::vector<float> hg(T * H), h0(N * H * K * V);
    for (auto &x : hg)
        x = urand(0, 1) < 0.25f ? 0.0f : urand(-0.3f, 0.0f);
    for (auto &x : h0)
        x = urand(-0.5f, 0.5f);
    auto up = [](const void *p, size_t bytes) {
        void *d;
        DEV_CHECK(cudaMalloc(&d, bytes ? bytes : 16));
        DEV_CHECK(cudaMemcpy(d, p, bytes, cudaMemcpyHostToDevice));
        return d;
    };
    void *q = up(hq.data(), hq.size() * 2), *k = up(hk.data(), hk.size() * 2), *v = up(hv.data(), hv.size() * 2);
    void *beta = up(hb.data(), hb.size() * 2), *g = up(hg.data(), hg.size() * 4), *ini = up(h0.data(), h0.size() * 4);
    void *d_cu = up(cu.data(), cu.size() * 4), *d_ci = up(ci.data(), ci.size() * 4);
    void *d_cidp = up(cidp.data(), cidp.size() * 4), *d_co = up(co.data(), co.size() * 4);
    void *o, *fs, *cs;
    DEV_CHECK(cudaMalloc(&o, (size_t)(T * H * V) * 2));
    DEV_CHECK(cudaMalloc(&fs, (size_t)(N * H * K * V) * 4));
    DEV_CHECK(cudaMalloc(&cs, (size_t)(nc * H * K * V) * 4));
    DEV_CHECK(cudaMemset(o, 0xff, (size_t)(T * H * V) * 2));
    DEV_CHECK(cudaMemset(cs, 0, (size_t)(nc * H * K * V) * 4));
    gdp_ctx_t ctx;
    DEV_CHECK(gdp_ctx_init(&ctx, GDP_BACKEND_CUDA, 0));
    gdp_chunk_workspace_layout lay;
    DEV_CHECK(gdp_chunk_workspace_plan(T, N, M, H, K, V, &lay));
    DEV_CHECK(gdp_ctx_reserve_workspace(ctx, lay.total));
    DEV_CHECK(cudaMemset(ctx->workspace, 0, lay.total));
    gdp_chunk_args a;
    std::memset(&a, 0, sizeof a);
    a.q = view(q, GDP_DTYPE_BF16, 4, 1, T, H, K);
    a.k = view(k, GDP_DTYPE_BF16, 4, 1, T * M, H, K);
    a.v = view(v, GDP_DTYPE_BF16, 4, 1, T * M, H, V);
    a.g = view(g, GDP_DTYPE_FP32, 3, 1, T, H);
    a.beta = view(beta, GDP_DTYPE_BF16, 3, 1, T * M, H);
    a.num_householder = M;
    a.cu_seqlens = view(d_cu, GDP_DTYPE_INT32, 1, N + 1);
    a.initial_state = view(ini, GDP_DTYPE_FP32, 4, N, H, K, V);
    a.output_final_state = 1;
    a.use_qk_l2norm_in_kernel = 1;
    a.chunk_indices = view(d_ci, GDP_DTYPE_INT32, 2, nc, 2);
    a.chunk_indices_dp = view(d_cidp, GDP_DTYPE_INT32, 2, ncdp, 2);
    a.chunk_offsets = view(d_co, GDP_DTYPE_INT32, 1, N + 1);
    a.o = view(o, GDP_DTYPE_BF16, 4, 1, T, H, V);
    a.final_state = view(fs, GDP_DTYPE_FP32, 4, N, H, K, V);
    a.return_chunk_states = 1;
    a.chunk_states = view(cs, GDP_DTYPE_FP32, 4, nc, H, K, V);
    DEV_CHECK(gdp_chunk_gated_delta_product_varlen(ctx, &a));
    DEV_CHECK(cudaDeviceSynchronize());
    std::vector<Blob> blobs;
    add_host(blobs, "q", "BF16", {1, T, H, K}, hq.data(), hq.size() * 2);
    add_host(blobs, "k", "BF16", {1, T * M, H, K}, hk.data(), hk.size() * 2);
    add_host(blobs, "v", "BF16", {1, T * M, H, V}, hv.data(), hv.size() * 2);
    add_host(blobs, "beta", "BF16", {1, T * M, H}, hb.data(), hb.size() * 2);
    add_host(blobs, "g", "F32", {1, T, H}, hg.data(), hg.size() * 4);
    add_host(blobs, "initial_state", "F32", {N, H, K, V}, h0.data(), h0.size() * 4);
    add_host(blobs, "cu_seqlens", "I32", {N + 1}, cu.data(), cu.size() * 4);
    add_host(blobs, "chunk_offsets", "I32", {N + 1}, co.data(), co.size() * 4);
    add_dev(blobs, "o", "BF16", {1, T, H, V}, o, (size_t)(T * H * V) * 2);
    add_dev(blobs, "final_state", "F32", {N, H, K, V}, fs, (size_t)(N * H * K * V) * 4);
    add_dev(blobs, "chunk_states", "F32", {nc, H, K, V}, cs, (size_t)(nc * H * K * V) * 4);
    const char *ws = (const char *)ctx->workspace;
    add_dev(blobs, "ws_gq", "F32", {T, H}, ws + lay.off_gq, (size_t)(T * H) * 4);
    add_dev(blobs, "ws_gk", "F32", {T * M, H}, ws + lay.off_gk, (size_t)(T * M * H) * 4);
    add_dev(blobs, "ws_kn", "BF16", {T * M, H, lay.kp}, ws + lay.off_kn, (size_t)(T * M * H * lay.kp) * 2);
    add_dev(blobs, "ws_w", "BF16", {T * M, H, lay.kp}, ws + lay.off_w, (size_t)(T * M * H * lay.kp) * 2);
    add_dev(blobs, "ws_vnew", "BF16", {T * M, H, lay.vp}, ws + lay.off_u, (size_t)(T * M * H * lay.vp) * 2);
    add_dev(blobs, "ws_h", "BF16", {lay.h_rows, H, lay.kp, lay.vp}, ws + lay.off_h,
            (size_t)(lay.h_rows * H * lay.kp * lay.vp) * 2);
    write_safetensors(path, blobs);
    std::printf("# dumped %s (M=%d H=%d K=%d V=%d T=%lld)\n", path, M, H, K, V, (long long)T);
    gdp_ctx_free(ctx);
    void *bufs[] = {q, k, v, beta, g, ini, d_cu, d_ci, d_cidp, d_co, o, fs, cs};
    for (void *b : bufs)
        cudaFree(b);
}

int main(int argc, char **argv) {
    for (auto &e : g_stage_events)
        DEV_CHECK(cudaEventCreate(&e));
    if (argc == 3 && !std::strcmp(argv[1], "--dump")) {
        std::string dir = argv[2];
        dump_case((dir + "/dump_k128.safetensors").c_str(), 2, 2, 128, 128, {100, 37, 200, 0}, 352);
        dump_case((dir + "/dump_k100.safetensors").c_str(), 3, 2, 100, 64, {130, 7, 64}, 210);
        return 0;
    }
    const bool hphases = argc >= 2 && !std::strcmp(argv[1], "--hopper-phases");
    const bool phases = argc >= 2 && (!std::strcmp(argv[1], "--fused-phases") || hphases);
    const bool alone = argc >= 2 && !std::strcmp(argv[1], "--fused-alone");
    const bool sphases = argc >= 2 && !std::strcmp(argv[1], "--state-phases");
    const int only_row = argc == 3 && !std::strcmp(argv[1], "--row") ? std::atoi(argv[2]) : 0;
    const bool timeline = argc >= 2 && !std::strcmp(argv[1], "--split-timeline");
    FILE *tl_csv = timeline && argc >= 3 ? std::fopen(argv[2], "w") : nullptr;
    if (timeline) {
        setenv("GDP_CHUNK_PATH", "hopper", 1); /* the split where a sequence needs it (GDP_CHUNK_SEGMENT applies) */
        g_lab_marks_off = true;
        std::printf("# the Hopper split's pass 1, item by item (global timer; max_seqlen set to the row's longest)\n");
        if (tl_csv != nullptr)
            std::fprintf(tl_csv, "row,kind,record,sm,chunks,start_ns,end_ns\n");
    } else if (alone) {
        setenv("GDP_CHUNK_PATH", "fused", 1);
        std::printf("# fused kernel, median of 10 (us): whole / aux math left out (state alone) / state math left out (aux alone)\n");
    } else if (sphases) {
        setenv("GDP_CHUNK_PATH", "staged", 1);
        std::printf("# state sweep, block (0, 0, 0): clock64 cycles per chunk step of each phase, warp 0 then warp 7\n"
                    "# S16+cs wait(copies) barrier issue(next) h-store v_new barrier update = total\n");
    } else if (hphases) {
        setenv("GDP_CHUNK_PATH", "hopper", 1);
        std::printf("# Hopper kernel, block (0, 0, 0): clock cycles per chunk of each phase, thread 0 (aux) and 128 (state)\n"
                    "# aux:   wait(loads) A+gk+K-scales A's-values(+next-g/beta) diag-blocks inverse+Ai next-loads(test) next-loads(wait) arrive+loop\n"
                    "#        (the next loads' test and wait: the threads' copies only; the copy engine's are the state side's)\n"
                    "# state: wait(aux) K-S16 X'+P+WG-barrier v_new(+Q-norms,Q-S16) out-stores barrier update+out-products(wait) S16+cs+loop\n");
    } else if (phases) {
        setenv("GDP_CHUNK_PATH", "fused", 1);
        std::printf("# fused kernel, block (0, 0, 0): clock64 cycles per chunk of each phase, one thread of each role\n"
                    "# aux:   wait(loads) gk+K-norms A next-loads(test) inverse+Ai(+tests) next-loads(test) next-loads(wait) arrive\n"
                    "# state: wait(aux) Q-norms+P X' v_new outputs state-update S16+loop\n");
    } else {
        std::printf("%-28s %9s %9s %9s %9s %9s %9s\n", "# shape (median us)", "cumsum", "wy", "state", "out", "tail",
                    "total");
        if (getenv("GDP_CHUNK_PATH") != nullptr && !std::strcmp(getenv("GDP_CHUNK_PATH"), "fused"))
            std::printf("# GDP_CHUNK_PATH=fused: the 'cumsum' column is the whole fused kernel\n");
    }
    for (const Row &row : ROWS) {
        if (only_row > 0 && &row != &ROWS[only_row - 1])
            continue;
        const int64_t H = row.H, K = row.K, V = row.V, M = row.M, N = row.n;
        std::vector<int32_t> cu(N + 1, 0);
        for (int i = 0; i < N; i++)
            cu[i + 1] = cu[i] + row.lens[i];
        const int64_t T = cu[N];
        int64_t nc, ncdp;
        DEV_CHECK(gdp_max_chunk_counts(T, N, (int32_t)M, &nc, &ncdp));
        std::vector<int32_t> ci(2 * nc), cidp(2 * ncdp), co(N + 1);
        DEV_CHECK(gdp_build_chunk_descriptors(cu.data(), (int32_t)N, (int32_t)M, T, ci.data(), cidp.data(), co.data(),
                                              &nc, &ncdp));
        void *q = filled(T * H * K, 1, -1, 1, 1), *k = filled(T * M * H * K, 1, -1, 1, 2);
        void *v = filled(T * M * H * V, 1, -1, 1, 3), *beta = filled(T * M * H, 1, 0, 1, 4);
        void *g = filled(T * H, 0, -0.1f, 0, 5), *h0 = filled(N * H * K * V, 0, -0.5f, 0.5f, 6);
        int32_t *d_idx;
        DEV_CHECK(cudaMalloc(&d_idx, (size_t)(2 * (N + 1) + 2 * nc + 2 * ncdp) * 4));
        int32_t *d_cu = d_idx, *d_ci = d_cu + N + 1, *d_cidp = d_ci + 2 * nc, *d_co = d_cidp + 2 * ncdp;
        DEV_CHECK(cudaMemcpy(d_cu, cu.data(), (N + 1) * 4, cudaMemcpyHostToDevice));
        DEV_CHECK(cudaMemcpy(d_ci, ci.data(), 2 * nc * 4, cudaMemcpyHostToDevice));
        DEV_CHECK(cudaMemcpy(d_cidp, cidp.data(), 2 * ncdp * 4, cudaMemcpyHostToDevice));
        DEV_CHECK(cudaMemcpy(d_co, co.data(), (N + 1) * 4, cudaMemcpyHostToDevice));
        void *o, *fs;
        DEV_CHECK(cudaMalloc(&o, (size_t)(T * H * V) * 2));
        DEV_CHECK(cudaMalloc(&fs, (size_t)(N * H * K * V) * 4));
        gdp_ctx_t ctx;
        DEV_CHECK(gdp_ctx_init(&ctx, GDP_BACKEND_CUDA, 0));
        size_t ws;
        DEV_CHECK(gdp_chunk_get_workspace_size(T, N, (int32_t)M, (int32_t)H, (int32_t)K, (int32_t)V, &ws));
        DEV_CHECK(gdp_ctx_reserve_workspace(ctx, ws));
        gdp_chunk_args a;
        std::memset(&a, 0, sizeof a);
        a.q = view(q, GDP_DTYPE_BF16, 4, 1, T, H, K);
        a.k = view(k, GDP_DTYPE_BF16, 4, 1, T * M, H, K);
        a.v = view(v, GDP_DTYPE_BF16, 4, 1, T * M, H, V);
        a.g = view(g, GDP_DTYPE_FP32, 3, 1, T, H);
        a.beta = view(beta, GDP_DTYPE_BF16, 3, 1, T * M, H);
        a.num_householder = (int32_t)M;
        a.cu_seqlens = view(d_cu, GDP_DTYPE_INT32, 1, N + 1);
        a.initial_state = view(h0, GDP_DTYPE_FP32, 4, N, H, K, V);
        a.output_final_state = 1;
        a.use_qk_l2norm_in_kernel = 1;
        a.chunk_indices = view(d_ci, GDP_DTYPE_INT32, 2, nc, 2);
        a.chunk_indices_dp = view(d_cidp, GDP_DTYPE_INT32, 2, ncdp, 2);
        a.chunk_offsets = view(d_co, GDP_DTYPE_INT32, 1, N + 1);
        a.o = view(o, GDP_DTYPE_BF16, 4, 1, T, H, V);
        a.final_state = view(fs, GDP_DTYPE_FP32, 4, N, H, K, V);
        if (timeline) {
            int longest = 0;
            for (int i = 0; i < N; i++)
                longest = std::max(longest, row.lens[i]);
            a.max_seqlen = longest;
            split_timeline(ctx, &a, row.label, tl_csv);
        } else if (alone) {
            std::printf("%-28s", row.label);
            for (int mode = 0; mode < 3; mode++) {
                DEV_CHECK(cudaMemcpyToSymbol(g_fused_skip, &mode, sizeof mode));
                std::vector<float> t;
                for (int it = 0; it < 13; it++) {
                    DEV_CHECK(gdp_chunk_gated_delta_product_varlen(ctx, &a)); /* records stage events 0 and 5 */
                    DEV_CHECK(cudaDeviceSynchronize());
                    float ms = 0;
                    DEV_CHECK(cudaEventElapsedTime(&ms, g_stage_events[0], g_stage_events[5]));
                    if (it >= 3)
                        t.push_back(ms * 1000.0f);
                }
                std::sort(t.begin(), t.end());
                std::printf(" %9.1f", t[t.size() / 2]);
            }
            const int zero = 0;
            DEV_CHECK(cudaMemcpyToSymbol(g_fused_skip, &zero, sizeof zero));
            std::printf("\n");
        } else if (sphases) {
            unsigned long long cyc[2][8];
            phases_call(ctx, &a, g_state_cycles, g_state_phases_on, cyc);
            static const char *const tags[2] = {"w0", "w7"};
            print_phases(row.label, tags, cyc, (double)((row.lens[0] * M + 63) / 64));
        } else if (hphases) {
            const long long before = gdp_cuda_chunk_hopper_calls();
            unsigned long long cyc[2][8];
            phases_call(ctx, &a, g_hopper_cycles, g_hopper_phases_on, cyc);
            static const char *const tags[2] = {"aux  ", "state"};
            if (gdp_cuda_chunk_hopper_calls() == before)
                std::printf("%-28s (the Hopper kernel does not take this shape)\n", row.label);
            else
                print_phases(row.label, tags, cyc, (double)((row.lens[0] * M + 63) / 64));
        } else if (phases) {
            for (int it = 0; it < 3; it++)
                DEV_CHECK(gdp_chunk_gated_delta_product_varlen(ctx, &a));
            DEV_CHECK(cudaDeviceSynchronize());
            unsigned long long zero[16] = {0}, cyc[2][8];
            DEV_CHECK(cudaMemcpyToSymbol(g_fused_cycles, zero, sizeof cyc));
            DEV_CHECK(cudaMemcpyToSymbol(g_fused_last, zero, 2 * sizeof(unsigned long long)));
            DEV_CHECK(gdp_chunk_gated_delta_product_varlen(ctx, &a));
            DEV_CHECK(cudaDeviceSynchronize());
            DEV_CHECK(cudaMemcpyFromSymbol(cyc, g_fused_cycles, sizeof cyc));
            const double chunks = (double)((row.lens[0] * M + 63) / 64);
            static const int aux_order[8] = {1, 2, 3, 6, 4, 0, 5, 7}, state_order[7] = {0, 5, 1, 2, 3, 4, 7};
            std::printf("%-28s aux  ", row.label);
            double sum = 0;
            for (int ph : aux_order) {
                std::printf(" %7.0f", cyc[0][ph] / chunks);
                sum += cyc[0][ph] / chunks;
            }
            std::printf("  = %7.0f\n%-28s state", sum, "");
            sum = 0;
            for (int ph : state_order) {
                std::printf(" %7.0f", cyc[1][ph] / chunks);
                sum += cyc[1][ph] / chunks;
            }
            std::printf("  = %7.0f\n", sum);
        } else { /* per-stage times, median of 20 after 3 warm-ups */
            const int iters = 20;
            std::vector<float> t[6];
            for (int it = 0; it < iters + 3; it++) {
                DEV_CHECK(gdp_chunk_gated_delta_product_varlen(ctx, &a));
                DEV_CHECK(cudaDeviceSynchronize());
                if (it < 3)
                    continue;
                for (int s = 1; s < 6; s++) {
                    float ms;
                    DEV_CHECK(cudaEventElapsedTime(&ms, g_stage_events[s - 1], g_stage_events[s]));
                    t[s - 1].push_back(ms);
                }
                float ms;
                DEV_CHECK(cudaEventElapsedTime(&ms, g_stage_events[0], g_stage_events[5]));
                t[5].push_back(ms);
            }
            std::printf("%-28s", row.label);
            for (auto &v_ : t) {
                std::sort(v_.begin(), v_.end());
                std::printf(" %9.1f", v_[v_.size() / 2] * 1e3);
            }
            std::printf("\n");
        }
        gdp_ctx_free(ctx);
        void *bufs[] = {q, k, v, beta, g, h0, d_idx, o, fs};
        for (void *b : bufs)
            cudaFree(b);
    }
    if (tl_csv != nullptr)
        std::fclose(tl_csv);
    return 0;
}
