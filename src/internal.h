/*
 * internal.h: what the library's own C files share and users never see: the context
 * struct, error recording and check macros, and tensor helpers (shape checks, strided
 * element access with double values) used by the op front-ends and the CPU backend.
 */
#ifndef GDP_INTERNAL_H
#define GDP_INTERNAL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "gdp/gdp.h"

#ifdef __cplusplus
extern "C" {
#endif

#define GDP_CTX_MAGIC 0x67647063u /* "gdpc" */

struct gdp_ctx {
    uint32_t      magic;
    gdp_backend_t backend;
    int32_t       device;
    void         *stream;          /* cudaStream_t on CUDA, NULL = default stream */
    void         *workspace;       /* device scratch owned by the ctx (CUDA)      */
    size_t        workspace_bytes;
    uint32_t      magic_end;
    void         *gemm_blas;      /* cuBLASLt handle + workspace of the layers on this ctx
                                      (src/backend_cuda.c; created by the first gdp_layer_init,
                                      freed by the last gdp_layer_free), NULL otherwise */
    int32_t       debug_checks;    /* 1: ops refuse non-finite inputs and g > 0 before writing
                                      (gdp_ctx_set_debug_checks, GDP_DEBUG_CHECKS; op_checks.c) */
    void         *arrivals;        /* CUDA: zeroed counters of the fused decode norm
                                      (kernels/recurrent.cu), NULL until its first use */
    int64_t       workspace_grows; /* reallocations of `workspace` (the chunk op's): a CUDA graph
                                      captured before holds the freed one (the engine checks none
                                      happens after its warm-up step; gdp_model_workspace_grows) */
};

/* ---- errors -------------------------------------------------------------- */
/* Records `status` with a printf-style message plus file:line, returns status. */
gdp_status_t gdp_set_error(gdp_status_t status, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* The rank shown in error messages (set by the comm layer; -1 = single process). */
void gdp_set_error_rank(int rank);

#define GDP_FAIL(status, ...) return gdp_set_error((status), __FILE__, __LINE__, __VA_ARGS__)
#define GDP_ERROR(status, ...) gdp_set_error((status), __FILE__, __LINE__, __VA_ARGS__)
/* An op front-end's CUDA branch: returns the CUDA launcher's status, or, in a libgdp built without
 * the CUDA backend, fails UNSUPPORTED naming the op (the launcher call is then not compiled). */
#ifdef GDP_HAVE_CUDA
#define GDP_CUDA_OP(op, call) return (call)
#else
#define GDP_CUDA_OP(op, call)                                                                              \
    GDP_FAIL(GDP_STATUS_UNSUPPORTED, "%s: this libgdp was built without the CUDA backend; use GDP_BACKEND_CPU", \
             (op))
#endif
/* Propagates a failing status (the message is already recorded). */
#define GDP_CHECK(call)                                 \
    do {                                                \
        gdp_status_t gdp_check_st_ = (call);            \
        if (gdp_check_st_ != GDP_STATUS_SUCCESS)        \
            return gdp_check_st_;                       \
    } while (0)
#define GDP_CHECK_GOTO(call, st, label)                 \
    do {                                                \
        (st) = (call);                                  \
        if ((st) != GDP_STATUS_SUCCESS)                 \
            goto label;                                 \
    } while (0)

/* Validates a ctx handle (NULL, freed or foreign pointers) and returns its status. */
gdp_status_t gdp_ctx_check(gdp_ctx_t ctx, const char *op);

/* ---- tensors -------------------------------------------------------------- */
#define GDP_ANY (-1) /* wildcard extent in gdp_check_tensor shapes */

/* Bit masks of accepted dtypes. */
#define GDP_DT(d)        (1u << (d))
#define GDP_DT_FLOAT     (GDP_DT(GDP_DTYPE_FP32) | GDP_DT(GDP_DTYPE_BF16) | GDP_DT(GDP_DTYPE_FP16))
#define GDP_DT_HALF      (GDP_DT(GDP_DTYPE_BF16) | GDP_DT(GDP_DTYPE_FP16))
#define GDP_DT_INT32     GDP_DT(GDP_DTYPE_INT32)

/* The layers' activation and GEMM weight dtype on a backend: fp32 on the CPU reference, bf16
 * with fp32 accumulation on CUDA (as upstream). The conv state holds pre-conv inputs, which are
 * in this dtype, so a conv state of this dtype holds them exactly (gdp_layer_get_act_dtype). */
static inline gdp_dtype_t gdp_backend_act_dtype(gdp_backend_t backend) {
    return backend == GDP_BACKEND_CPU ? GDP_DTYPE_FP32 : GDP_DTYPE_BF16;
}
struct gdp_layer;
struct gdp_model;
/* Reallocations of a layer's step workspace since its init (src/layer.c), and of every workspace a
 * model's steps use: its layers' and its ctx's (src/model.c). A graph captured before one holds the
 * freed buffer, so the engine checks that none happens after its warm-up step. */
int64_t gdp_layer_workspace_grows(const struct gdp_layer *layer);
int64_t gdp_model_workspace_grows(const struct gdp_model *model);

static inline bool gdp_tensor_present(const gdp_tensor *t) { return t != NULL && t->data != NULL; }

/* Checks that `t` (named `name` in the message of op `op`) is present, has
 * `ndim` dims matching `shape` (GDP_ANY matches anything) and a dtype in `dtypes`.
 * Sets a message such as "op: k has shape [1, 100, 2, 64], expected [1, 200, 2, 64]". */
gdp_status_t gdp_check_tensor(const char *op, const char *name, const gdp_tensor *t, int32_t ndim,
                              const int64_t *shape, uint32_t dtypes);
/* Fails unless the tensor is row-major contiguous. */
gdp_status_t gdp_check_contiguous(const char *op, const char *name, const gdp_tensor *t);
/* Formats a shape as "[a, b, c]" into buf. */
const char *gdp_shape_str(char *buf, size_t n, int32_t ndim, const int64_t *shape);

bool    gdp_tensor_is_contiguous(const gdp_tensor *t);
/* Stride of dim d in elements (row-major when the view's strides are all 0). */
int64_t gdp_tensor_stride(const gdp_tensor *t, int32_t d);
/* Element offset of the logical row-major index `flat`. */
int64_t gdp_tensor_offset(const gdp_tensor *t, int64_t flat);

/* Element load/store through a float/int dtype, as double. Stores round to nearest even. */
double gdp_load_elem(const void *base, gdp_dtype_t dtype, int64_t offset);
void   gdp_store_elem(void *base, gdp_dtype_t dtype, int64_t offset, double value);
static inline double gdp_tensor_get(const gdp_tensor *t, int64_t flat) {
    return gdp_load_elem(t->data, t->dtype, gdp_tensor_offset(t, flat));
}
static inline void gdp_tensor_set(gdp_tensor *t, int64_t flat, double v) {
    gdp_store_elem(t->data, t->dtype, gdp_tensor_offset(t, flat), v);
}
/* Copies logical elements [start, start + n) to/from a double array. */
void gdp_tensor_read_f64(const gdp_tensor *t, int64_t start, int64_t n, double *dst);
void gdp_tensor_write_f64(gdp_tensor *t, int64_t start, int64_t n, const double *src);
/* Whole tensor as a fresh double array (NULL + SYSTEM_ERROR message when out of memory). */
double *gdp_tensor_to_f64(const gdp_tensor *t);

/* Rounds double to bf16 directly (no double rounding through float). */
uint16_t gdp_double_to_bf16(double x);

/* ---- checked arithmetic ------------------------------------------------------
 * For every size that comes from a file or a user (shapes, lengths, counts): each returns
 * false, leaving *out untouched, when an operand is negative or the result overflows. */
static inline bool gdp_mul_i64(int64_t a, int64_t b, int64_t *out) {
    int64_t r;
    if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &r))
        return false;
    *out = r;
    return true;
}
static inline bool gdp_add_i64(int64_t a, int64_t b, int64_t *out) {
    int64_t r;
    if (a < 0 || b < 0 || __builtin_add_overflow(a, b, &r))
        return false;
    *out = r;
    return true;
}
/* Elements of a shape (1 for ndim 0). */
static inline bool gdp_shape_numel(int32_t ndim, const int64_t *shape, int64_t *out) {
    int64_t n = 1;
    for (int32_t d = 0; d < ndim; d++)
        if (!gdp_mul_i64(n, shape[d], &n))
            return false;
    *out = n;
    return true;
}
/* Bytes of `numel` elements of `elem_size` bytes, as a size_t that also fits int64. */
static inline bool gdp_bytes_of(int64_t numel, size_t elem_size, size_t *out) {
    int64_t b;
    if (elem_size > (size_t)INT64_MAX || !gdp_mul_i64(numel, (int64_t)elem_size, &b) || (uint64_t)b > SIZE_MAX)
        return false;
    *out = (size_t)b;
    return true;
}

/* ---- op checks (src/op_checks.c) ------------------------------------------------
 * Aliasing: every output (and in-place cache) of an op must not overlap any other buffer of
 * the call; inputs may overlap each other. Absent or empty tensors take no bytes. An input
 * marked in_place_ok may be exactly the output (same data, dtype and shape, contiguous: ops
 * whose every element is read before it is written, e.g. the norms row by row). */
typedef enum gdp_buffer_role { GDP_BUF_IN, GDP_BUF_OUT, GDP_BUF_INOUT } gdp_buffer_role;
typedef struct gdp_op_buffer {
    const char      *name;
    const gdp_tensor *t;
    gdp_buffer_role  role;
    bool             in_place_ok;
} gdp_op_buffer;
gdp_status_t gdp_check_aliasing(const char *op, const gdp_op_buffer *bufs, int32_t n);
/* The debug-checked mode: with ctx->debug_checks, INVALID_ARGUMENT naming the element unless
 * every value of float tensor t (absent: passes) is finite, and <= 0 when nonpositive. Copies
 * device tensors to the host (synchronizing; refused under CUDA graph capture). */
gdp_status_t gdp_debug_check_values(gdp_ctx_t ctx, const char *op, const char *name, const gdp_tensor *t,
                                    bool nonpositive);
/* GDP_DEBUG_CHECKS set to anything but "" or "0": new contexts start with the checks on. */
bool gdp_debug_checks_from_env(void);
/* The value of environment variable `name` among its n spellings (spell[i] gives value[i]);
 * unset or empty gives `unset`, anything else -1; *text (may be NULL) gets the raw value for
 * the caller's message. The kernels' switches (GDP_CHUNK_PATH, GDP_DECODE_END, ...) read it on
 * every call, so a test can change them between calls (a getenv is far cheaper than a launch). */
int gdp_env_choice(const char *name, const char *const *spell, const int *value, int n, int unset, const char **text);

/* The CUDA chunk op's auto choice (descriptors.c, gdp_chunk_auto_choose): the staged chain, the
 * one-pass Hopper kernel unsplit, or its exact segment split with seg_chunks expanded chunks a
 * segment, for num_chunks_dp expanded chunks of N sequences, H heads, M copies, K key and V value
 * columns, the longest sequence max_seqlen tokens (0: unknown, staged), on sms multiprocessors; with
 * each path's estimate in microseconds (0 where not estimated). */
typedef enum { GDP_CHUNK_AUTO_STAGED = 0, GDP_CHUNK_AUTO_HOPPER = 1, GDP_CHUNK_AUTO_HOPPER_SPLIT = 2 } gdp_chunk_auto_path;
typedef struct {
    gdp_chunk_auto_path path;
    int seg_chunks; /* the split's segment length where estimated */
    double staged_us, hopper_us, split_us;
} gdp_chunk_auto;
gdp_chunk_auto gdp_chunk_auto_choose(int64_t num_chunks_dp, int64_t N, int64_t H, int32_t M, int64_t K, int64_t V,
                                     int64_t max_seqlen, int sms);
/* The split's segment length when the op chooses it (num_chunks_dp expanded chunks, H heads, the
 * longest sequence's expanded chunks; a sequence's first segment is twice that). */
int64_t gdp_chunk_split_segment(int64_t num_chunks_dp, int64_t H, int64_t longest, int sms);
/* The staged chain's state-sweep column block (64, 32 or 16) for VP value columns. */
int gdp_chunk_state_vb(int vp, int64_t heads, int64_t seqs, int sms);

/* calloc that records an out-of-memory error naming `what`. */
void *gdp_calloc(size_t count, size_t size, const char *what);

/* ---- argument checks every op front-end (src/ops_*.c, decode_core.c) shares ---- */

/* A tensor whose rows may be a strided view (e.g. a slice of a wider activation): the
 * last dim must be contiguous (stride 1) and no stride may be negative. */
static inline gdp_status_t gdp_check_row_view(const char *op, const char *name, const gdp_tensor *t) {
    if (t->ndim < 1 || gdp_tensor_stride(t, t->ndim - 1) != 1)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: %s has last-dim stride %lld; only its rows may be strided, the last dim must be "
                 "contiguous (stride 1)",
                 op, name, (long long)(t->ndim >= 1 ? gdp_tensor_stride(t, t->ndim - 1) : 0));
    for (int32_t d = 0; d < t->ndim - 1; d++)
        if (gdp_tensor_stride(t, d) < 0)
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: %s has negative stride %lld in dim %d; pass a view with "
                     "non-negative strides", op, name, (long long)gdp_tensor_stride(t, d), d);
    return GDP_STATUS_SUCCESS;
}

/* gdp_check_tensor followed by gdp_check_contiguous: the usual rule for every tensor an
 * op does not document as strided. */
static inline gdp_status_t gdp_check_dense(const char *op, const char *name, const gdp_tensor *t, int32_t ndim,
                                           const int64_t *shape, uint32_t dtypes) {
    GDP_CHECK(gdp_check_tensor(op, name, t, ndim, shape, dtypes));
    return gdp_check_contiguous(op, name, t);
}

/* An optional argument: absent (NULL data) passes, otherwise gdp_check_dense. */
static inline gdp_status_t gdp_check_optional_dense(const char *op, const char *name, const gdp_tensor *t,
                                                    int32_t ndim, const int64_t *shape, uint32_t dtypes) {
    if (!gdp_tensor_present(t))
        return GDP_STATUS_SUCCESS;
    return gdp_check_dense(op, name, t, ndim, shape, dtypes);
}

/* An int32 [rows] slot-index array (absent allowed: row b uses slot b, which needs
 * rows <= slots). Values are checked on the host by gdp_cpu_check_slots. */
static inline gdp_status_t gdp_check_slot_array(const char *op, const char *name, const gdp_tensor *indices,
                                                int64_t rows, int64_t slots) {
    if (!gdp_tensor_present(indices)) {
        if (rows > slots)
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                     "%s: %s is absent, so request b uses slot b, but there are %lld requests and only %lld "
                     "slots; pass %s or a larger cache",
                     op, name, (long long)rows, (long long)slots, name);
        return GDP_STATUS_SUCCESS;
    }
    const int64_t shape[1] = {rows};
    return gdp_check_dense(op, name, indices, 1, shape, GDP_DT_INT32);
}

#ifdef __cplusplus
}
#endif

#endif /* GDP_INTERNAL_H */
