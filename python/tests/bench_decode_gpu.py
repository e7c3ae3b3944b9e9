"""bench_decode_gpu.py: the decode op through the Python package beside the same C call,
both captured in a CUDA graph and replayed, as gdp-bench ops measures (not a pytest test).

    GDP_LIBRARY=build/libgdp.so PYTHONPATH=python python3 python/tests/bench_decode_gpu.py

Per shape (gdp-bench's decode rows: bf16 q/k/v/beta, fp32 g, fp32 state on distinct slots,
q on copy M-1 and the decay on copy 0, L2 norm in kernel):
  - package: gdp.fused_recurrent_gated_delta_rule_update(...) captured by torch.cuda.graph
    (o allocated by the package inside the capture) and replayed;
  - C call: libgdp's gdp_fused_recurrent_gated_delta_rule_update through ctypes with the
    argument struct built once, captured and replayed the same way;
  - the host time of one eager package call (what the package spends per call outside a
    graph: argument views, the stream hand-over, the ctypes call; it launches nothing else).
Timing: median (min, max) of 20 replays after 3, CUDA events around each replay, the L2
flushed by a 256 MB write before each when the state is under twice the L2.
"""

import ctypes
import sys

import torch

import gdp
from bench_timing import eager_host_us, time_calls
from gdp import _lib

DEV = torch.device("cuda", torch.cuda.current_device())


def inputs(B, H, K, V, M, seed=1):
    gen = torch.Generator().manual_seed(seed)
    T, slots = M, B + 8
    q = torch.randn(B, T, H, K, generator=gen)
    q[:, : M - 1] = 0  # the query lives on copy M-1
    g = -torch.rand(B, T, H, generator=gen)
    g[:, 1:] = 0  # the decay on copy 0
    idx = torch.tensor([(b * 5 + 3) % slots for b in range(B)], dtype=torch.int32)
    if slots % 5 == 0:
        idx = torch.tensor([slots - 1 - b for b in range(B)], dtype=torch.int32)
    d = dict(q=q.to(torch.bfloat16), k=torch.randn(B, T, H, K, generator=gen).to(torch.bfloat16),
             v=torch.randn(B, T, H, V, generator=gen).to(torch.bfloat16), g=g,
             beta=torch.rand(B, T, H, generator=gen).to(torch.bfloat16),
             state=torch.rand(slots, H, K, V, generator=gen) * 2 - 1, state_indices=idx)
    return {n: t.to(DEV) for n, t in d.items()}


def package_call(x, M):
    o, _ = gdp.fused_recurrent_gated_delta_rule_update(x["q"], x["k"], x["v"], g=x["g"], beta=x["beta"],
                                                       state=x["state"], state_indices=x["state_indices"],
                                                       steps_per_token=M, use_qk_l2norm_in_kernel=True)
    return o


def c_call_factory(x, M):
    """A closure calling the C function with a struct built once (the C path's work)."""
    pl = _lib.Placement("q", x["q"])
    a = _lib.RecurrentArgs()
    for n in ("q", "k", "v", "g", "beta", "state_indices"):
        setattr(a, n, pl.view(n, x[n]))
    a.state = pl.view("state", x["state"], writes=True)
    o = torch.empty_like(x["v"])
    a.o = pl.view("o", o, writes=True)
    a.scale = 0.0
    a.use_qk_l2norm_in_kernel = 1
    a.steps_per_token = M
    ctx = _lib.ctx_for(pl)
    fn = _lib.lib().gdp_fused_recurrent_gated_delta_rule_update

    def call():
        _lib.lib().gdp_ctx_set_stream(ctx.handle, ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
        status = fn(ctx.handle, ctypes.byref(a))
        if status != 0:
            raise RuntimeError(_lib.last_error())
        return o

    return call


def capture(fn):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()  # warm-up on a side stream, as torch requires before capture
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


def main():
    l2 = torch.cuda.get_device_properties(DEV).L2_cache_size
    flush_buf = torch.empty(256 << 20, dtype=torch.uint8, device=DEV)
    print(f"# gdp {gdp.version()} at {gdp.library_path()}, torch {torch.__version__}, "
          f"{torch.cuda.get_device_name(DEV)}")
    print("# decode graph-replayed: the package call vs the C call (ctypes, struct built once); "
          "median (min, max) of 20 replays, us")
    print(f"# {'shape':34s} {'package':>22s} {'C call':>22s} {'diff':>7s} {'eager host':>10s}")
    shapes = [(1, 16, 128, 128, 2), (64, 16, 128, 128, 2), (256, 16, 128, 128, 2)]
    if len(sys.argv) > 1:
        shapes = shapes[: int(sys.argv[1])]
    for B, H, K, V, M in shapes:
        x = inputs(B, H, K, V, M)
        flush = flush_buf if 8 * K * V * B * H < 2 * l2 else None
        gp = capture(lambda: package_call(x, M))
        cfn = c_call_factory(x, M)
        gc = capture(cfn)
        tp = time_calls(gp.replay, flush)
        tc = time_calls(gc.replay, flush)
        host = eager_host_us(lambda: package_call(x, M), 200)
        shape = f"B={B} H={H} K={K} V={V} M={M} fp32 state"
        print(f"  {shape:34s} {tp[0]:8.2f} ({tp[1]:5.2f}, {tp[2]:5.2f}) {tc[0]:8.2f} ({tc[1]:5.2f}, {tc[2]:5.2f}) "
              f"{tp[0] - tc[0]:7.2f} {host:10.1f}")


if __name__ == "__main__":
    main()
