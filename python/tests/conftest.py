"""conftest.py: shared helpers of the gdp Python tests.

  - the golden directory ($GDP_GOLDEN_DIR, else <repo>/../shared/golden; missing is a
    failure, never a skip) and a tiny safetensors reader (JSON header + numpy.frombuffer;
    bf16 = uint16 << 16 viewed as float32);
  - comparisons with the golden README's bars (relative RMS plus elementwise
    |a - b| <= atol + rtol * |b|, as tests/test_common.c's test_compare) and ulp distances;
  - float64 numpy references of the recurrence (gdp-math.md 2) for the chunk and decode
    ops, written independently of libgdp (test-only; the package never loops in Python).

The package is imported from this checkout (python/), so the tests exercise the sources
next to them; libgdp comes from $GDP_LIBRARY (ctest sets it) or the build tree.
"""

import json
import os
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "python"))


def golden_dir():
    env = os.environ.get("GDP_GOLDEN_DIR", "")
    return Path(env) if env else REPO.parent / "shared" / "golden"


@pytest.fixture(scope="session")
def golden():
    d = golden_dir()
    if not (d / "MANIFEST.json").is_file():
        pytest.fail(f"golden directory {d} (from $GDP_GOLDEN_DIR or <repo>/../shared/golden) has no "
                    f"MANIFEST.json; a missing golden set is a failure, not a skip")
    return d


# ---- safetensors ------------------------------------------------------------------------

_ST_DTYPES = {"F32": np.float32, "F16": np.float16, "I32": np.int32, "I64": np.int64, "F64": np.float64,
              "BF16": np.uint16, "U8": np.uint8}


class SafeTensors:
    """One .safetensors file: .meta (values JSON-decoded where they parse), .dtype(name)
    ("F32", "BF16", ...), .raw(name) (the stored elements; bf16 as uint16 bits) and
    .f32(name) (float32 values; bf16 widened exactly)."""

    def __init__(self, path):
        data = Path(path).read_bytes()
        (n,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8:8 + n])
        self._body = data[8 + n:]
        self.meta = {}
        for key, value in header.pop("__metadata__", {}).items():
            try:
                self.meta[key] = json.loads(value)
            except (TypeError, ValueError):
                self.meta[key] = value
        self._entries = header
        self.path = Path(path)

    def names(self):
        return list(self._entries)

    def dtype(self, name):
        return self._entries[name]["dtype"]

    def raw(self, name):
        e = self._entries[name]
        begin, end = e["data_offsets"]
        return np.frombuffer(self._body[begin:end], dtype=_ST_DTYPES[e["dtype"]]).reshape(e["shape"]).copy()

    def f32(self, name):
        arr = self.raw(name)
        if self.dtype(name) == "BF16":
            return bf16_bits_to_f32(arr)
        return arr.astype(np.float32)


def load_golden(golden_path, name):
    path = Path(golden_path) / f"{name}.safetensors"
    if not path.is_file():
        pytest.fail(f"golden file {path} is missing")
    return SafeTensors(path)


# ---- bf16 and ulps ------------------------------------------------------------------------


def bf16_bits_to_f32(bits):
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16_bits(x):
    """Round-to-nearest-even float32 -> bf16 bits (finite inputs)."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def _ordered(bits, width):
    """Maps float bit patterns to integers whose order and differences count ulps."""
    b = bits.astype(np.int64)
    sign = np.int64(1) << (width - 1)
    return np.where(b & sign, -(b & (sign - 1)), b)


def ulp_distance_f32(a, b):
    return np.abs(_ordered(np.asarray(a, np.float32).view(np.uint32), 32) -
                  _ordered(np.asarray(b, np.float32).view(np.uint32), 32))


def ulp_distance_bf16_bits(a_bits, b_bits):
    return np.abs(_ordered(np.asarray(a_bits, np.uint16), 16) - _ordered(np.asarray(b_bits, np.uint16), 16))


def bf16_ulp(x):
    """One bf16 ulp at |x| (the spacing of bf16 numbers around x)."""
    x = np.abs(np.asarray(x, np.float64))
    exp = np.floor(np.log2(np.maximum(x, 2.0 ** -126)))
    return 2.0 ** (exp - 7)


# ---- comparisons ---------------------------------------------------------------------------


def rel_rms(a, b):
    a = np.asarray(a, np.float64).ravel()
    b = np.asarray(b, np.float64).ravel()
    num = float(np.sum((a - b) ** 2))
    den = float(np.sum(b * b))
    if np.isnan(num):
        return float("inf")
    return np.sqrt(num / den) if den > 0 else np.sqrt(num)


def assert_close(what, got, want, rel_bar=None, atol=None, rtol=0.0, extra_abs=None):
    """The golden README's bars: relative RMS < rel_bar (an all-zero reference makes it an
    absolute 1e-6) and every |got - want| <= atol + rtol * |want| (+ extra_abs, e.g. one
    bf16 ulp of want)."""
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    assert np.all(np.isfinite(got)), f"{what}: {np.count_nonzero(~np.isfinite(got))} non-finite values"
    if rel_bar is not None:
        bar = rel_bar if np.any(want != 0) else 1e-6
        r = rel_rms(got, want)
        assert r < bar, f"{what}: relative RMS {r:.3e} >= {bar:.1e} (n={got.size})"
    if atol is not None:
        limit = atol + rtol * np.abs(want)
        if extra_abs is not None:
            limit = limit + extra_abs
        bad = np.abs(got - want) > limit
        if np.any(bad):
            i = np.unravel_index(np.argmax(np.abs(got - want) - limit), got.shape)
            pytest.fail(f"{what}: {np.count_nonzero(bad)} of {got.size} elements outside atol={atol:.1e} "
                        f"rtol={rtol:.1e}; worst {i}: got {got[i]!r} want {want[i]!r}")
    return rel_rms(got, want)


# ---- float64 references of the recurrence (gdp-math.md 2) ---------------------------------


def _l2n(x):
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + 1e-6)


def ref_gdp_varlen(q, k, v, g, beta, M, cu, scale=None, initial_state=None, l2norm=False):
    """The per-token GDP recurrence in float64 over packed varlen sequences.
    q [1,T,H,K], k [1,T*M,H,K], v [1,T*M,H,V], g [1,T,H], beta [1,T*M,H], cu [N+1].
    Returns (o [1,T,H,V] zero past cu[-1], final [N,H,K,V], chunk_states dict
    {(i, c): state after the first 64c tokens of sequence i})."""
    q, k, v, g, beta = (np.asarray(x, np.float64)[0] for x in (q, k, v, g, beta))
    T, H, K = q.shape
    V = v.shape[-1]
    scale = K ** -0.5 if scale is None else scale
    if l2norm:
        q, k = _l2n(q), _l2n(k)
    N = len(cu) - 1
    o = np.zeros((T, H, V))
    final = np.zeros((N, H, K, V))
    chunks = {}
    for i in range(N):
        S = np.zeros((H, K, V)) if initial_state is None else np.asarray(initial_state[i], np.float64).copy()
        for t in range(cu[i], cu[i + 1]):
            local = t - cu[i]
            if local % 64 == 0:
                chunks[(i, local // 64)] = S.copy()
            S *= np.exp(g[t])[:, None, None]
            for m in range(M):
                j = t * M + m
                kk = k[j]
                delta = beta[j][:, None] * (v[j] - np.einsum("hkv,hk->hv", S, kk))
                S += kk[:, :, None] * delta[:, None, :]
            o[t] = scale * np.einsum("hkv,hk->hv", S, q[t])
        final[i] = S  # a zero-length sequence keeps its initial state
    return o[None], final, chunks


def ref_recurrent(q, k, v, g, beta, scale=None, initial_state=None, l2norm=False, steps_per_token=1):
    """The decode recurrence in float64: q,k [B,T,H,K], v [B,T,H,V], g/beta [B,T,H] or None.
    Returns (o [B,T,H,V], final [B,H,K,V], inter [B,S,H,K,V] state after each token)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    B, T, H, K = q.shape
    V = v.shape[-1]
    if l2norm:
        q, k = _l2n(q), _l2n(k)
    scale = K ** -0.5 if scale is None else scale
    g = np.zeros((B, T, H)) if g is None else np.asarray(g, np.float64)
    beta = np.ones((B, T, H)) if beta is None else np.asarray(beta, np.float64)
    o = np.zeros((B, T, H, V))
    final = np.zeros((B, H, K, V))
    inter = np.zeros((B, T // steps_per_token, H, K, V))
    for b in range(B):
        S = np.zeros((H, K, V)) if initial_state is None else np.asarray(initial_state[b], np.float64).copy()
        for t in range(T):
            S *= np.exp(g[b, t])[:, None, None]
            delta = beta[b, t][:, None] * (v[b, t] - np.einsum("hkv,hk->hv", S, k[b, t]))
            S += k[b, t][:, :, None] * delta[:, None, :]
            o[b, t] = scale * np.einsum("hkv,hk->hv", S, q[b, t])
            if (t + 1) % steps_per_token == 0:
                inter[b, t // steps_per_token] = S
        final[b] = S
    return o, final, inter


def ml_dtypes_bf16():
    """numpy's bfloat16 dtype from ml_dtypes, or None when it is not installed."""
    try:
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    except ImportError:
        return None
