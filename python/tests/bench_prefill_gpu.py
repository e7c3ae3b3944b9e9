"""bench_prefill_gpu.py: the chunk op (prefill) through the Python package on gdp-bench's prefill
rows, as a torch user calls it: issue 13's "Python package" column (not a pytest test).

    GDP_LIBRARY=build/libgdp.so PYTHONPATH=python python3 python/tests/bench_prefill_gpu.py [rows]

Per row (gdp-bench ops' prefill rows: bf16 q/k/v and beta, fp32 decays in [-0.1, 0], L2 norm in
kernel, fp32 final states, descriptors from gdp.build_gdp_chunk_descriptors):
  - auto, max_seqlen given: the op's own choice of kernels with the longest sequence known (the
    one-pass Hopper kernel where its estimate wins, kernels/NOTES-chunk.md);
  - auto, max_seqlen unknown: the same call without it (the staged chain);
  - the host time of one eager call (argument views, the ctypes call).
Timing: median (min, max) of 20 calls after 3, CUDA events around each call, the L2 flushed by a
256 MB write before each (the rows' inputs are far above twice the L2 anyway). The peer column is
Megatron's ops with descriptors on the H200 (docs/performance.md), as gdp-bench prints it.
"""

import sys

import torch

import gdp
from bench_timing import eager_host_us, time_calls

DEV = torch.device("cuda", torch.cuda.current_device())
EIGHT = [2048] * 8
MIXED = [1000, 37, 5000, 64, 2500, 7000, 400, 299]
ROWS = [  # (H, K, V, M, lengths, name, peer us, target us)
    (16, 128, 128, 2, EIGHT, "8x2048", 1250.0, 400.0),
    (16, 128, 128, 3, EIGHT, "8x2048", 1840.0, 580.0),
    (16, 128, 128, 2, [16384], "1x16384", 2130.0, 700.0),
    (16, 128, 128, 2, MIXED, "mixed 16300", 1680.0, 550.0),
    (32, 128, 64, 3, EIGHT[:4], "4x2048", 1370.0, 450.0),
    # K = 64, the Hopper kernel's other key width (no peer figure or target; gdp-bench's sixth row)
    (16, 64, 128, 2, EIGHT, "8x2048", None, None),
]


def inputs(H, K, V, M, lens, seed=1):
    gen = torch.Generator(device=DEV).manual_seed(seed)
    T = sum(lens)
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    ci, cidp, co, nc, ncdp = gdp.build_gdp_chunk_descriptors(cu, len(lens), M, T)
    i32 = dict(dtype=torch.int32, device=DEV)
    bf = dict(dtype=torch.bfloat16, device=DEV)
    return dict(
        q=torch.randn(1, T, H, K, generator=gen, **bf), k=torch.randn(1, T * M, H, K, generator=gen, **bf),
        v=torch.randn(1, T * M, H, V, generator=gen, **bf),
        g=-0.1 * torch.rand(1, T, H, generator=gen, dtype=torch.float32, device=DEV),
        beta=torch.rand(1, T * M, H, generator=gen, **bf), num_householder=M,
        cu_seqlens=torch.tensor(cu, **i32), chunk_indices=torch.tensor(ci, **i32).view(nc, 2),
        chunk_indices_dp=torch.tensor(cidp, **i32).view(ncdp, 2), chunk_offsets=torch.tensor(co, **i32),
        output_final_state=True, use_qk_l2norm_in_kernel=True)


def figure(us):
    """A peer or target column: the figure, or '-' where none was measured or set."""
    return f"{us:7.0f}" if us is not None else f"{'-':>7s}"


def main():
    flush = torch.empty(256 << 20, dtype=torch.uint8, device=DEV)
    rows = ROWS[: int(sys.argv[1])] if len(sys.argv) > 1 else ROWS
    print(f"# gdp {gdp.version()} at {gdp.library_path()}, torch {torch.__version__}, "
          f"{torch.cuda.get_device_name(DEV)}")
    print("# prefill through the package, eager, median (min, max) of 20 calls, us; peer: Megatron + descriptors")
    print(f"# {'shape':30s} {'auto, max_seqlen':>24s} {'auto, unknown':>24s} {'eager host':>10s} "
          f"{'peer':>7s} {'target':>7s}")
    for H, K, V, M, lens, name, peer, target in rows:
        x = inputs(H, K, V, M, lens)
        longest = max(lens)
        gdp.reserve_chunk_workspace(sum(lens), len(lens), M, H, K, V)
        known = time_calls(lambda: gdp.chunk_gated_delta_product_varlen(**x, max_seqlen=longest), flush)
        unknown = time_calls(lambda: gdp.chunk_gated_delta_product_varlen(**x), flush)
        host = eager_host_us(lambda: gdp.chunk_gated_delta_product_varlen(**x, max_seqlen=longest), 20)
        shape = f"H={H} K={K} V={V} M={M} {name}"
        print(f"  {shape:30s} {known[0]:8.1f} ({known[1]:6.1f}, {known[2]:6.1f}) "
              f"{unknown[0]:8.1f} ({unknown[1]:6.1f}, {unknown[2]:6.1f}) {host:10.1f} {figure(peer)} {figure(target)}")


if __name__ == "__main__":
    main()
