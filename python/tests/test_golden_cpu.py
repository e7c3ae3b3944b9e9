"""test_golden_cpu.py: the Python ops on the CPU backend (numpy arrays) against the golden
files of ../shared/golden, with the bars of its README:

  - descriptors.json: max_gdp_chunk_counts and build_gdp_chunk_descriptors exactly equal to
    Megatron's builder;
  - chunk_*: o, the dense final states and the chunk states (rows < chunk_offsets[N]) within
    relative RMS 1e-5 (CPU reference, double math) and atol = rtol = 2e-2; o rows past
    cu_seqlens[-1] exactly 0; chunk_states shaped [num_chunks (padded), H, K, V] in
    initial_state's dtype; the same bits without descriptors (NT rows); cache mode writes
    the reference final states into the named slots and leaves every other slot's bytes
    alone; with ml_dtypes, bf16 inputs give a bf16 o within the bf16 kernel bar
    (relative RMS 8e-3, atol = rtol = 2e-2);
  - decode_*: o, the slots and the intermediate states within atol = rtol = 1e-3 (plus one
    bf16 ulp for a bf16 o), -1 rows exactly 0, unnamed slots bitwise unchanged, their
    intermediate rows still 0;
  - prepare_*: query, key, value bitwise; beta and g within 4 ulp of their dtype; also with
    x and ba as strided row views of wider buffers.
A missing golden file fails the test.
"""

import json

import numpy as np
import pytest

import gdp
from conftest import (assert_close, bf16_ulp, f32_to_bf16_bits, load_golden, ml_dtypes_bf16, ulp_distance_bf16_bits,
                      ulp_distance_f32)

CHUNK_FILES = ["chunk_m1_k64_single", "chunk_m2_k64_varlen", "chunk_m3_k100_padded", "chunk_m4_k128_scale",
               "chunk_m2_k128_v64_long"]
DECODE_FILES = ["decode_m1_k128", "decode_m2_slots_pad", "decode_m3_draft3"]
PREPARE_FILES = ["prepare_decode_bf16", "prepare_decode_draft_fp32", "prepare_prefill_bf16",
                 "prepare_prefill_fp32_gqa4"]

CPU_REL_BAR = 1e-5        # golden README: CPU reference with double math
BF16_REL_BAR = 8e-3       # golden README: bf16 kernels (a bf16 o is bf16-rounded)
CHUNK_ELEM_TOL = 2e-2     # Megatron's elementwise atol = rtol
DECODE_TOL = 1e-3         # golden README: decode atol = rtol
PREPARE_MAX_ULP = 4       # golden README: a CPU prepare, beta and g


def _input_dtype(kind):
    """numpy dtype the bf16 golden inputs are fed as: float32 (exact widening) or bf16."""
    if kind == "fp32":
        return np.dtype(np.float32)
    bf16 = ml_dtypes_bf16()
    if bf16 is None:
        pytest.skip("ml_dtypes is not installed: numpy has no bfloat16 (the float32 runs cover the op)")
    return bf16


def _as(f, name, dtype):
    """Tensor `name` of golden file f in `dtype` when the file stores it as bf16, else as stored."""
    if f.dtype(name) == "BF16":
        return f.f32(name).astype(dtype)
    return f.raw(name)


# ---- descriptors ---------------------------------------------------------------------------


def test_descriptors_golden(golden):
    cases = json.loads((golden / "descriptors.json").read_text())["cases"]
    assert cases, "descriptors.json has no cases"
    for c in cases:
        args = (c["cu_seqlens"], c["prefill_count"], c["num_householder"], c["padded_token_count"])
        counts = gdp.max_gdp_chunk_counts(c["padded_token_count"], c["prefill_count"], c["num_householder"])
        assert list(counts) == c["max_chunk_counts"], f"max_gdp_chunk_counts {args}: {counts}"
        got = gdp.build_gdp_chunk_descriptors(*args)
        want = (c["chunk_indices"], c["chunk_indices_dp"], c["chunk_offsets"], c["num_chunks"], c["num_chunks_dp"])
        for name, g_, w in zip(("chunk_indices", "chunk_indices_dp", "chunk_offsets", "num_chunks",
                                "num_chunks_dp"), got, want):
            assert g_ == w, f"build_gdp_chunk_descriptors{args}: {name} {g_} != Megatron's {w}"
        assert isinstance(got[0], list) and isinstance(got[3], int)


# ---- chunked prefill -----------------------------------------------------------------------


def _chunk_inputs(f, dtype):
    return dict(q=_as(f, "q", dtype), k=_as(f, "k", dtype), v=_as(f, "v", dtype), g=f.raw("g"),
                beta=_as(f, "beta", dtype), num_householder=f.meta["num_householder"], cu_seqlens=f.raw("cu_seqlens"),
                scale=f.meta["scale"], use_qk_l2norm_in_kernel=f.meta["use_qk_l2norm_in_kernel"])


@pytest.mark.parametrize("kind", ["fp32", "bf16"])
@pytest.mark.parametrize("name", CHUNK_FILES)
def test_chunk_golden(golden, name, kind):
    dtype = _input_dtype(kind)
    f = load_golden(golden, name)
    x = _chunk_inputs(f, dtype)
    cu = x["cu_seqlens"]
    N, T = len(cu) - 1, x["q"].shape[1]
    offsets = f.raw("chunk_offsets")
    real_rows = int(offsets[N])
    o, final, states = gdp.chunk_gated_delta_product_varlen(
        **x, initial_state=f.raw("initial_state"), output_final_state=True, chunk_indices=f.raw("chunk_indices"),
        chunk_indices_dp=f.raw("chunk_indices_dp"), chunk_offsets=offsets, return_chunk_states=True)

    H, V = x["v"].shape[2], x["v"].shape[3]
    assert o.shape == (1, T, H, V) and o.dtype == dtype, f"o is {o.shape} {o.dtype}"
    assert final.dtype == np.float32 and final.shape == f.raw("final_state_ref").shape
    assert states.dtype == np.float32, "chunk_states take initial_state's dtype (float32)"
    assert states.shape[0] == f.raw("chunk_indices").shape[0], "chunk_states rows = padded num_chunks"
    o64 = o.astype(np.float64)
    assert np.all(o64[:, cu[-1]:] == 0), "rows of o past cu_seqlens[-1] must be exactly 0"
    o_bar = CPU_REL_BAR if kind == "fp32" else BF16_REL_BAR
    assert_close(f"{name} o", o64, f.raw("o_ref"), o_bar, CHUNK_ELEM_TOL, CHUNK_ELEM_TOL)
    assert_close(f"{name} final_state", final, f.raw("final_state_ref"), CPU_REL_BAR, CHUNK_ELEM_TOL,
                 CHUNK_ELEM_TOL)
    assert_close(f"{name} chunk_states", states[:real_rows], f.raw("chunk_states_ref")[:real_rows], CPU_REL_BAR,
                 CHUNK_ELEM_TOL, CHUNK_ELEM_TOL)

    # Without descriptors: derived inside, NT = chunk_offsets[N] rows, the same numbers.
    o2, final2, states2 = gdp.chunk_gated_delta_product_varlen(
        **x, initial_state=f.raw("initial_state"), output_final_state=True, return_chunk_states=True)
    assert states2.shape[0] == real_rows
    np.testing.assert_array_equal(o2.astype(np.float64), o64)
    np.testing.assert_array_equal(final2, final)
    np.testing.assert_array_equal(states2, states[:real_rows])


@pytest.mark.parametrize("name", CHUNK_FILES)
def test_chunk_golden_cache_mode(golden, name):
    """The final states land in the cache slots (in place), zero-length requests are -1
    (nothing written), every other slot keeps its bytes; o is the dense run's."""
    f = load_golden(golden, name)
    x = _chunk_inputs(f, np.dtype(np.float32))
    cu = x["cu_seqlens"]
    N = len(cu) - 1
    init = f.raw("initial_state")
    rng = np.random.default_rng(7)
    n_slots = N + 3
    cache = rng.standard_normal((n_slots,) + init.shape[1:]).astype(np.float32)
    before = cache.copy()
    slots = rng.permutation(n_slots)[:N].astype(np.int32)
    lens = np.diff(cu)
    slots[lens == 0] = -1
    desc = dict(chunk_indices=f.raw("chunk_indices"), chunk_indices_dp=f.raw("chunk_indices_dp"),
                chunk_offsets=f.raw("chunk_offsets"))
    o, final = gdp.chunk_gated_delta_product_varlen(**x, initial_state=init, state=cache, state_indices=slots,
                                                    **desc)
    assert final is cache, "cache mode returns the cache tensor itself"
    ref = f.raw("final_state_ref")
    named = [int(s) for s in slots if s >= 0]
    for i, s in enumerate(slots):
        if s >= 0:
            assert_close(f"{name} slot {s} (sequence {i})", cache[s], ref[i], CPU_REL_BAR, CHUNK_ELEM_TOL,
                         CHUNK_ELEM_TOL)
    for s in range(n_slots):
        if s not in named:
            assert cache[s].tobytes() == before[s].tobytes(), f"{name}: slot {s} is named by no request but changed"
    o_dense, _ = gdp.chunk_gated_delta_product_varlen(**x, initial_state=init, **desc)
    np.testing.assert_array_equal(o, o_dense)


# ---- decode --------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["fp32", "bf16"])
@pytest.mark.parametrize("name", DECODE_FILES)
def test_decode_golden(golden, name, kind):
    dtype = _input_dtype(kind)
    f = load_golden(golden, name)
    M, S = f.meta["num_householder"], f.meta["tokens_per_request"]
    state = f.raw("state")
    before = state.copy()
    slots = f.raw("state_indices")
    H, K, V = state.shape[1:]
    inter = np.zeros((state.shape[0], S, H, K, V), np.float32)
    o, final = gdp.fused_recurrent_gated_delta_rule_update(
        _as(f, "q", dtype), _as(f, "k", dtype), _as(f, "v", dtype), g=f.raw("g"), beta=_as(f, "beta", dtype),
        scale=f.meta["scale"], use_qk_l2norm_in_kernel=f.meta["use_qk_l2norm_in_kernel"], state=state,
        state_indices=slots, intermediate_states=inter, steps_per_token=M)
    assert final is state, "cache mode returns the cache tensor itself"
    assert o.dtype == dtype and o.shape == f.raw("o_ref").shape
    o_ref = f.raw("o_ref")
    o64 = o.astype(np.float64)
    extra = bf16_ulp(o_ref) if kind == "bf16" else None
    assert_close(f"{name} o", o64, o_ref, None, DECODE_TOL, DECODE_TOL, extra_abs=extra)
    assert np.all(o64[slots < 0] == 0), "rows of -1 requests must be exactly 0"
    assert_close(f"{name} state", state, f.raw("state_after_ref"), None, DECODE_TOL, DECODE_TOL)
    assert_close(f"{name} intermediate_states", inter, f.raw("intermediate_states_ref"), None, DECODE_TOL,
                 DECODE_TOL)
    named = set(int(s) for s in slots if s >= 0)
    for s in range(state.shape[0]):
        if s not in named:
            assert state[s].tobytes() == before[s].tobytes(), f"{name}: unnamed slot {s} changed"
            assert np.all(inter[s] == 0), f"{name}: intermediate rows of unnamed slot {s} were written"


# ---- prepare -------------------------------------------------------------------------------


def _prepare_call(f, x, ba):
    m = f.meta
    fn = gdp.gdp_decode_prepare if m["op"] == "gdp_decode_prepare" else gdp.gdp_prefill_prepare
    dt_bias = f.raw("dt_bias") if f.dtype("dt_bias") != "BF16" else f.f32("dt_bias")
    return fn(x, ba, f.raw("A_log"), dt_bias, m["num_householder"], m["num_heads"], m["num_groups"],
              m["head_dim"], m["state_dim"])


def _check_prepare(f, out, native_bf16):
    names = ("query", "key", "value", "beta", "g")
    for n, got in zip(names, out):
        ref_name = f"{n}_ref"
        assert got.shape == f.raw(ref_name).shape, f"{n}: shape {got.shape} != {f.raw(ref_name).shape}"
        if f.dtype(ref_name) == "BF16":
            bits = got.view(np.uint16) if native_bf16 else f32_to_bf16_bits(got)
            ref_bits = f.raw(ref_name)
            if n in ("query", "key", "value"):
                assert native_bf16 or got.dtype == np.float32
                np.testing.assert_array_equal(bits, ref_bits, err_msg=f"{n} must be a bitwise copy")
            else:
                worst = int(ulp_distance_bf16_bits(bits, ref_bits).max())
                assert worst <= PREPARE_MAX_ULP, f"{n}: {worst} bf16 ulp from the reference"
        else:
            assert got.dtype == np.float32
            if n in ("query", "key", "value"):
                np.testing.assert_array_equal(got, f.raw(ref_name), err_msg=f"{n} must be a bitwise copy")
            else:
                worst = int(ulp_distance_f32(got, f.raw(ref_name)).max())
                assert worst <= PREPARE_MAX_ULP, f"{n}: {worst} ulp from the reference"


# Files with bf16 inputs run twice: widened to float32, and as ml_dtypes bf16.
PREPARE_CASES = [(n, kind) for n in PREPARE_FILES for kind in (("fp32", "bf16") if "bf16" in n else ("fp32",))]


@pytest.mark.parametrize("name,kind", PREPARE_CASES)
def test_prepare_golden(golden, name, kind):
    f = load_golden(golden, name)
    assert (f.dtype("x") == "BF16") == ("bf16" in name), f"{name}: x is {f.dtype('x')}"
    dtype = _input_dtype(kind)
    x, ba = _as(f, "x", dtype), _as(f, "ba", dtype)
    out = _prepare_call(f, x, ba)
    _check_prepare(f, out, native_bf16=(kind == "bf16"))

    # Rows as strided views of wider buffers (a slice of the conv / in_proj output).
    wide_x = np.zeros(x.shape[:2] + (x.shape[2] + 40,), x.dtype)
    wide_x[..., 16:16 + x.shape[2]] = x
    wide_ba = np.zeros(ba.shape[:2] + (ba.shape[2] + 8,), ba.dtype)
    wide_ba[..., 8:] = ba
    x_view, ba_view = wide_x[..., 16:16 + x.shape[2]], wide_ba[..., 8:]
    assert not x_view.flags.c_contiguous
    out_view = _prepare_call(f, x_view, ba_view)
    for n, a, b in zip(("query", "key", "value", "beta", "g"), out, out_view):
        assert a.tobytes() == b.tobytes(), f"{n}: the strided view gives other bits than the contiguous input"
