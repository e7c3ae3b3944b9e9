/*
 * prepare.cu: the CUDA kernel of gdp_decode_prepare and gdp_prefill_prepare (gdp-math.md 6):
 * one launch splits the post-conv activations x into value, key and query (GQA-expanded,
 * Householder copies folded into the row dimension) and gates ba into beta = sigmoid(b)
 * and g = (-exp(A_log)) * softplus(a + dt_bias).
 *
 * Bitwise contract: q, k and v are bit copies; beta and g repeat PyTorch CUDA eager's
 * operations one by one (expf, log1pf, IEEE division, each add and multiply rounded on
 * its own: the __f*_rn intrinsics keep nvcc from contracting them into FMAs), so the
 * results equal the golden files bit for bit. A pure map: every output element is
 * written by exactly one thread, no atomics, no reductions, no tuning state.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "dtype_access.cuh"
#include "prepare_math.cuh"
#include "gdp_kernels.h"
#include "src/cuda_check.h"
#include "src/internal.h"

// CUDA kernels

namespace {

/* Threads per block of the prepare kernel, and output units per thread. */
constexpr int PREPARE_THREADS = 128;
constexpr int PREPARE_UNITS = 4;

/* Everything the kernel needs, by value (strides in elements). */
struct PrepareParams {
    const void *x;
    const void *ba;
    const float *A_log;
    const void *dt_bias;
    void *query, *key, *value, *beta;
    float *g;
    gdp_dtype_t ba_dtype, dt_bias_dtype;
    int64_t x_stride_n, x_stride_t;   /* rows of x may be strided */
    int64_t ba_stride_n, ba_stride_t; /* rows of ba may be strided */
    int32_t T;                        /* tokens per request (S for decode) */
    int32_t M, H, G, P, N;
    int32_t heads_per_group;
    int64_t k_base, q_base; /* offsets of the key and query blocks inside a row of x */
    /* Per (request, token) row: outputs counted in vector units, then scalar units. */
    int32_t value_units, key_units, query_units, beta_units, g_units;
};


/* A bit-copy unit of VEC elements of ELEM bytes: 16-byte vectors on the fast path. */
template <int ELEM, int VEC> struct CopyUnit;
template <> struct CopyUnit<2, 1> { using type = uint16_t; };
template <> struct CopyUnit<4, 1> { using type = uint32_t; };
template <> struct CopyUnit<2, 8> { using type = uint4; };
template <> struct CopyUnit<4, 4> { using type = uint4; };

/* PREPARE_UNITS output units per thread of one (request, token) row; blockIdx.x is the
 * row, blockIdx.y the slice of the row's units. Units run value | key | query (VEC
 * elements each) | beta | g (one element each). A thread issues the loads of all its
 * copy units before its first store, so several 16-byte loads are in flight per thread.
 * DECODE interleaves q onto copy M-1 and g onto copy 0 with zeros elsewhere; prefill
 * keeps one of each per token. */
template <int ELEM, int VEC, bool DECODE>
__global__ void __launch_bounds__(PREPARE_THREADS) prepare_kernel(const PrepareParams p) {
    using Unit = typename CopyUnit<ELEM, VEC>::type;
    const int64_t row = blockIdx.x; /* n * T + t */
    const int64_t req = row / p.T, tok = row - req * p.T;
    const char *x_row = static_cast<const char *>(p.x) + (req * p.x_stride_n + tok * p.x_stride_t) * ELEM;
    const int64_t ba_row = req * p.ba_stride_n + tok * p.ba_stride_t;
    const int32_t copy_units = p.value_units + p.key_units + p.query_units;

    Unit val[PREPARE_UNITS];
    Unit *dst[PREPARE_UNITS];
#pragma unroll
    for (int i = 0; i < PREPARE_UNITS; i++) {
        int32_t u = (int32_t)(blockIdx.y * (PREPARE_THREADS * PREPARE_UNITS) + i * PREPARE_THREADS + threadIdx.x);
        dst[i] = nullptr;
        val[i] = Unit{};
        if (u < p.value_units) {
            /* value[(t*M + m), h, :] = x[(m*H + h)*P + :]: the row's first M*H*P elements. */
            val[i] = *reinterpret_cast<const Unit *>(x_row + (int64_t)u * VEC * ELEM);
            dst[i] = reinterpret_cast<Unit *>(p.value) + row * p.value_units + u;
        } else if (u < p.value_units + p.key_units) {
            /* key[(t*M + m), h, c] = x[K_BASE + (m*G + h / (H/G))*N + c]. */
            u -= p.value_units;
            const int32_t e = u * VEC;
            const int32_t c = e % p.N, mh = e / p.N;
            const int32_t h = mh % p.H, m = mh / p.H;
            const int64_t src = p.k_base + (int64_t)(m * p.G + h / p.heads_per_group) * p.N + c;
            val[i] = *reinterpret_cast<const Unit *>(x_row + src * ELEM);
            dst[i] = reinterpret_cast<Unit *>(p.key) + row * p.key_units + u;
        } else if (u < copy_units) {
            /* query[t(*M + M-1), h, c] = x[Q_BASE + (h / (H/G))*N + c]; decode: zero elsewhere. */
            u -= p.value_units + p.key_units;
            const int32_t e = u * VEC;
            const int32_t c = e % p.N, mh = e / p.N;
            const int32_t h = mh % p.H, m = mh / p.H; /* prefill: m == 0 */
            if (!DECODE || m == p.M - 1) {
                const int64_t src = p.q_base + (int64_t)(h / p.heads_per_group) * p.N + c;
                val[i] = *reinterpret_cast<const Unit *>(x_row + src * ELEM);
            }
            dst[i] = reinterpret_cast<Unit *>(p.query) + row * p.query_units + u;
        } else if (u < copy_units + p.beta_units) {
            /* beta[(t*M + m), h] = sigmoid(b[m*H + h]), stored in ba's dtype. */
            u -= copy_units;
            const float b = load_as_float(p.ba, p.ba_dtype, ba_row + u);
            store_from_float(p.beta, p.ba_dtype, row * p.beta_units + u, eager_sigmoid(b));
        } else if (u < copy_units + p.beta_units + p.g_units) {
            /* decode: g[(t*M + m), h] nonzero only for m == 0; prefill: g[t, h]. */
            u -= copy_units + p.beta_units;
            const int32_t h = u % p.H, m = u / p.H;
            float gv = 0.0f;
            if (!DECODE || m == 0) {
                const float a = load_as_float(p.ba, p.ba_dtype, ba_row + (int64_t)p.M * p.H + h);
                gv = eager_decay(a, load_as_float(p.dt_bias, p.dt_bias_dtype, h), p.A_log[h]);
            }
            p.g[row * p.g_units + u] = gv;
        }
    }
#pragma unroll
    for (int i = 0; i < PREPARE_UNITS; i++)
        if (dst[i] != nullptr)
            *dst[i] = val[i];
}

template <int ELEM, int VEC>
cudaError_t launch_prepare(const PrepareParams &p, int decode, dim3 grid, cudaStream_t stream) {
    if (decode)
        prepare_kernel<ELEM, VEC, true><<<grid, PREPARE_THREADS, 0, stream>>>(p);
    else
        prepare_kernel<ELEM, VEC, false><<<grid, PREPARE_THREADS, 0, stream>>>(p);
    return cudaGetLastError();
}


} // namespace

// kernel launchers

/* gates_only: beta and g alone (the prefill front wrote q, k and v from the conv). */
static gdp_status_t prepare_launch(struct gdp_ctx *ctx, const gdp_prepare_args *a, int decode, bool gates_only) {
    const char *op = decode ? "gdp_decode_prepare" : "gdp_prefill_prepare";
    const int64_t n = a->x.shape[0], T = a->x.shape[1];
    const int64_t M = a->num_householder, H = a->num_heads, G = a->num_groups, P = a->head_dim,
                  N = a->state_dim;
    const int elem = (int)gdp_dtype_size(a->x.dtype);
    const int64_t rows = n * T;
    if (rows == 0)
        return GDP_STATUS_SUCCESS;

    /* Per-row element counts of each output, and the whole row's units must fit int32. */
    const int64_t value_elems = M * H * P, key_elems = M * H * N, query_elems = (decode ? M : 1) * H * N;
    const int64_t beta_elems = M * H, g_elems = (decode ? M : 1) * H;
    if (value_elems + key_elems + query_elems + beta_elems + g_elems > (int64_t)INT32_MAX / 2 || T > INT32_MAX)
        GDP_FAIL(GDP_STATUS_UNSUPPORTED,
                 "%s: one row of outputs holds %lld elements (M %lld, H %lld, P %lld, N %lld); the CUDA kernel "
                 "indexes a row with int32, use smaller heads or the CPU backend",
                 op, (long long)(value_elems + key_elems + query_elems + beta_elems + g_elems), (long long)M,
                 (long long)H, (long long)P, (long long)N);

    PrepareParams p;
    p.x = a->x.data;
    p.ba = a->ba.data;
    p.A_log = static_cast<const float *>(a->A_log.data);
    p.dt_bias = a->dt_bias.data;
    p.query = a->query.data;
    p.key = a->key.data;
    p.value = a->value.data;
    p.beta = a->beta.data;
    p.g = static_cast<float *>(a->g.data);
    p.ba_dtype = a->ba.dtype;
    p.dt_bias_dtype = a->dt_bias.dtype;
    p.x_stride_n = gdp_tensor_stride(&a->x, 0);
    p.x_stride_t = gdp_tensor_stride(&a->x, 1);
    p.ba_stride_n = gdp_tensor_stride(&a->ba, 0);
    p.ba_stride_t = gdp_tensor_stride(&a->ba, 1);
    p.T = (int32_t)T;
    p.M = (int32_t)M;
    p.H = (int32_t)H;
    p.G = (int32_t)G;
    p.P = (int32_t)P;
    p.N = (int32_t)N;
    p.heads_per_group = (int32_t)(H / G);
    p.k_base = M * H * P;
    p.q_base = M * H * P + M * G * N;

    /* 16-byte copies when every copied run, row start and pointer allows them. */
    const int vec = 16 / elem;
    const bool vector_ok = P % vec == 0 && N % vec == 0 && p.x_stride_n % vec == 0 && p.x_stride_t % vec == 0 &&
                           aligned16(p.x) && aligned16(p.query) && aligned16(p.key) && aligned16(p.value);
    const int unit = vector_ok ? vec : 1;
    p.value_units = gates_only ? 0 : (int32_t)(value_elems / unit);
    p.key_units = gates_only ? 0 : (int32_t)(key_elems / unit);
    p.query_units = gates_only ? 0 : (int32_t)(query_elems / unit);
    p.beta_units = (int32_t)beta_elems;
    p.g_units = (int32_t)g_elems;

    const int64_t units = (int64_t)p.value_units + p.key_units + p.query_units + p.beta_units + p.g_units;
    const int64_t slices = (units + PREPARE_THREADS * PREPARE_UNITS - 1) / (PREPARE_THREADS * PREPARE_UNITS);
    if (rows > INT32_MAX || slices > 65535)
        GDP_FAIL(GDP_STATUS_UNSUPPORTED,
                 "%s: %lld rows x %lld blocks per row exceed the CUDA grid; split the call into fewer tokens", op,
                 (long long)rows, (long long)slices);
    const dim3 grid((unsigned)rows, (unsigned)slices);
    cudaStream_t stream = static_cast<cudaStream_t>(ctx->stream);

    cudaError_t err;
    if (elem == 2)
        err = vector_ok ? launch_prepare<2, 8>(p, decode, grid, stream) : launch_prepare<2, 1>(p, decode, grid, stream);
    else
        err = vector_ok ? launch_prepare<4, 4>(p, decode, grid, stream) : launch_prepare<4, 1>(p, decode, grid, stream);
    GDP_CUDA_LAUNCH_CHECK(op, err, "grid %lld x %lld", (long long)rows, (long long)slices);
    return GDP_STATUS_SUCCESS;
}

extern "C" gdp_status_t gdp_cuda_prepare(struct gdp_ctx *ctx, const gdp_prepare_args *a, int decode) {
    return prepare_launch(ctx, a, decode, false);
}

extern "C" gdp_status_t gdp_cuda_prepare_gates(struct gdp_ctx *ctx, const gdp_prepare_args *a) {
    return prepare_launch(ctx, a, 0, true);
}
