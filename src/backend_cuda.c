/*
 * backend_cuda.c: the CUDA half of the projection GEMM (backend.h), for the layers and the LM head:
 *   C[rows, n] = A[rows, k] . B[n, k]^T + beta C, row-major, A and B bf16 or fp16 with C fp32
 *   or A's dtype (the layer's projections), or fp32 throughout (e.g. an LM head); fp32
 *   accumulation (CUBLAS_COMPUTE_32F: no TF32), on cuBLASLt on the ctx's stream.
 * One cuBLASLt handle and one workspace serve every layer of a ctx (ctx->gemm_blas,
 * counted by gdp_gemm_acquire/release), together with a small cache of matmul plans
 * (descriptors + the heuristic's algorithm) keyed by shape, pitches, dtypes and pointer
 * alignment, so a step's GEMMs do no host-side planning after the first step of each
 * bucket and nothing in here synchronizes the host.
 *
 * Row-major to cuBLASLt's column-major: row-major C [rows, n] is column-major C^T [n, rows];
 * C^T = B . A^T, where the weight B [n, k] row-major is column-major [k, n] (ld k) used
 * transposed, and A [rows, k] (pitch lda) is column-major [k, rows] (ld lda) used as is:
 * the "TN" GEMM, the layout cuBLASLt serves best for 16-bit inputs.
 * The skinny kernel (kernels/gemv.h) takes 16-bit operands of a few rows instead: under
 * GDP_GEMM_SKINNY=auto, the default, one or two rows (GDP_GEMV_AUTO_ROWS: with every load of a trip
 * issued before its multiplies it streams the weight at a plain read's rate there and beats
 * cuBLASLt, which it loses to from four rows on; kernels/NOTES-ops.md, thirty-fifth session); on:
 * up to GDP_GEMV_MAX_ROWS rows; off: never (read at every call). The k split over a thread-block
 * cluster (kernels/gemm_splitk.h, an experiment measured slower than cuBLASLt) takes the call only when
 * asked: GDP_GEMM_SPLITK=auto from GDP_GEMM_SPLITK_AUTO_MIN_ROWS rows, on from one, where its grid
 * splits each 128 x 128 tile 2 to 8 ways within one CTA an SM; off or unset never.
 */
#include <string.h>

#include "backend.h"

#ifdef GDP_HAVE_CUDA
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "cuda_check.h"
#include "kernels/gemm_splitk.h"
#include "kernels/gemv.h"

#define GEMM_WORKSPACE_BYTES ((size_t)32 << 20) /* cuBLAS's recommendation for Hopper */
#define GEMM_PLAN_SLOTS 64                     /* distinct GEMM shapes remembered    */
#define GEMM_BLAS_MAGIC 0x67646c62u            /* "gdlb" */

typedef struct gemm_key {
    int64_t     rows, n, k, lda, ldc;
    gdp_dtype_t ab_dtype, c_dtype;
    uint32_t    align_a, align_b, align_c; /* bytes, capped at 256 */
} gemm_key;

typedef struct gemm_plan {
    int                    valid;
    gemm_key               key;
    cublasLtMatmulDesc_t   op;
    cublasLtMatrixLayout_t w_layout, x_layout, c_layout; /* weight, activations, C = D */
    cublasLtMatmulAlgo_t   algo;
} gemm_plan;

typedef struct gemm_blas {
    uint32_t         magic;
    int32_t          refs;
    cublasLtHandle_t handle;
    void            *workspace;
    size_t           workspace_bytes;
    gemm_plan        plans[GEMM_PLAN_SLOTS];
    int32_t          next_victim; /* round-robin replacement once every slot is used */
} gemm_blas;

#define BLAS_CHECK(call, what)                                                                                \
    do {                                                                                                      \
        cublasStatus_t blas_st_ = (call);                                                                     \
        if (blas_st_ != CUBLAS_STATUS_SUCCESS)                                                                \
            GDP_FAIL(GDP_STATUS_CUBLAS_ERROR, "%s: %s failed: %s (%d)", what, #call,                          \
                     cublasLtGetStatusString(blas_st_), (int)blas_st_);                                      \
    } while (0)

static cudaDataType_t cuda_type(gdp_dtype_t dtype) {
    switch (dtype) {
    case GDP_DTYPE_BF16: return CUDA_R_16BF;
    case GDP_DTYPE_FP16: return CUDA_R_16F;
    default: return CUDA_R_32F;
    }
}

/* Largest power of two (<= 256) dividing the address: cuBLASLt picks kernels per alignment. */
static uint32_t ptr_align(const void *p) {
    const uintptr_t a = (uintptr_t)p;
    uint32_t al = 256;
    while (al > 1 && (a & (al - 1)) != 0)
        al >>= 1;
    return al;
}

static void plan_destroy(gemm_plan *p) {
    if (!p->valid)
        return;
    /* teardown: failures here have nobody to report to */
    (void)cublasLtMatrixLayoutDestroy(p->w_layout);
    (void)cublasLtMatrixLayoutDestroy(p->x_layout);
    (void)cublasLtMatrixLayoutDestroy(p->c_layout);
    (void)cublasLtMatmulDescDestroy(p->op);
    p->valid = 0;
}

static void blas_destroy(gemm_blas *b) {
    for (int i = 0; i < GEMM_PLAN_SLOTS; i++)
        plan_destroy(&b->plans[i]);
    if (b->workspace != NULL)
        (void)cudaFree(b->workspace);
    if (b->handle != NULL)
        (void)cublasLtDestroy(b->handle);
    b->magic = 0;
    free(b);
}

gdp_status_t gdp_gemm_cuda_acquire(gdp_ctx_t ctx) {
    gemm_blas *b = ctx->gemm_blas;
    if (b != NULL) {
        if (b->magic != GEMM_BLAS_MAGIC)
            GDP_FAIL(GDP_STATUS_INTERNAL_ERROR, "gdp_layer_init: the ctx's cuBLASLt state is corrupted");
        b->refs++;
        return GDP_STATUS_SUCCESS;
    }
    b = gdp_calloc(1, sizeof *b, "the layers' cuBLASLt state");
    if (b == NULL)
        return GDP_STATUS_SYSTEM_ERROR;
    b->magic = GEMM_BLAS_MAGIC;
    cublasStatus_t bs = cublasLtCreate(&b->handle);
    if (bs != CUBLAS_STATUS_SUCCESS) {
        b->handle = NULL;
        blas_destroy(b);
        GDP_FAIL(GDP_STATUS_CUBLAS_ERROR, "gdp_layer_init: cublasLtCreate failed: %s (%d)",
                 cublasLtGetStatusString(bs), (int)bs);
    }
    cudaError_t err = cudaMalloc(&b->workspace, GEMM_WORKSPACE_BYTES);
    if (err != cudaSuccess) {
        b->workspace = NULL;
        blas_destroy(b);
        GDP_CUDA_FAIL(err, "gdp_layer_init: cudaMalloc of the %zu-byte cuBLASLt workspace failed", GEMM_WORKSPACE_BYTES);
    }
    b->workspace_bytes = GEMM_WORKSPACE_BYTES;
    b->refs = 1;
    ctx->gemm_blas = b;
    return GDP_STATUS_SUCCESS;
}

void gdp_gemm_cuda_release(gdp_ctx_t ctx) {
    gemm_blas *b = ctx->gemm_blas;
    if (b == NULL || b->magic != GEMM_BLAS_MAGIC)
        return;
    if (--b->refs > 0)
        return;
    /* Work still queued may use the workspace: cudaFree waits for the device first. */
    blas_destroy(b);
    ctx->gemm_blas = NULL;
}

/* Builds the descriptors of one shape and asks the heuristic for its best algorithm. */
static gdp_status_t plan_create(gemm_blas *b, const gemm_key *key, gemm_plan *p) {
    static const char *what = "gdp_gemm_nt (cuBLASLt)";
    memset(p, 0, sizeof *p);
    p->key = *key;
    const cudaDataType_t ab = cuda_type(key->ab_dtype), ct = cuda_type(key->c_dtype);
    gdp_status_t st = GDP_STATUS_SUCCESS;
    cublasStatus_t bs;
    cublasLtMatmulPreference_t pref = NULL;
#define PLAN_TRY(call)                                                                                        \
    do {                                                                                                      \
        bs = (call);                                                                                          \
        if (bs != CUBLAS_STATUS_SUCCESS) {                                                                    \
            st = GDP_ERROR(GDP_STATUS_CUBLAS_ERROR, "%s: %s failed: %s (%d) for rows %lld, n %lld, k %lld", what, \
                           #call, cublasLtGetStatusString(bs), (int)bs, (long long)key->rows, (long long)key->n, \
                           (long long)key->k);                                                                \
            goto fail;                                                                                        \
        }                                                                                                     \
    } while (0)
    PLAN_TRY(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t trans_w = CUBLAS_OP_T, trans_x = CUBLAS_OP_N;
    PLAN_TRY(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &trans_w, sizeof trans_w));
    PLAN_TRY(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &trans_x, sizeof trans_x));
    /* column-major: weight [k, n] ld k (transposed), activations [k, rows] ld lda, C [n, rows] ld ldc */
    PLAN_TRY(cublasLtMatrixLayoutCreate(&p->w_layout, ab, (uint64_t)key->k, (uint64_t)key->n, key->k));
    PLAN_TRY(cublasLtMatrixLayoutCreate(&p->x_layout, ab, (uint64_t)key->k, (uint64_t)key->rows, key->lda));
    PLAN_TRY(cublasLtMatrixLayoutCreate(&p->c_layout, ct, (uint64_t)key->n, (uint64_t)key->rows, key->ldc));
    p->valid = 1; /* from here on plan_destroy frees what was created */

    PLAN_TRY(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws = b->workspace_bytes;
    PLAN_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    /* The weight is cuBLASLt's A, the activations its B. */
    PLAN_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &key->align_b,
                                                  sizeof key->align_b));
    PLAN_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &key->align_a,
                                                  sizeof key->align_a));
    PLAN_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &key->align_c,
                                                  sizeof key->align_c));
    PLAN_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &key->align_c,
                                                  sizeof key->align_c));
    cublasLtMatmulHeuristicResult_t result;
    int found = 0;
    memset(&result, 0, sizeof result);
    PLAN_TRY(cublasLtMatmulAlgoGetHeuristic(b->handle, p->op, p->w_layout, p->x_layout, p->c_layout, p->c_layout,
                                            pref, 1, &result, &found));
    if (found < 1) {
        st = GDP_ERROR(GDP_STATUS_UNSUPPORTED,
                       "%s: cuBLASLt has no algorithm for rows %lld, n %lld, k %lld (%s x %s -> %s, pitches %lld, "
                       "%lld); use another shape or GDP_BACKEND_CPU",
                       what, (long long)key->rows, (long long)key->n, (long long)key->k,
                       gdp_dtype_name(key->ab_dtype), gdp_dtype_name(key->ab_dtype), gdp_dtype_name(key->c_dtype),
                       (long long)key->lda, (long long)key->ldc);
        goto fail;
    }
    p->algo = result.algo;
    (void)cublasLtMatmulPreferenceDestroy(pref);
    return GDP_STATUS_SUCCESS;
fail:
#undef PLAN_TRY
    if (pref != NULL)
        (void)cublasLtMatmulPreferenceDestroy(pref);
    if (!p->valid) {
        if (p->op != NULL)
            (void)cublasLtMatmulDescDestroy(p->op);
        if (p->w_layout != NULL)
            (void)cublasLtMatrixLayoutDestroy(p->w_layout);
        if (p->x_layout != NULL)
            (void)cublasLtMatrixLayoutDestroy(p->x_layout);
        if (p->c_layout != NULL)
            (void)cublasLtMatrixLayoutDestroy(p->c_layout);
        memset(p, 0, sizeof *p);
    } else {
        plan_destroy(p);
    }
    return st;
}

/* The plan of a shape: remembered, or built into a free (or the next victim's) slot. */
static gdp_status_t plan_get(gemm_blas *b, const gemm_key *key, const gemm_plan **out) {
    int free_slot = -1;
    for (int i = 0; i < GEMM_PLAN_SLOTS; i++) {
        if (b->plans[i].valid && memcmp(&b->plans[i].key, key, sizeof *key) == 0) {
            *out = &b->plans[i];
            return GDP_STATUS_SUCCESS;
        }
        if (!b->plans[i].valid && free_slot < 0)
            free_slot = i;
    }
    if (free_slot < 0) {
        free_slot = b->next_victim;
        b->next_victim = (b->next_victim + 1) % GEMM_PLAN_SLOTS;
        plan_destroy(&b->plans[free_slot]);
    }
    GDP_CHECK(plan_create(b, key, &b->plans[free_slot]));
    *out = &b->plans[free_slot];
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_gemm_cuda_nt(gdp_ctx_t ctx, int64_t rows, int64_t n, int64_t k, const void *A, int64_t lda,
                              const void *B, gdp_dtype_t ab_dtype, float beta, void *C, int64_t ldc,
                              gdp_dtype_t c_dtype) {
    gemm_blas *b = ctx->gemm_blas;
    if (b == NULL || b->magic != GEMM_BLAS_MAGIC)
        GDP_FAIL(GDP_STATUS_INTERNAL_ERROR,
                 "gdp_gemm_nt: the ctx holds no cuBLASLt state: no layer lives on it (gdp_layer_init "
                 "acquires it; outside a layer call gdp_gemm_acquire first)");
    if (rows == 0 || n == 0)
        return GDP_STATUS_SUCCESS;
    if (lda < k || ldc < n || k < 1)
        GDP_FAIL(GDP_STATUS_INTERNAL_ERROR, "gdp_gemm_nt: pitches lda %lld < k %lld or ldc %lld < n %lld",
                 (long long)lda, (long long)k, (long long)ldc, (long long)n);
    /* a few rows: the skinny kernel (kernels/gemv.h) at up to GDP_GEMV_AUTO_ROWS rows under auto,
     * up to GDP_GEMV_MAX_ROWS under on, never under off; cuBLASLt otherwise */
    const char *skinny_text = NULL;
    static const char *const skinny_spell[3] = {"auto", "on", "off"};
    static const int skinny_value[3] = {GDP_GEMV_AUTO_ROWS, GDP_GEMV_MAX_ROWS, 0};
    const int skinny = gdp_env_choice("GDP_GEMM_SKINNY", skinny_spell, skinny_value, 3, GDP_GEMV_AUTO_ROWS,
                                      &skinny_text);
    if (skinny < 0)
        GDP_FAIL(GDP_STATUS_INVALID_USAGE, "gdp_gemm_nt: GDP_GEMM_SKINNY is \"%s\"; it takes auto, on or off "
                 "(unset: auto)", skinny_text);
    /* the k split over a cluster (kernels/gemm_splitk.h) where it splits: from 3 rows under auto, from
     * one under on; never under off, the default (measured slower than cuBLASLt) */
    const char *splitk_text = NULL;
    static const char *const splitk_spell[3] = {"auto", "on", "off"};
    static const int splitk_value[3] = {GDP_GEMM_SPLITK_AUTO_MIN_ROWS, 1, 0};
    const int splitk_min = gdp_env_choice("GDP_GEMM_SPLITK", splitk_spell, splitk_value, 3, 0, &splitk_text);
    if (splitk_min < 0)
        GDP_FAIL(GDP_STATUS_INVALID_USAGE, "gdp_gemm_nt: GDP_GEMM_SPLITK is \"%s\"; it takes auto, on or off "
                 "(unset: off)", splitk_text);
    if (rows <= skinny && gdp_cuda_gemv_fits(rows, k, A, lda, B, ab_dtype, c_dtype))
        return gdp_cuda_gemv_nt(ctx, rows, n, k, A, lda, B, ab_dtype, beta, C, ldc, c_dtype);
    if (splitk_min > 0 && rows >= splitk_min) {
        const int ways = gdp_cuda_gemm_splitk_ways(ctx, rows, n, k, A, lda, B, ab_dtype, C, ldc, c_dtype);
        if (ways >= 2)
            return gdp_cuda_gemm_splitk_nt(ctx, ways, rows, n, k, A, lda, B, ab_dtype, beta, C, ldc, c_dtype);
    }
    gemm_key key;
    memset(&key, 0, sizeof key); /* the key is compared bytewise: no padding garbage */
    key.rows = rows, key.n = n, key.k = k, key.lda = lda, key.ldc = ldc;
    key.ab_dtype = ab_dtype, key.c_dtype = c_dtype;
    key.align_a = ptr_align(A), key.align_b = ptr_align(B), key.align_c = ptr_align(C);
    const gemm_plan *p = NULL;
    GDP_CHECK(plan_get(b, &key, &p));
    const float alpha = 1.0f;
    BLAS_CHECK(cublasLtMatmul(b->handle, p->op, &alpha, B, p->w_layout, A, p->x_layout, &beta, C, p->c_layout, C,
                              p->c_layout, &p->algo, b->workspace, b->workspace_bytes, (cudaStream_t)ctx->stream),
               "gdp_gemm_nt (cuBLASLt)");
    return GDP_STATUS_SUCCESS;
}

#else /* !GDP_HAVE_CUDA: backend.c never calls these without the CUDA backend */

gdp_status_t gdp_gemm_cuda_acquire(gdp_ctx_t ctx) {
    GDP_FAIL(GDP_STATUS_UNSUPPORTED, "gdp_layer_init: this libgdp was built without the CUDA backend; use "
             "GDP_BACKEND_CPU");
}

void gdp_gemm_cuda_release(gdp_ctx_t ctx) {}

gdp_status_t gdp_gemm_cuda_nt(gdp_ctx_t ctx, int64_t rows, int64_t n, int64_t k, const void *A, int64_t lda,
                              const void *B, gdp_dtype_t ab_dtype, float beta, void *C, int64_t ldc,
                              gdp_dtype_t c_dtype) {
    GDP_FAIL(GDP_STATUS_UNSUPPORTED, "gdp_gemm_nt: this libgdp was built without the CUDA backend; use "
             "GDP_BACKEND_CPU");
}

#endif
