/*
 * gemm_skinny.cu: what cuBLASLt can do for the decode step's projections at 8 to 256 rows, against
 * the algorithm its heuristic picks first (the one the library runs, src/backend_cuda.c): the
 * measurement under issue 11's TPOT at B = 128, where ncu put in_proj (7728 x 2048, 31.7 MB) at
 * 12.0 us and out_proj (2048 x 2048, 8.4 MB, the residual folded with beta = 1) at 7.9 us on the
 * H200 (thirty-seventh session), against 7.6 and 2.0 us of bytes at 4.17 TB/s: with 128 x 64 tiles
 * out_proj runs 32 CTAs on 132 SMs. A developer tool that links only cuBLASLt:
 *   nvcc -O3 -arch=sm_90 -o gemm_skinny kernels/dev/gemm_skinny.cu -lcublasLt && ./gemm_skinny
 * Cases, per shape and row count:
 *   - heur i: the heuristic's i-th result as returned (i = 0 is the library's choice);
 *   - heur i splitK s: the same algorithm with its k split s ways (the partial sums reduced in the
 *     compute type through the workspace, a fixed order: cuBLASLt's COMPUTE_TYPE scheme), where
 *     cublasLtMatmulAlgoCheck accepts it.
 * Each case is a chain of launches over distinct copies of the weight (together over three times the
 * L2, so no launch finds its weight in L2, as in a layer step whose weights exceed it), captured as
 * one CUDA graph and replayed; us a launch = a replay's median / the chain's length (so a launch's
 * boundary, about 1 us in a replayed graph, is in every figure, as in the layer's graph). Every case's
 * C is checked against a host product of the same bf16 values on every 7th column (relative RMS < 1e-2).
 */
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "chain_timer.cuh"
#include "dev_check.cuh"

#define LT(call)                                                                                                 \
    do {                                                                                                         \
        const cublasStatus_t s_ = (call);                                                                        \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                                       \
            fprintf(stderr, "gemm_skinny: %s failed: %s (line %d)\n", #call, cublasLtGetStatusString(s_), __LINE__); \
            exit(1);                                                                                             \
        }                                                                                                        \
    } while (0)

typedef __nv_bfloat16 bf16;
constexpr int REPLAYS = 30, HEUR = 12, SPLIT_OF = 3;
constexpr int CHECK_STRIDE = 7; /* the host product checks every 7th column (the head's 256 rows in seconds) */
constexpr size_t WORKSPACE = (size_t)32 << 20; /* the library's (cuBLAS's recommendation for Hopper) */

struct Shape {
    const char *name;
    int n, k;
    cudaDataType_t c_type;
    float beta;
};

struct Gemm { /* the library's layout: weight [n, k] (cuBLASLt's A, transposed), x [rows, k], C [rows, n] */
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t w, x, c;
};

static Gemm gemm_make(const Shape &s, int rows) {
    Gemm g;
    LT(cublasLtMatmulDescCreate(&g.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t tw = CUBLAS_OP_T, tx = CUBLAS_OP_N;
    LT(cublasLtMatmulDescSetAttribute(g.op, CUBLASLT_MATMUL_DESC_TRANSA, &tw, sizeof tw));
    LT(cublasLtMatmulDescSetAttribute(g.op, CUBLASLT_MATMUL_DESC_TRANSB, &tx, sizeof tx));
    LT(cublasLtMatrixLayoutCreate(&g.w, CUDA_R_16BF, s.k, s.n, s.k));
    LT(cublasLtMatrixLayoutCreate(&g.x, CUDA_R_16BF, s.k, rows, s.k));
    LT(cublasLtMatrixLayoutCreate(&g.c, s.c_type, s.n, rows, s.n));
    return g;
}

static void algo_describe(const cublasLtMatmulAlgo_t &a, char *out, size_t cap) {
    int id = 0;
    uint32_t tile = 0, stages = 0, splitk = 0, red = 0, swizzle = 0, custom = 0, cluster = 0;
    size_t w;
    cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &w);
    cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &w);
    cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages, &w);
    cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof splitk, &w);
    cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &red, sizeof red, &w);
    cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swizzle, sizeof swizzle, &w);
    cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &custom, sizeof custom, &w);
    cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster, sizeof cluster, &w);
    snprintf(out, cap, "algo %2d tile %3u stages %2u splitK %u red %u swz %u cust %u cluster %2u", id, tile, stages,
             splitk, red, swizzle, custom, cluster);
}

static float bf(bf16 x) { return __bfloat162float(x); }

static void run_shape(cublasLtHandle_t lt, const Shape &s, int rows, size_t l2, void *ws, cudaStream_t st) {
    const size_t wbytes = (size_t)s.n * s.k * sizeof(bf16), ces = s.c_type == CUDA_R_32F ? 4 : 2;
    const int copies = (int)std::max<size_t>(4, (3 * l2 + wbytes - 1) / wbytes);
    std::vector<bf16> hw((size_t)s.n * s.k), hx((size_t)rows * s.k);
    uint32_t seed = 12345;
    auto rnd = [&]() { seed = seed * 1664525u + 1013904223u; return ((seed >> 8) & 0xffff) / 32768.0f - 1.0f; };
    for (auto &v : hw)
        v = __float2bfloat16_rn(rnd() * 0.05f);
    for (auto &v : hx)
        v = __float2bfloat16_rn(rnd());
    std::vector<bf16 *> dw(copies);
    for (int c = 0; c < copies; c++) {
        CK(cudaMalloc(&dw[c], wbytes));
        CK(cudaMemcpy(dw[c], hw.data(), wbytes, cudaMemcpyHostToDevice));
    }
    bf16 *dx;
    void *dc;
    CK(cudaMalloc(&dx, hx.size() * sizeof(bf16)));
    CK(cudaMalloc(&dc, (size_t)rows * s.n * ces));
    CK(cudaMemcpy(dx, hx.data(), hx.size() * sizeof(bf16), cudaMemcpyHostToDevice));
    std::vector<double> ref((size_t)rows * s.n);
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < s.n; j += CHECK_STRIDE) {
            double acc = 0;
            for (int i = 0; i < s.k; i++)
                acc += (double)bf(hx[(size_t)r * s.k + i]) * bf(hw[(size_t)j * s.k + i]);
            ref[(size_t)r * s.n + j] = acc;
        }

    Gemm g = gemm_make(s, rows);
    cublasLtMatmulPreference_t pref;
    LT(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t wsb = WORKSPACE;
    LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb));
    cublasLtMatmulHeuristicResult_t res[HEUR];
    int found = 0;
    LT(cublasLtMatmulAlgoGetHeuristic(lt, g.op, g.w, g.x, g.c, g.c, pref, HEUR, res, &found));
    struct Case {
        cublasLtMatmulAlgo_t algo;
        char label[32];
    };
    std::vector<Case> cases;
    for (int i = 0; i < found; i++) {
        Case c;
        c.algo = res[i].algo;
        snprintf(c.label, sizeof c.label, "heur %d", i);
        cases.push_back(c);
    }
    const uint32_t splits[] = {2, 3, 4, 6, 8};
    for (int i = 0; i < std::min(found, SPLIT_OF); i++)
        for (uint32_t sk : splits) {
            Case c;
            c.algo = res[i].algo;
            const uint32_t red = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
            if (cublasLtMatmulAlgoConfigSetAttribute(&c.algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &sk, sizeof sk) !=
                    CUBLAS_STATUS_SUCCESS ||
                cublasLtMatmulAlgoConfigSetAttribute(&c.algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &red,
                                                     sizeof red) != CUBLAS_STATUS_SUCCESS)
                continue;
            cublasLtMatmulHeuristicResult_t chk;
            if (cublasLtMatmulAlgoCheck(lt, g.op, g.w, g.x, g.c, g.c, &c.algo, &chk) != CUBLAS_STATUS_SUCCESS ||
                chk.workspaceSize > WORKSPACE)
                continue;
            snprintf(c.label, sizeof c.label, "heur %d splitK %u", i, sk);
            cases.push_back(c);
        }
    printf("%s n %d k %d rows %d: %.1f MB of weight, %.2f us at 4.17 TB/s; %d heuristic results, %d copies\n", s.name,
           s.n, s.k, rows, wbytes / 1e6, wbytes / 4.17e12 * 1e6, found, copies);
    const float one = 1.0f, zero = 0.0f;
    for (const Case &cs : cases) {
        /* check on copy 0 with beta 0 */
        CK(cudaMemset(dc, 0, (size_t)rows * s.n * ces));
        if (cublasLtMatmul(lt, g.op, &one, dw[0], g.w, dx, g.x, &zero, dc, g.c, dc, g.c, &cs.algo, ws, WORKSPACE, st) !=
            CUBLAS_STATUS_SUCCESS) {
            printf("  %-16s refused at run time\n", cs.label);
            continue;
        }
        CK(cudaStreamSynchronize(st));
        std::vector<unsigned char> hc((size_t)rows * s.n * ces);
        CK(cudaMemcpy(hc.data(), dc, hc.size(), cudaMemcpyDeviceToHost));
        double num = 0, den = 0;
        for (size_t i = 0; i < ref.size(); i++) {
            if ((int)(i % s.n) % CHECK_STRIDE != 0)
                continue;
            const double v = ces == 4 ? (double)reinterpret_cast<const float *>(hc.data())[i]
                                      : (double)bf(reinterpret_cast<const bf16 *>(hc.data())[i]);
            num += (v - ref[i]) * (v - ref[i]), den += ref[i] * ref[i];
        }
        const double rel = std::sqrt(num / (den > 0 ? den : 1));
        const float med = chain_median_us(st, copies, REPLAYS, [&](int c, cudaStream_t cs_) {
            LT(cublasLtMatmul(lt, g.op, &one, dw[c], g.w, dx, g.x, &s.beta, dc, g.c, dc, g.c, &cs.algo, ws, WORKSPACE,
                              cs_));
        });
        char desc[160];
        algo_describe(cs.algo, desc, sizeof desc);
        printf("  %-16s %8.2f us  %5.2f TB/s  rel rms %.1e%s  %s\n", cs.label, med, wbytes / (med * 1e-6) / 1e12, rel,
               rel < 1e-2 ? "" : " WRONG", desc);
    }
    LT(cublasLtMatmulPreferenceDestroy(pref));
    cublasLtMatmulDescDestroy(g.op);
    cublasLtMatrixLayoutDestroy(g.w);
    cublasLtMatrixLayoutDestroy(g.x);
    cublasLtMatrixLayoutDestroy(g.c);
    for (bf16 *p : dw)
        CK(cudaFree(p));
    CK(cudaFree(dx));
    CK(cudaFree(dc));
}

int main(int argc, char **argv) {
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("gemm_skinny: %s, %d SMs, L2 %.1f MB; cuBLASLt %zu\n", prop.name, prop.multiProcessorCount,
           prop.l2CacheSize / 1e6, cublasLtGetVersion());
    cublasLtHandle_t lt;
    LT(cublasLtCreate(&lt));
    void *ws;
    CK(cudaMalloc(&ws, WORKSPACE));
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    const Shape shapes[] = {{"in_proj", 7728, 2048, CUDA_R_16BF, 0.0f},
                            {"out_proj", 2048, 2048, CUDA_R_16BF, 1.0f},
                            {"head", 32000, 2048, CUDA_R_32F, 0.0f}};
    std::vector<int> rows = {8, 32, 64, 128, 256};
    if (argc > 1) { /* a comma-separated row list */
        rows.clear();
        for (char *p = argv[1]; *p;) {
            rows.push_back((int)strtol(p, &p, 10));
            if (*p == ',')
                p++;
        }
    }
    for (const Shape &s : shapes)
        for (int r : rows)
            run_shape(lt, s, r, (size_t)prop.l2CacheSize, ws, st);
    CK(cudaFree(ws));
    cublasLtDestroy(lt);
    return 0;
}
