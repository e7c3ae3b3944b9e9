"""test_ops_cpu.py: the Python ops on the CPU backend (numpy arrays), beyond the golden
files:

  - the ctypes struct mirrors against the C headers (a probe compiled with the system C
    compiler prints sizeof and every field's offsetof);
  - library discovery honours $GDP_LIBRARY; one cached context per backend;
  - chunk_gated_delta_product_varlen against a float64 numpy recurrence on random varlen
    inputs (zero-length and padding requests, padded tail, M = 1..3, L2 norm on and off,
    default and explicit scale): o, final states and chunk states within relative RMS 1e-6
    (the outputs are float32-rounded double math); return tuples, shapes and dtypes
    (chunk_states follow the cache's, else initial_state's, else k's dtype);
  - fused_recurrent_gated_delta_rule_update against the same recurrence: dense mode,
    cache mode with slots / -1 rows / intermediate states, state_indices=None;
  - gdp_decode_prepare / gdp_prefill_prepare against a numpy transcription of
    gdp-math.md 6 (index maps bitwise, gating within 4 ulp);
  - bad arguments: ValueError / TypeError naming the argument and the expected shape or
    dtype, and nothing modified by a failing call;
  - torch CPU tensors through the same ops (skipped when torch is not installed).
"""

import ctypes
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import gdp
from gdp import _lib
from conftest import REPO, assert_close, ml_dtypes_bf16, ref_gdp_varlen, ref_recurrent, ulp_distance_f32

REF_REL_BAR = 1e-6  # float32 outputs of double math vs a float64 reference: rounding only (2^-24)


# ---- bindings ----------------------------------------------------------------------------

_C_NAMES = {
    _lib.Tensor: "gdp_tensor", _lib.PrepareArgs: "gdp_prepare_args", _lib.ChunkArgs: "gdp_chunk_args",
    _lib.RecurrentArgs: "gdp_recurrent_args", _lib.LayerConfig: "gdp_layer_config", _lib.TpShard: "gdp_tp_shard",
    _lib.LayerWeights: "gdp_layer_weights", _lib.CacheConfig: "gdp_cache_config",
    _lib.StepBucket: "gdp_step_bucket", _lib.PrefillRequestC: "gdp_prefill_request",
    _lib.DraftAcceptC: "gdp_draft_accept", _lib.StepDesc: "gdp_step_desc", _lib.PlanConfig: "gdp_plan_config",
    _lib.StepArrays: "gdp_step_arrays", _lib.StepMetadataC: "gdp_step_metadata",
}


def test_struct_layouts_match_the_c_headers(tmp_path):
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler to build the layout probe")
    lines = ["#include <stddef.h>", "#include <stdio.h>", "#include \"gdp/gdp.h\"", "#include \"gdp/layer.h\"",
             "int main(void) {"]
    expected = []
    for cls, cname in _C_NAMES.items():
        lines.append(f'    printf("%zu\\n", sizeof({cname}));')
        expected.append((f"sizeof({cname})", ctypes.sizeof(cls)))
        for field, _ in cls._fields_:
            lines.append(f'    printf("%zu\\n", offsetof({cname}, {field}));')
            expected.append((f"offsetof({cname}, {field})", getattr(cls, field).offset))
    lines += ["    return 0;", "}"]
    src = tmp_path / "probe.c"
    src.write_text("\n".join(lines) + "\n")
    exe = tmp_path / "probe"
    subprocess.run([cc, "-std=c11", "-I", str(REPO / "include"), str(src), "-o", str(exe)], check=True)
    got = [int(v) for v in subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split()]
    assert len(got) == len(expected)
    wrong = [f"{what}: C {c}, ctypes {p}" for (what, p), c in zip(expected, got) if c != p]
    assert not wrong, "ctypes mirrors differ from include/gdp: " + "; ".join(wrong)


def _run_python(code, env_updates, cwd):
    env = {k: v for k, v in os.environ.items() if k not in ("GDP_LIBRARY", "PYTHONPATH")}
    env.update(env_updates)
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def test_library_discovery(tmp_path):
    """$GDP_LIBRARY as a file or a directory; a wrong $GDP_LIBRARY fails (never falls back);
    `pip install ./python` gives a package that loads a libgdp.so placed next to it and
    records this checkout for <repo>/build/libgdp.so."""
    lib = gdp.library_path()
    probe = "import gdp; print(gdp.library_path()); print(gdp.version())"
    tree = {"PYTHONPATH": str(REPO / "python")}
    r = _run_python(probe, {**tree, "GDP_LIBRARY": os.path.dirname(lib)}, tmp_path)
    assert r.returncode == 0, r.stderr
    assert os.path.dirname(r.stdout.split()[0]) == os.path.dirname(lib)
    r = _run_python(probe, {**tree, "GDP_LIBRARY": str(tmp_path / "nope.so")}, tmp_path)
    assert r.returncode != 0 and "GDP_LIBRARY=" in r.stderr and "does not exist" in r.stderr
    assert REPO / "build" / "libgdp.so" in [p for _, p in _lib._candidates()]

    target = tmp_path / "site"
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-build-isolation", "--no-deps",
                          "--target", str(target), str(REPO / "python")], capture_output=True, text=True,
                         timeout=300)
    if pip.returncode != 0 and "No module named pip" in pip.stderr:
        pytest.skip("pip is not installed")
    assert pip.returncode == 0, pip.stderr
    shutil.copy(lib, target / "gdp" / "libgdp.so")
    r = _run_python("import gdp, gdp._build_info as b; print(gdp.library_path()); print(b.SOURCE_ROOT)",
                    {"PYTHONPATH": str(target)}, tmp_path)
    assert r.returncode == 0, r.stderr
    loaded, root = r.stdout.split()
    assert loaded == str(target / "gdp" / "libgdp.so") and root == str(REPO)


def test_library_and_context():
    env = os.environ.get("GDP_LIBRARY")
    if env:
        assert os.path.samefile(gdp.library_path(), env), "GDP_LIBRARY must be the library loaded"
    assert gdp.version() == (0, 1, 0) or gdp.version()[0] == 0
    assert gdp.backend_available(_lib.BACKEND_CPU)
    a = _lib.get_ctx(_lib.BACKEND_CPU)
    b = _lib.get_ctx(_lib.BACKEND_CPU, 3)  # the device is ignored on the CPU backend
    assert a is b and a.handle


# ---- random inputs --------------------------------------------------------------------------


def _chunk_case(rng, lens, T, M, H=2, K=16, V=8, dtype=np.float32):
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    assert cu[-1] <= T
    x = dict(q=rng.standard_normal((1, T, H, K)).astype(dtype),
             k=(rng.standard_normal((1, T * M, H, K)) / np.sqrt(K)).astype(dtype),
             v=rng.standard_normal((1, T * M, H, V)).astype(dtype),
             g=(-rng.uniform(0.001, 0.2, (1, T, H))).astype(np.float32),
             beta=rng.uniform(0.1, 0.9, (1, T * M, H)).astype(dtype), num_householder=M, cu_seqlens=cu)
    return x


def _descriptors(cu, M, T):
    ci, cidp, off, n, ndp = gdp.build_gdp_chunk_descriptors(cu.tolist(), len(cu) - 1, M, T)
    return dict(chunk_indices=np.array(ci, np.int32).reshape(n, 2),
                chunk_indices_dp=np.array(cidp, np.int32).reshape(ndp, 2), chunk_offsets=np.array(off, np.int32))


CHUNK_CASES = [  # lens, padded T, M, l2norm, scale
    ([100, 0, 37, 64, 1], 220, 3, True, None),
    ([130], 130, 1, False, 0.3),
    ([0, 65, 128, 3, 0], 256, 2, True, 0.2),
]


@pytest.mark.parametrize("lens,T,M,l2,scale", CHUNK_CASES)
def test_chunk_matches_recurrence(lens, T, M, l2, scale):
    rng = np.random.default_rng(sum(lens) + M)
    x = _chunk_case(rng, lens, T, M)
    cu = x["cu_seqlens"]
    N = len(cu) - 1
    H, K, V = 2, 16, 8
    init = rng.standard_normal((N, H, K, V)).astype(np.float32) * 0.1
    desc = _descriptors(cu, M, T)
    o, final, states = gdp.chunk_gated_delta_product_varlen(
        **x, scale=scale, initial_state=init, output_final_state=True, use_qk_l2norm_in_kernel=l2,
        return_chunk_states=True, **desc)
    o_ref, final_ref, chunks_ref = ref_gdp_varlen(x["q"], x["k"], x["v"], x["g"], x["beta"], M, cu, scale, init, l2)
    assert o.shape == (1, T, H, V) and o.dtype == np.float32
    assert np.all(o[0, cu[-1]:] == 0)
    assert_close("o", o, o_ref, REF_REL_BAR)
    assert final.shape == (N, H, K, V) and final.dtype == np.float32
    assert_close("final_state", final, final_ref, REF_REL_BAR)
    offsets = desc["chunk_offsets"]
    assert states.shape == (desc["chunk_indices"].shape[0], H, K, V)
    for (i, c), s in chunks_ref.items():
        assert_close(f"chunk state of sequence {i} chunk {c}", states[offsets[i] + c], s, REF_REL_BAR)
    assert len(chunks_ref) == offsets[N]


def test_chunk_return_values_and_dtypes():
    rng = np.random.default_rng(3)
    x = _chunk_case(rng, [70, 10], 96, 2)
    r = gdp.chunk_gated_delta_product_varlen(**x)
    assert len(r) == 2 and r[1] is None, "(o, None) without output_final_state"
    o_default = r[0]
    o_explicit, _ = gdp.chunk_gated_delta_product_varlen(**x, scale=16 ** -0.5)
    np.testing.assert_array_equal(o_default, o_explicit)  # scale=None is K ** -0.5
    o_hint, _ = gdp.chunk_gated_delta_product_varlen(**x, max_seqlen=70)
    np.testing.assert_array_equal(o_default, o_hint)  # max_seqlen chooses kernels, never results

    # chunk_states: k's dtype, then initial_state's, then the cache's.
    _, _, s = gdp.chunk_gated_delta_product_varlen(**x, return_chunk_states=True)
    assert s.dtype == np.float32 and s.shape[0] == 2 + 1, "NT = ceil(70/64) + ceil(10/64) rows"
    init16 = np.zeros((2, 2, 16, 8), np.float16)
    _, _, s = gdp.chunk_gated_delta_product_varlen(**x, initial_state=init16, return_chunk_states=True)
    assert s.dtype == np.float16
    bf16 = ml_dtypes_bf16()
    if bf16 is not None:
        cache = np.zeros((4, 2, 16, 8), bf16)
        desc = _descriptors(x["cu_seqlens"], 2, 96)
        o, final, s = gdp.chunk_gated_delta_product_varlen(**x, initial_state=init16, state=cache,
                                                           state_indices=np.array([2, 0], np.int32),
                                                           return_chunk_states=True, **desc)
        assert final is cache and s.dtype == bf16 and s.shape[0] == desc["chunk_indices"].shape[0]
        assert np.any(cache[2].astype(np.float32) != 0) and np.all(cache[[1, 3]].astype(np.float32) == 0)


def test_chunk_index_arrays_accept_lists_and_int64():
    rng = np.random.default_rng(4)
    x = _chunk_case(rng, [40, 24], 64, 1)
    o32, _ = gdp.chunk_gated_delta_product_varlen(**x)
    x["cu_seqlens"] = [0, 40, 64]
    o_list, _ = gdp.chunk_gated_delta_product_varlen(**x)
    x["cu_seqlens"] = np.array([0, 40, 64], np.int64)
    o64, _ = gdp.chunk_gated_delta_product_varlen(**x)
    np.testing.assert_array_equal(o32, o_list)
    np.testing.assert_array_equal(o32, o64)


# ---- decode -----------------------------------------------------------------------------------


def _decode_case(rng, B, T, H=2, K=16, V=8):
    return dict(q=rng.standard_normal((B, T, H, K)).astype(np.float32),
                k=rng.standard_normal((B, T, H, K)).astype(np.float32),
                v=rng.standard_normal((B, T, H, V)).astype(np.float32),
                g=(-rng.uniform(0.01, 0.5, (B, T, H))).astype(np.float32),
                beta=rng.uniform(0.1, 0.9, (B, T, H)).astype(np.float32))


def test_decode_dense_matches_recurrence():
    rng = np.random.default_rng(5)
    x = _decode_case(rng, 3, 6)
    init = (rng.standard_normal((3, 2, 16, 8)) * 0.1).astype(np.float32)
    o, final = gdp.fused_recurrent_gated_delta_rule_update(**x, initial_state=init, output_final_state=True,
                                                           use_qk_l2norm_in_kernel=True, scale=0.5)
    o_ref, final_ref, _ = ref_recurrent(x["q"], x["k"], x["v"], x["g"], x["beta"], 0.5, init, True)
    assert o.shape == x["v"].shape and o.dtype == np.float32
    assert_close("o", o, o_ref, REF_REL_BAR)
    assert final.dtype == np.float32 and final.shape == (3, 2, 16, 8)
    assert_close("final_state", final, final_ref, REF_REL_BAR)
    # No g, no beta: no decay, beta = 1.
    o, f2 = gdp.fused_recurrent_gated_delta_rule_update(x["q"], x["k"], x["v"])
    o_ref, _, _ = ref_recurrent(x["q"], x["k"], x["v"], None, None)
    assert f2 is None
    assert_close("o (g, beta None)", o, o_ref, REF_REL_BAR)


def test_decode_cache_slots_and_intermediate_states():
    rng = np.random.default_rng(6)
    M, S, B = 2, 3, 4
    x = _decode_case(rng, B, S * M)
    slots = np.array([5, -1, 0, 2], np.int32)
    cache = (rng.standard_normal((6, 2, 16, 8)) * 0.1).astype(np.float32)
    before = cache.copy()
    inter = np.full((6, S, 2, 16, 8), 7.0, np.float32)
    o, final = gdp.fused_recurrent_gated_delta_rule_update(**x, state=cache, state_indices=slots,
                                                           intermediate_states=inter, steps_per_token=M)
    assert final is cache
    init = np.stack([before[s] if s >= 0 else np.zeros_like(before[0]) for s in slots])
    o_ref, final_ref, inter_ref = ref_recurrent(x["q"], x["k"], x["v"], x["g"], x["beta"], None, init,
                                                steps_per_token=M)
    for b, s in enumerate(slots):
        if s < 0:
            assert np.all(o[b] == 0), "a -1 request's output rows are exactly 0"
            continue
        assert_close(f"o row {b}", o[b], o_ref[b], REF_REL_BAR)
        assert_close(f"slot {s}", cache[s], final_ref[b], REF_REL_BAR)
        assert_close(f"intermediate states of slot {s}", inter[s], inter_ref[b], REF_REL_BAR)
    for s in (1, 3, 4):
        assert cache[s].tobytes() == before[s].tobytes(), f"unnamed slot {s} changed"
        assert np.all(inter[s] == 7.0), f"intermediate rows of unnamed slot {s} changed"

    # state_indices=None: request b uses slot b, the same numbers as naming them.
    c1, c2 = before[:4].copy(), before[:4].copy()
    o1, _ = gdp.fused_recurrent_gated_delta_rule_update(**x, state=c1, steps_per_token=M)
    o2, _ = gdp.fused_recurrent_gated_delta_rule_update(**x, state=c2, state_indices=np.arange(4, dtype=np.int32),
                                                        steps_per_token=M)
    np.testing.assert_array_equal(o1, o2)
    np.testing.assert_array_equal(c1, c2)
    # state_indices as a Python list (converted to int32 on the CPU backend): the same.
    c3 = before[:4].copy()
    o3, _ = gdp.fused_recurrent_gated_delta_rule_update(**x, state=c3, state_indices=[0, 1, 2, 3],
                                                        steps_per_token=M)
    np.testing.assert_array_equal(o1, o3)
    np.testing.assert_array_equal(c1, c3)


# ---- prepare ----------------------------------------------------------------------------------


def _prepare_ref(x, ba, A_log, dt_bias, M, H, G, P, N, decode):
    """gdp-math.md 6: index maps and gating, in numpy (float32 math for the gates)."""
    n, T, _ = x.shape
    hpg = H // G
    k_base, q_base = M * H * P, M * H * P + M * G * N
    value = x[:, :, :k_base].reshape(n, T, M, H, P).reshape(n, T * M, H, P)
    key_g = x[:, :, k_base:q_base].reshape(n, T, M, G, N)
    key = np.repeat(key_g, hpg, axis=3).reshape(n, T * M, H, N)
    q_tok = np.repeat(x[:, :, q_base:].reshape(n, T, G, N), hpg, axis=2)
    b = ba[:, :, :M * H].astype(np.float32)
    beta = (np.float32(1) / (np.float32(1) + np.exp(-b))).reshape(n, T * M, H)
    a = ba[:, :, M * H:].astype(np.float32) + dt_bias.astype(np.float32)
    sp = np.where(a > 20, a, np.log1p(np.exp(np.minimum(a, 20)))).astype(np.float32)
    g_tok = (-np.exp(A_log.astype(np.float32))) * sp
    if decode:
        query = np.zeros((n, T, M, H, N), x.dtype)
        query[:, :, M - 1] = q_tok
        g = np.zeros((n, T, M, H), np.float32)
        g[:, :, 0] = g_tok
        return query.reshape(n, T * M, H, N), key, value, beta, g.reshape(n, T * M, H)
    return q_tok, key, value, beta, g_tok


@pytest.mark.parametrize("decode", [True, False])
def test_prepare_matches_layout(decode):
    rng = np.random.default_rng(8)
    M, H, G, P, N = 3, 4, 2, 8, 16
    n, T = (3, 2) if decode else (1, 9)
    x = rng.standard_normal((n, T, M * H * P + M * G * N + G * N)).astype(np.float32)
    ba = (rng.standard_normal((n, T, M * H + H)) * 8).astype(np.float32)
    ba[0, 0, M * H] = 30.0  # softplus takes its x > 20 branch
    A_log = rng.standard_normal(H).astype(np.float32)
    dt_bias = rng.standard_normal(H).astype(np.float32)
    fn = gdp.gdp_decode_prepare if decode else gdp.gdp_prefill_prepare
    out = fn(x, ba, A_log, dt_bias, M, H, G, P, N)
    want = _prepare_ref(x, ba, A_log, dt_bias, M, H, G, P, N, decode)
    for name, got, ref in zip(("query", "key", "value", "beta", "g"), out, want):
        assert got.shape == ref.shape, f"{name}: {got.shape} != {ref.shape}"
        assert got.dtype == np.float32
        if name in ("query", "key", "value"):
            np.testing.assert_array_equal(got, ref, err_msg=name)
        else:
            assert int(ulp_distance_f32(got, ref).max()) <= 4, f"{name} differs from gdp-math.md 6.3"


# ---- bad arguments -----------------------------------------------------------------------------


def test_errors_name_the_argument():
    rng = np.random.default_rng(9)
    x = _chunk_case(rng, [40, 24], 64, 2)
    with pytest.raises(ValueError, match=r"k has shape \[1, 10, 2, 16\], expected \[1, 128, 2, 16\]"):
        gdp.chunk_gated_delta_product_varlen(**{**x, "k": x["k"][:, :10]})
    with pytest.raises(TypeError, match=r"q has numpy dtype float64"):
        gdp.chunk_gated_delta_product_varlen(**{**x, "q": x["q"].astype(np.float64)})
    with pytest.raises(TypeError, match=r"v has dtype fp16, expected fp32"):
        gdp.chunk_gated_delta_product_varlen(**{**x, "v": x["v"].astype(np.float16)})
    with pytest.raises(ValueError, match=r"q has shape \[1, 64, 2\], expected \[1, T, H, K\]"):
        gdp.chunk_gated_delta_product_varlen(**{**x, "q": x["q"][..., 0]})
    with pytest.raises(TypeError, match=r"q is a builtins.list"):
        gdp.chunk_gated_delta_product_varlen(**{**x, "q": x["q"].tolist()})
    with pytest.raises(TypeError, match=r"cu_seqlens has dtype float32"):
        gdp.chunk_gated_delta_product_varlen(**{**x, "cu_seqlens": np.array([0.0, 40.0, 64.0], np.float32)})
    with pytest.raises(ValueError, match=r"cu_seqlens\[2\] = 65 tokens exceed the 64 packed tokens"):
        gdp.chunk_gated_delta_product_varlen(**{**x, "cu_seqlens": np.array([0, 40, 65], np.int32)})
    with pytest.raises(ValueError, match=r"state_indices is given without state"):
        gdp.chunk_gated_delta_product_varlen(**x, state_indices=np.array([0, 1], np.int32))
    with pytest.raises(ValueError, match=r"scale is 0"):
        gdp.chunk_gated_delta_product_varlen(**x, scale=0.0)
    with pytest.raises(TypeError, match=r"num_householder is 2.0"):
        gdp.chunk_gated_delta_product_varlen(**{**x, "num_householder": 2.0})
    with pytest.raises(ValueError, match=r"max_seqlen is 65; it is the longest sequence's tokens \(<= T = 64\)"):
        gdp.chunk_gated_delta_product_varlen(**x, max_seqlen=65)
    with pytest.raises(ValueError, match=r"pass all three descriptors"):
        gdp.chunk_gated_delta_product_varlen(**x, chunk_offsets=np.array([0, 1, 2], np.int32))
    with pytest.raises(ValueError, match=r"must be contiguous"):
        gdp.chunk_gated_delta_product_varlen(**{**x, "q": np.asfortranarray(x["q"])})
    d = _decode_case(rng, 2, 2)
    with pytest.raises(ValueError, match=r"cu_seqlens was given"):
        gdp.fused_recurrent_gated_delta_rule_update(**d, cu_seqlens=np.array([0, 2], np.int32))
    with pytest.raises(ValueError, match=r"steps_per_token is 3"):
        gdp.fused_recurrent_gated_delta_rule_update(**d, steps_per_token=3)
    with pytest.raises(ValueError, match=r"num_heads = 0"):
        gdp.gdp_decode_prepare(np.zeros((1, 1, 8), np.float32), np.zeros((1, 1, 2), np.float32),
                               np.zeros(1, np.float32), np.zeros(1, np.float32), 1, 0, 1, 4, 2)
    with pytest.raises(ValueError, match=r"x has shape \[1, 8\], expected \[n, T, M\*H\*P \+ M\*G\*N \+ G\*N\]"):
        gdp.gdp_prefill_prepare(np.zeros((1, 8), np.float32), np.zeros((1, 1, 2), np.float32),
                                np.zeros(1, np.float32), np.zeros(1, np.float32), 1, 1, 1, 4, 2)
    with pytest.raises(ValueError, match=r"num_heads 3 is not a multiple of num_groups 2"):
        gdp.gdp_prefill_prepare(np.zeros((1, 2, 3 * 4 + 2 * 2 * 2), np.float32), np.zeros((1, 2, 6), np.float32),
                                np.zeros(3, np.float32), np.zeros(3, np.float32), 1, 3, 2, 4, 2)


def test_descriptor_errors():
    with pytest.raises(ValueError, match=r"cu_seqlens has 2 entries; prefill_count = 2 needs"):
        gdp.build_gdp_chunk_descriptors([0, 5], 2, 1, 64)
    with pytest.raises(ValueError, match=r"sequence 1 has negative length -2"):
        gdp.build_gdp_chunk_descriptors([0, 5, 3], 2, 1, 64)
    with pytest.raises(ValueError, match=r"exceed padded_token_count 64"):
        gdp.build_gdp_chunk_descriptors([0, 65], 1, 1, 64)
    with pytest.raises(ValueError, match=r"num_householder is 0"):
        gdp.max_gdp_chunk_counts(64, 1, 0)
    with pytest.raises(ValueError, match=r"max_tokens -1"):
        gdp.max_gdp_chunk_counts(-1, 1, 1)
    with pytest.raises(TypeError, match=r"max_tokens is a bool"):
        gdp.max_gdp_chunk_counts(True, 1, 1)
    # Extra entries past prefill_count + 1 are ignored, as upstream's loop ignores them.
    assert gdp.build_gdp_chunk_descriptors([0, 5, 9, 12], 2, 1, 64) == gdp.build_gdp_chunk_descriptors(
        [0, 5, 9], 2, 1, 64)


def test_failing_calls_modify_nothing():
    rng = np.random.default_rng(10)
    x = _chunk_case(rng, [40, 24], 64, 2)
    cache = rng.standard_normal((3, 2, 16, 8)).astype(np.float32)
    before = cache.copy()
    desc = _descriptors(x["cu_seqlens"], 2, 64)
    with pytest.raises(ValueError, match=r"state_indices\[1\] is 3, outside \[0, 3\)"):
        gdp.chunk_gated_delta_product_varlen(**x, state=cache, state_indices=np.array([0, 3], np.int32), **desc)
    with pytest.raises(ValueError, match=r"both name slot 1"):
        gdp.chunk_gated_delta_product_varlen(**x, state=cache, state_indices=np.array([1, 1], np.int32), **desc)
    assert cache.tobytes() == before.tobytes()
    d = _decode_case(rng, 2, 2)
    with pytest.raises(ValueError, match=r"state_indices"):
        gdp.fused_recurrent_gated_delta_rule_update(**d, state=cache, state_indices=np.array([0, 9], np.int32))
    assert cache.tobytes() == before.tobytes()
    frozen = cache.copy()
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match=r"state is a read-only array"):
        gdp.fused_recurrent_gated_delta_rule_update(**d, state=frozen, state_indices=np.array([0, 1], np.int32))


# ---- torch CPU tensors -------------------------------------------------------------------------


def test_torch_cpu_tensors_match_numpy():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(11)
    x = _chunk_case(rng, [70, 0, 20], 96, 2)
    desc = _descriptors(x["cu_seqlens"], 2, 96)
    cache = np.zeros((4, 2, 16, 8), np.float32)
    slots = np.array([3, -1, 1], np.int32)
    o_np, _, s_np = gdp.chunk_gated_delta_product_varlen(**x, state=cache, state_indices=slots,
                                                         return_chunk_states=True, **desc)
    tx = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in x.items()}
    tcache = torch.zeros(4, 2, 16, 8)
    o_t, fs, s_t = gdp.chunk_gated_delta_product_varlen(
        **tx, state=tcache, state_indices=torch.from_numpy(slots), return_chunk_states=True,
        **{k: torch.from_numpy(v) for k, v in desc.items()})
    assert isinstance(o_t, torch.Tensor) and fs is tcache and o_t.dtype == torch.float32
    np.testing.assert_array_equal(o_t.numpy(), o_np)
    np.testing.assert_array_equal(tcache.numpy(), cache)
    np.testing.assert_array_equal(s_t.numpy()[:desc["chunk_offsets"][-1]], s_np[:desc["chunk_offsets"][-1]])
    # bf16 torch tensors: o in bf16, the float32 result rounded once.
    tb = {k: (v.to(torch.bfloat16) if isinstance(v, torch.Tensor) and v.is_floating_point() and k != "g" else v)
          for k, v in tx.items()}
    o_b, _ = gdp.chunk_gated_delta_product_varlen(**tb)
    assert o_b.dtype == torch.bfloat16
    xb = {k: (v.to(torch.float32).numpy() if isinstance(v, torch.Tensor) and v.is_floating_point() else v)
          for k, v in tb.items()}
    o_ref, _ = gdp.chunk_gated_delta_product_varlen(**{**xb, "cu_seqlens": x["cu_seqlens"]})
    np.testing.assert_array_equal(o_b.float().numpy(), torch.from_numpy(o_ref).to(torch.bfloat16).float().numpy())
