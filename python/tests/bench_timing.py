"""bench_timing.py: the GPU benches' shared timing (bench_decode_gpu.py, bench_prefill_gpu.py; not a
pytest test): CUDA events around each call after a warm-up, the L2 flushed first by a 256 MB write,
and the host time of eager calls."""

import statistics
import time

import torch

ITERS, WARMUP = 20, 3


def time_calls(fn, flush):
    """median, min, max (us) of ITERS calls of fn after WARMUP, CUDA events around each; flush (a
    byte tensor, or None) is overwritten before each call."""
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for i in range(WARMUP + ITERS):
        if flush is not None:
            flush.fill_(i & 0xFF)
        e0.record()
        fn()
        e1.record()
        e1.synchronize()
        if i >= WARMUP:
            ts.append(e0.elapsed_time(e1) * 1e3)
    return statistics.median(ts), min(ts), max(ts)


def eager_host_us(fn, n):
    """The host's time a call of fn (us), over n calls after one, the GPU drained before and after."""
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6
