/*
 * test_gpu.h: what the GPU test programs share beside test_common.h: whether this process
 * (or every rank of the job) can run on a GPU, and the skip that follows; the main of a
 * one-process GPU test; and, in a CUDA build, the CUDA_OK check that counts a failed runtime
 * call as a failed check, the process's GPU and CPU contexts on a blocking stream, device
 * copies of host tensor views (same strides, absent stays absent), sentinel-filled device
 * outputs, and CUDA-graph capture and replay of one op call. The multi-rank layer tests use only the usability checks (their
 * device memory is layer_harness.h's).
 */
#ifndef GDP_TEST_GPU_H
#define GDP_TEST_GPU_H

#include <stdbool.h>
#include <stddef.h>

#include "test_common.h"

/* 1 when this process has a CUDA build, a CUDA backend and a visible GPU (*gpus of them); else
 * 0 and the reason in why. */
int test_gpu_usable(char *why, size_t n, int *gpus);
/* Every rank skips, or none: a rank alone would leave the others in a collective. Returns
 * whether every rank of MPI_COMM_WORLD is usable; prints "<name>: skipped on rank r: <why>"
 * on the ranks that are not. */
bool test_gpu_all_ranks_usable(int usable, const char *name, const char *why);

/* The whole of a one-process GPU test program: without a CUDA build or a visible GPU prints
 * why and returns TEST_SKIP; else makes the job (test_gpu_job_init), runs tests on a test_rng
 * seeded with seed, frees the job and returns test_finish(name). */
int test_gpu_main(const char *name, void (*tests)(test_rng *rng), uint64_t seed);
/* A program's main: test_gpu_main(name, tests, seed); tests need not exist without CUDA. */
#ifdef GDP_HAVE_CUDA
#define TEST_GPU_MAIN(name, tests, seed) \
    int main(void) { return test_gpu_main((name), (tests), (seed)); }
#else
#define TEST_GPU_MAIN(name, tests, seed) \
    int main(void) { return test_gpu_main((name), NULL, (seed)); }
#endif

#ifdef GDP_HAVE_CUDA
#include <cuda_runtime_api.h>

#define TEST_SENTINEL_BYTE 0xA5 /* device outputs start as this pattern, so unwritten elements show */

/* A failed CUDA runtime call is a failed check (the test goes on). */
#define CUDA_OK(call)                                                                                           \
    do {                                                                                                        \
        cudaError_t e_ = (call);                                                                                \
        CHECK(e_ == cudaSuccess, "%s: %s", #call, cudaGetErrorString(e_));                                      \
    } while (0)

/* Whether a CUDA device is visible; when none, prints "<name>: skipped: no CUDA device (...)"
 * and returns false (the caller exits TEST_SKIP). */
bool test_gpu_present(const char *name);

/* The one-process GPU tests' job: a CUDA ctx and a CPU ctx, the CUDA one enqueueing on a
 * blocking stream (graphs need a non-default stream; a blocking one keeps the tests' plain
 * cudaMemcpy/cudaMemset calls, on the legacy default stream, ordered with the ops' work). */
extern gdp_ctx_t g_test_gpu, g_test_cpu;
extern cudaStream_t g_test_stream; /* NULL (the legacy stream) until test_gpu_job_init */
/* Creates them (each call checked); false when a ctx could not be made. */
bool test_gpu_job_init(void);
void test_gpu_job_free(void);

/* ---- device copies of host tensor views ---- */
/* A device copy of a host view (same strides, its whole span). Absent stays absent. */
gdp_tensor test_dev_clone(const gdp_tensor *h);
/* A device buffer shaped like h (its span), every byte `byte`. */
gdp_tensor test_dev_filled(const gdp_tensor *h, int byte);
/* test_dev_filled with TEST_SENTINEL_BYTE. */
gdp_tensor test_dev_poisoned(const gdp_tensor *h);
/* A contiguous device tensor of the shape, every byte `byte`. */
gdp_tensor test_dev_alloc(gdp_dtype_t dtype, int32_t ndim, const int64_t *shape, int byte);
/* A contiguous device copy of a contiguous host tensor; an absent one gives a zeroed view. */
gdp_tensor test_dev_upload(const gdp_tensor *h);
/* Host -> device over h's span (synchronous). */
void test_dev_put(gdp_tensor *d, const gdp_tensor *h);
/* Device -> host over h's span, after g_test_stream's work. */
void test_dev_fetch(gdp_tensor *h, const gdp_tensor *d);
/* A fresh contiguous host tensor holding a contiguous device tensor's bytes. */
gdp_tensor test_dev_download(const gdp_tensor *d);
void test_dev_free(gdp_tensor *d);

/* ---- CUDA graphs ---- */
typedef gdp_status_t (*test_op_fn)(void *args);
/* Captures one call of fn(args) on g_test_stream into an executable graph (NULL on failure,
 * a failed check). */
cudaGraphExec_t test_graph_capture(test_op_fn fn, void *args);
/* Launches it on g_test_stream and waits. */
void test_graph_replay(cudaGraphExec_t exec);
#endif /* GDP_HAVE_CUDA */

#endif /* GDP_TEST_GPU_H */
