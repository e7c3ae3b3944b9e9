"""test_torch_gpu.py: the ops on torch CUDA tensors (libgdp's CUDA backend). Skipped when
torch is not installed, no GPU is visible, or the loaded libgdp has no CUDA backend.

  - golden files with bf16 / fp32 torch tensors, the README's GPU bars: prepare bitwise
    (also on strided row views); decode o within atol = rtol = 1e-3 plus one bf16 ulp,
    slots and intermediate states 1e-3, -1 rows exactly 0, unnamed slots bitwise
    unchanged; chunk (bf16) o, final states and chunk states within relative RMS 8e-3 and
    atol = rtol = 2e-2, o's tail exactly 0, cache mode in place;
  - the CUDA backend against the CPU backend on the same random values (bars of
    gdp-math.md 8: chunk 8e-3 / 2e-2, decode 1e-3 + one bf16 ulp, prepare bitwise q/k/v and
    4 ulp on beta and g);
  - CUDA-graph capture of prepare + chunk (descriptors given) + decode on a side stream:
    replay with new inputs equals eager execution bit for bit (no host synchronization
    inside: capture would fail), the cache updated in place by the replay;
  - the chunk workspace: growing it during capture is refused with a RuntimeError naming
    reserve_chunk_workspace; calls on a non-default stream agree with the default stream;
  - bad arguments: a numpy array mixed with CUDA tensors, an int64 cu_seqlens on CUDA.
"""

import numpy as np
import pytest

import gdp
from conftest import assert_close, bf16_ulp, load_golden, ulp_distance_bf16_bits, ulp_distance_f32

torch = pytest.importorskip("torch", reason="torch is not installed")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device visible to torch", allow_module_level=True)
if not gdp.cuda_available():
    pytest.skip(f"the libgdp at {gdp.library_path()} was built without the CUDA backend", allow_module_level=True)

DEV = torch.device("cuda", torch.cuda.current_device())
GPU_REL_BAR = 8e-3   # golden README: bf16 chunk kernels, relative RMS
CHUNK_ELEM = 2e-2    # Megatron's atol = rtol
DECODE_TOL = 1e-3    # golden README: decode, fp32 math on bf16 inputs
MAX_ULP = 4          # prepare, CUDA vs CPU on random inputs (gdp-math.md 8, item 5)

CHUNK_FILES = ["chunk_m1_k64_single", "chunk_m2_k64_varlen", "chunk_m3_k100_padded", "chunk_m4_k128_scale",
               "chunk_m2_k128_v64_long"]
DECODE_FILES = ["decode_m1_k128", "decode_m2_slots_pad", "decode_m3_draft3"]
PREPARE_FILES = ["prepare_decode_bf16", "prepare_decode_draft_fp32", "prepare_prefill_bf16",
                 "prepare_prefill_fp32_gqa4"]


def _t(f, name):
    """Golden tensor `name` on the GPU in its stored dtype (bf16 stays bf16)."""
    if f.dtype(name) == "BF16":
        bits = torch.from_numpy(f.raw(name).astype(np.int16))
        return bits.view(torch.bfloat16).to(DEV)
    return torch.from_numpy(f.raw(name)).to(DEV)


def _np(t):
    return t.detach().float().cpu().numpy().astype(np.float64)


def _bf16_bits(t):
    return t.detach().cpu().view(torch.int16).numpy().view(np.uint16)


# ---- golden files --------------------------------------------------------------------------


@pytest.mark.parametrize("name", PREPARE_FILES)
def test_prepare_golden_bitwise(golden, name):
    f = load_golden(golden, name)
    m = f.meta
    fn = gdp.gdp_decode_prepare if m["op"] == "gdp_decode_prepare" else gdp.gdp_prefill_prepare
    x, ba = _t(f, "x"), _t(f, "ba")
    sizes = (m["num_householder"], m["num_heads"], m["num_groups"], m["head_dim"], m["state_dim"])
    out = fn(x, ba, _t(f, "A_log"), _t(f, "dt_bias"), *sizes)
    wide = torch.zeros(x.shape[0], x.shape[1], x.shape[2] + 24, dtype=x.dtype, device=DEV)
    wide[..., 8:8 + x.shape[2]] = x
    out_view = fn(wide[..., 8:8 + x.shape[2]], ba, _t(f, "A_log"), _t(f, "dt_bias"), *sizes)
    for n, got, got_view in zip(("query", "key", "value", "beta", "g"), out, out_view):
        ref = _t(f, f"{n}_ref")
        assert got.device == DEV and got.dtype == ref.dtype and got.shape == ref.shape, n
        assert torch.equal(got, ref), f"{name}: {n} is not bitwise equal to PyTorch eager"
        assert torch.equal(got_view, ref), f"{name}: {n} differs with x as a strided view"


@pytest.mark.parametrize("name", DECODE_FILES)
def test_decode_golden(golden, name):
    f = load_golden(golden, name)
    M, S = f.meta["num_householder"], f.meta["tokens_per_request"]
    state = _t(f, "state")
    before = state.clone()
    slots = _t(f, "state_indices")
    inter = torch.zeros((state.shape[0], S) + tuple(state.shape[1:]), dtype=state.dtype, device=DEV)
    o, final = gdp.fused_recurrent_gated_delta_rule_update(
        _t(f, "q"), _t(f, "k"), _t(f, "v"), g=_t(f, "g"), beta=_t(f, "beta"), scale=f.meta["scale"],
        use_qk_l2norm_in_kernel=f.meta["use_qk_l2norm_in_kernel"], state=state, state_indices=slots,
        intermediate_states=inter, steps_per_token=M)
    torch.cuda.synchronize()
    assert final is state and o.dtype == torch.bfloat16
    o_ref = f.raw("o_ref")
    assert_close(f"{name} o", _np(o), o_ref, None, DECODE_TOL, DECODE_TOL, extra_abs=bf16_ulp(o_ref))
    idx = f.raw("state_indices")
    assert np.all(_np(o)[idx < 0] == 0), "-1 rows exactly 0"
    assert_close(f"{name} state", _np(state), f.raw("state_after_ref"), None, DECODE_TOL, DECODE_TOL)
    assert_close(f"{name} intermediate", _np(inter), f.raw("intermediate_states_ref"), None, DECODE_TOL, DECODE_TOL)
    for s in set(range(state.shape[0])) - set(int(i) for i in idx if i >= 0):
        assert torch.equal(state[s], before[s]) and not torch.any(inter[s] != 0), f"unnamed slot {s} changed"


@pytest.mark.parametrize("name", CHUNK_FILES)
def test_chunk_golden(golden, name):
    f = load_golden(golden, name)
    cu = _t(f, "cu_seqlens")
    N = cu.shape[0] - 1
    desc = dict(chunk_indices=_t(f, "chunk_indices"), chunk_indices_dp=_t(f, "chunk_indices_dp"),
                chunk_offsets=_t(f, "chunk_offsets"))
    args = dict(q=_t(f, "q"), k=_t(f, "k"), v=_t(f, "v"), g=_t(f, "g"), beta=_t(f, "beta"),
                num_householder=f.meta["num_householder"], cu_seqlens=cu, scale=f.meta["scale"],
                use_qk_l2norm_in_kernel=f.meta["use_qk_l2norm_in_kernel"])
    init = _t(f, "initial_state")
    o, final, states = gdp.chunk_gated_delta_product_varlen(**args, initial_state=init, output_final_state=True,
                                                            return_chunk_states=True, **desc)
    torch.cuda.synchronize()
    assert o.dtype == torch.bfloat16 and final.dtype == torch.float32 and states.dtype == torch.float32
    real = int(f.raw("chunk_offsets")[N])
    assert states.shape[0] == desc["chunk_indices"].shape[0]
    end = int(f.raw("cu_seqlens")[-1])
    assert torch.all(o[:, end:] == 0), "rows past cu_seqlens[-1] exactly 0"
    assert_close(f"{name} o", _np(o), f.raw("o_ref"), GPU_REL_BAR, CHUNK_ELEM, CHUNK_ELEM)
    assert_close(f"{name} final", _np(final), f.raw("final_state_ref"), GPU_REL_BAR, CHUNK_ELEM, CHUNK_ELEM)
    assert_close(f"{name} chunk_states", _np(states[:real]), f.raw("chunk_states_ref")[:real], GPU_REL_BAR,
                 CHUNK_ELEM, CHUNK_ELEM)
    # Cache mode: final states in place, -1 for zero-length requests, other slots untouched.
    lens = np.diff(f.raw("cu_seqlens"))
    slots = torch.tensor([i + 1 if lens[i] > 0 else -1 for i in range(N)], dtype=torch.int32, device=DEV)
    cache = torch.randn((N + 2,) + tuple(init.shape[1:]), device=DEV)
    before = cache.clone()
    o2, fs = gdp.chunk_gated_delta_product_varlen(**args, initial_state=init, state=cache, state_indices=slots,
                                                  **desc)
    torch.cuda.synchronize()
    assert fs is cache
    ref = f.raw("final_state_ref")
    for i in range(N):
        if lens[i] > 0:
            assert_close(f"{name} slot {i + 1}", _np(cache[i + 1]), ref[i], GPU_REL_BAR, CHUNK_ELEM, CHUNK_ELEM)
    named = {i + 1 for i in range(N) if lens[i] > 0}
    for s in range(N + 2):
        if s not in named:
            assert torch.equal(cache[s], before[s]), f"slot {s} changed"


# ---- CUDA vs CPU backend --------------------------------------------------------------------


def _random_chunk(seed, lens, T, M, H=2, K=64, V=64):
    g = torch.Generator().manual_seed(seed)
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    host = dict(q=torch.randn(1, T, H, K, generator=g), k=torch.randn(1, T * M, H, K, generator=g),
                v=torch.randn(1, T * M, H, V, generator=g), g=-torch.rand(1, T, H, generator=g) * 0.2,
                beta=torch.rand(1, T * M, H, generator=g))
    host = {n: (t if n == "g" else t.to(torch.bfloat16)) for n, t in host.items()}
    return host, cu


def _descriptors(cu, M, T, device):
    ci, cidp, off, n, ndp = gdp.build_gdp_chunk_descriptors(cu, len(cu) - 1, M, T)
    mk = lambda v: torch.tensor(v, dtype=torch.int32, device=device)  # noqa: E731
    return dict(chunk_indices=mk(ci).view(n, 2), chunk_indices_dp=mk(cidp).view(ndp, 2), chunk_offsets=mk(off))


@pytest.mark.parametrize("M", [1, 3])
def test_chunk_cuda_matches_cpu(M):
    T = 300
    host, cu = _random_chunk(M, [130, 0, 100, 7], T, M)
    init = torch.randn(4, 2, 64, 64, generator=torch.Generator().manual_seed(9)) * 0.1
    dev = {n: t.to(DEV) for n, t in host.items()}
    out_gpu = gdp.chunk_gated_delta_product_varlen(
        **dev, num_householder=M, cu_seqlens=torch.tensor(cu, dtype=torch.int32, device=DEV),
        initial_state=init.to(DEV), output_final_state=True, use_qk_l2norm_in_kernel=True,
        return_chunk_states=True, **_descriptors(cu, M, T, DEV))
    cpu = {n: t.float().numpy() for n, t in host.items()}
    out_cpu = gdp.chunk_gated_delta_product_varlen(
        **cpu, num_householder=M, cu_seqlens=np.array(cu, np.int32), initial_state=init.numpy(),
        output_final_state=True, use_qk_l2norm_in_kernel=True, return_chunk_states=True,
        **{k: v.cpu().numpy() for k, v in _descriptors(cu, M, T, "cpu").items()})
    real = sum(-(-n // 64) for n in np.diff(cu))
    for what, a, b in (("o", out_gpu[0], out_cpu[0]), ("final", out_gpu[1], out_cpu[1]),
                       ("chunk_states", out_gpu[2][:real], out_cpu[2][:real])):
        assert_close(f"CUDA vs CPU {what}", _np(a), b, GPU_REL_BAR, CHUNK_ELEM, CHUNK_ELEM)


def test_decode_and_prepare_cuda_match_cpu():
    gen = torch.Generator().manual_seed(21)
    B, M, S, H, K, V = 5, 2, 2, 4, 64, 32
    T = S * M
    host = dict(q=torch.randn(B, T, H, K, generator=gen), k=torch.randn(B, T, H, K, generator=gen),
                v=torch.randn(B, T, H, V, generator=gen), beta=torch.rand(B, T, H, generator=gen))
    host = {n: t.to(torch.bfloat16) for n, t in host.items()}
    host["g"] = -torch.rand(B, T, H, generator=gen)
    state = torch.randn(8, H, K, V, generator=gen) * 0.1
    slots = torch.tensor([3, -1, 0, 7, 5], dtype=torch.int32)
    sg, sc = state.clone().to(DEV), state.clone().numpy()
    og, _ = gdp.fused_recurrent_gated_delta_rule_update(**{n: t.to(DEV) for n, t in host.items()}, state=sg,
                                                        state_indices=slots.to(DEV), steps_per_token=M,
                                                        use_qk_l2norm_in_kernel=True)
    oc, _ = gdp.fused_recurrent_gated_delta_rule_update(**{n: t.float().numpy() for n, t in host.items()}, state=sc,
                                                        state_indices=slots.numpy(), steps_per_token=M,
                                                        use_qk_l2norm_in_kernel=True)
    oc_bf16 = torch.from_numpy(oc).to(torch.bfloat16).float().numpy()
    assert_close("decode o CUDA vs CPU", _np(og), oc_bf16, None, DECODE_TOL, DECODE_TOL, extra_abs=bf16_ulp(oc))
    assert_close("decode state CUDA vs CPU", _np(sg), sc, None, DECODE_TOL, DECODE_TOL)

    Hh, G, P, N = 8, 2, 16, 32
    x = torch.randn(3, 2, M * Hh * P + M * G * N + G * N, generator=gen).to(torch.bfloat16)
    ba = (torch.randn(3, 2, M * Hh + Hh, generator=gen) * 4).to(torch.bfloat16)
    A_log, dt_bias = torch.randn(Hh, generator=gen), torch.randn(Hh, generator=gen).to(torch.bfloat16)
    outg = gdp.gdp_decode_prepare(x.to(DEV), ba.to(DEV), A_log.to(DEV), dt_bias.to(DEV), M, Hh, G, P, N)
    outc = gdp.gdp_decode_prepare(x.float().numpy(), ba.float().numpy(), A_log.numpy(), dt_bias.float().numpy(), M,
                                  Hh, G, P, N)
    for n, a, b in zip(("query", "key", "value"), outg[:3], outc[:3]):
        assert np.array_equal(_np(a), b), f"prepare {n}: CUDA and CPU copies differ"
    beta_cpu_bits = torch.from_numpy(outc[3]).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert int(ulp_distance_bf16_bits(_bf16_bits(outg[3]), beta_cpu_bits).max()) <= MAX_ULP
    assert int(ulp_distance_f32(outg[4].cpu().numpy(), outc[4]).max()) <= MAX_ULP


# ---- streams and errors ----------------------------------------------------------------------


def test_side_stream_matches_default_stream():
    M, T = 2, 200
    host, cu = _random_chunk(5, [150, 40], T, M)
    dev = {n: t.to(DEV) for n, t in host.items()}
    cu_t = torch.tensor(cu, dtype=torch.int32, device=DEV)
    desc = _descriptors(cu, M, T, DEV)
    # Unit keys (the in-kernel L2 norm, as every real call uses): raw randn keys of norm ~8
    # make the delta rule diverge to inf/NaN, and NaN never compares equal.
    o_default, _ = gdp.chunk_gated_delta_product_varlen(**dev, num_householder=M, cu_seqlens=cu_t,
                                                        use_qk_l2norm_in_kernel=True, **desc)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        o_side, _ = gdp.chunk_gated_delta_product_varlen(**dev, num_householder=M, cu_seqlens=cu_t,
                                                         use_qk_l2norm_in_kernel=True, **desc)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    assert torch.isfinite(o_default).all()
    assert torch.equal(o_default, o_side)


def test_gpu_bad_arguments():
    host, cu = _random_chunk(6, [10], 16, 1)
    dev = {n: t.to(DEV) for n, t in host.items()}
    with pytest.raises(TypeError, match=r"cu_seqlens is a ndarray"):
        gdp.chunk_gated_delta_product_varlen(**dev, num_householder=1, cu_seqlens=np.array(cu, np.int32))
    with pytest.raises(TypeError, match=r"cu_seqlens has dtype torch.int64"):
        gdp.chunk_gated_delta_product_varlen(**dev, num_householder=1, cu_seqlens=torch.tensor(cu, device=DEV))
    with pytest.raises(ValueError, match=r"k is on cpu"):
        gdp.chunk_gated_delta_product_varlen(**{**dev, "k": host["k"]}, num_householder=1,
                                             cu_seqlens=torch.tensor(cu, dtype=torch.int32, device=DEV))


# ---- CUDA graphs (last: a capture marks the context, after which the workspace may not grow) ----


def _step(static, cache, desc, M):
    """prepare -> chunk (descriptors given, cache mode) and one decode call: what a serving
    step captures."""
    q, k, v, beta, g = gdp.gdp_prefill_prepare(static["x"], static["ba"], static["A_log"], static["dt_bias"], M,
                                               static["H"], static["G"], static["P"], static["N"])
    o, _ = gdp.chunk_gated_delta_product_varlen(q, k, v, g, beta, M, static["cu"], state=cache["ssm"],
                                                state_indices=static["slots"], use_qk_l2norm_in_kernel=True, **desc)
    od, _ = gdp.fused_recurrent_gated_delta_rule_update(static["dq"], static["dk"], static["dv"], g=static["dg"],
                                                        beta=static["dbeta"], state=cache["ssm"],
                                                        state_indices=static["dslots"], steps_per_token=M,
                                                        use_qk_l2norm_in_kernel=True)
    return o, od


def _graph_inputs(seed, M, H, G, P, N, T, cu):
    gen = torch.Generator().manual_seed(seed)
    width = M * H * P + M * G * N + G * N
    d = dict(x=torch.randn(1, T, width, generator=gen).to(torch.bfloat16),
             ba=torch.randn(1, T, M * H + H, generator=gen).to(torch.bfloat16),
             dq=torch.randn(2, M, H, N, generator=gen).to(torch.bfloat16),
             dk=torch.randn(2, M, H, N, generator=gen).to(torch.bfloat16),
             dv=torch.randn(2, M, H, P, generator=gen).to(torch.bfloat16),
             dg=-torch.rand(2, M, H, generator=gen), dbeta=torch.rand(2, M, H, generator=gen).to(torch.bfloat16))
    return {n: t.to(DEV) for n, t in d.items()}


def test_graph_capture_replays_like_eager():
    M, H, G, P, N, T = 2, 4, 2, 64, 64, 192
    cu = [0, 100, 150]
    static = dict(H=H, G=G, P=P, N=N, A_log=torch.randn(H, device=DEV), dt_bias=torch.randn(H, device=DEV),
                  cu=torch.tensor(cu, dtype=torch.int32, device=DEV),
                  slots=torch.tensor([1, 4], dtype=torch.int32, device=DEV),
                  dslots=torch.tensor([0, 2], dtype=torch.int32, device=DEV))
    static.update(_graph_inputs(1, M, H, G, P, N, T, cu))
    desc = _descriptors(cu, M, T, DEV)
    gdp.reserve_chunk_workspace(T, len(cu) - 1, M, H, N, P)
    cache = {"ssm": torch.zeros(6, H, N, P, device=DEV)}
    cache0 = torch.randn(6, H, N, P, device=DEV) * 0.1

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on a side stream, as torch requires before capture
        cache["ssm"].copy_(cache0)
        _step(static, cache, desc, M)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    cache["ssm"].copy_(cache0)
    with torch.cuda.graph(graph):
        o_graph, od_graph = _step(static, cache, desc, M)

    new = _graph_inputs(2, M, H, G, P, N, T, cu)
    for n, t in new.items():
        static[n].copy_(t)
    cache["ssm"].copy_(cache0)
    graph.replay()
    torch.cuda.synchronize()
    replay = (o_graph.clone(), od_graph.clone(), cache["ssm"].clone())
    cache["ssm"].copy_(cache0)
    o_eager, od_eager = _step(static, cache, desc, M)
    torch.cuda.synchronize()
    assert torch.equal(replay[0], o_eager), "chunk output: graph replay differs from eager"
    assert torch.equal(replay[1], od_eager), "decode output: graph replay differs from eager"
    assert torch.equal(replay[2], cache["ssm"]), "cache after replay differs from eager"
    assert not torch.equal(replay[2], cache0), "the replay must update the cache in place"

    # Growing the workspace is refused during capture (it would free graph memory).
    big = 4096
    host, cu_big = _random_chunk(3, [big], big, M, H=H, K=N, V=P)
    dev = {n: t.to(DEV) for n, t in host.items()}
    cu_t = torch.tensor(cu_big, dtype=torch.int32, device=DEV)
    d_big = _descriptors(cu_big, M, big, DEV)
    g2 = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="reserve_chunk_workspace"):
        with torch.cuda.graph(g2):
            gdp.chunk_gated_delta_product_varlen(**dev, num_householder=M, cu_seqlens=cu_t, **d_big)
