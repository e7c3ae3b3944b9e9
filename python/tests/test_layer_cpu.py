"""test_layer_cpu.py: gdp.layer (checkpoint -> layer, state cache, step plan, one forward
step) on the CPU backend at TP = 1, against a float64 numpy transcription of the mixer of
gdp-layer.md section 1 (pre-RMSNorm, in_proj, causal conv + SiLU with the carried window,
split / GQA / gating, the GDP recurrence with the in-kernel L2 norm, grouped gated RMSNorm,
out_proj, residual) that reads the checkpoint with the tests' own safetensors reader:

  - a prefill step of two new requests (70 and 5 tokens): each prefill row's residual delta
    within max|a - b| <= 1e-5 max|b| (gdp-math.md 8.1, CPU layer bar), the slots' ssm states
    the same, the conv states exactly the last W pre-conv inputs (float32-rounded); padding
    rows (the decode block and the padded tail) bit-identical;
  - a decode step of both requests: each decode row's delta equal to recomputing the whole
    sequence, max|a - b| <= 1e-4 max|b| (8.1: decode vs recompute);
  - metadata: padded sizes, resolved slots, cu_seqlens; slot bookkeeping;
  - errors: x of the wrong shape (ValueError naming x, x and the cache unchanged), stale
    metadata, an unknown config field, an over-full step (ValueError naming the numbers);
  - a TP = 2 run under mpirun equals TP = 1 (when mpirun is available).
"""

import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from gdp import layer as gl
from conftest import REPO, SafeTensors, ref_gdp_varlen

LAYER_BAR = 1e-5      # gdp-math.md 8.1: CPU layer outputs and states
RECOMPUTE_BAR = 1e-4  # gdp-math.md 8.1: decode after prefill vs recomputing the sequence
CFG = dict(hidden_size=32, num_heads=4, num_groups=2, head_dim=8, state_dim=16, num_householder=2,
           num_layers=1)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt") / "gdp.safetensors"
    gl.write_synthetic_checkpoint(path, gl.layer_config(**CFG), seed=11)
    return path


def _silu(x):
    return x / (1 + np.exp(-x))


class Reference:
    """The TP = 1 mixer of one layer in float64, from the checkpoint file."""

    def __init__(self, path, layer=0):
        f = SafeTensors(path)
        c = gl.config_dict(gl.Checkpoint(path).config)
        self.D, self.H, self.G = c["hidden_size"], c["num_heads"], c["num_groups"]
        self.P, self.N, self.M, self.W = c["head_dim"], c["state_dim"], c["num_householder"], c["conv_width"]
        self.eps, self.out_eps = c["norm_eps"], c["out_norm_eps"]
        t = lambda n: f.f32(f"layers.{layer}.{n}").astype(np.float64)  # noqa: E731
        M = self.M
        self.norm_w = t("norm.weight")
        self.w_z = t("in_proj.z")
        self.w_vkq = np.concatenate([t(f"in_proj.V{m}") for m in range(M)] + [t(f"in_proj.K{m}") for m in range(M)]
                                    + [t("in_proj.Q")])
        self.w_ba = np.concatenate([t(f"in_proj.b{m}") for m in range(M)] + [t("in_proj.a")])
        self.conv = np.concatenate([t(f"conv.V{m}") for m in range(M)] + [t(f"conv.K{m}") for m in range(M)]
                                   + [t("conv.Q")])
        self.A_log, self.dt_bias = t("A_log"), t("dt_bias")
        self.out_norm_w, self.out_proj = t("out_norm.weight"), t("out_proj")

    def sequence(self, x):
        """One new request's tokens x [L, D] from zero state: (delta [L, D], ssm [H, N, P],
        pre-conv inputs [L, conv_dim])."""
        H, G, P, N, M, W = self.H, self.G, self.P, self.N, self.M, self.W
        x = np.asarray(x, np.float64)
        L = x.shape[0]
        h = x / np.sqrt(np.mean(x * x, axis=1, keepdims=True) + self.eps) * self.norm_w
        z, vkq, ba = h @ self.w_z.T, h @ self.w_vkq.T, h @ self.w_ba.T
        padded = np.concatenate([np.zeros((W - 1, vkq.shape[1])), vkq])  # a new slot's window is zero
        conv = sum(padded[j:j + L] * self.conv[:, j] for j in range(W))
        act = _silu(conv)
        kb, qb = M * H * P, M * H * P + M * G * N
        v = act[:, :kb].reshape(L * M, H, P)
        k = np.repeat(act[:, kb:qb].reshape(L, M, G, N), H // G, axis=2).reshape(L * M, H, N)
        q = np.repeat(act[:, qb:].reshape(L, G, N), H // G, axis=1)
        beta = (1 / (1 + np.exp(-ba[:, :M * H]))).reshape(L * M, H)
        a = ba[:, M * H:] + self.dt_bias
        g = -np.exp(self.A_log) * np.where(a > 20, a, np.log1p(np.exp(np.minimum(a, 20))))
        o, final, _ = ref_gdp_varlen(q[None], k[None], v[None], g[None], beta[None], M, [0, L], None, None, True)
        y = o[0].reshape(L, H * P) * _silu(z)
        gs = (H // G) * P
        yg = y.reshape(L, G, gs)
        yn = (yg / np.sqrt(np.mean(yg * yg, axis=2, keepdims=True) + self.out_eps)).reshape(L, H * P)
        out = (yn * self.out_norm_w) @ self.out_proj.T
        return out, final[0], vkq


def _max_ratio(a, b):
    return float(np.max(np.abs(np.asarray(a, np.float64) - b)) / np.max(np.abs(b)))


def test_layer_prefill_and_decode_match_the_reference(checkpoint):
    ref = Reference(checkpoint)
    layer = gl.Layer(checkpoint, 0)
    shard = layer.shard
    assert (shard.tp_size, shard.num_heads, shard.conv_dim) == (1, 4, ref.conv.shape[0])
    cache = gl.StateCache(shard, n_slots=4)
    plan = gl.StepPlan(ref.M, 4, buckets=[(2, 2, 128), (2, 0, 2)])
    rng = np.random.default_rng(1)
    lens = {"A": 70, "B": 5}
    tokens = {r: (rng.standard_normal((n + 1, ref.D)) * 0.05).astype(np.float32) for r, n in lens.items()}

    # ---- step 1: prefill A and B (new slots chosen by the plan) ----
    meta = plan.step(cache, prefill=[gl.PrefillRequest(lens["A"], new=True), gl.PrefillRequest(lens["B"], new=True)])
    assert (meta.bucket, meta.padded_token_count, meta.prefill_token_offset) == (0, 128, 2)
    assert meta.decode_slots == [-1, -1] and meta.cu_seqlens == [0, 70, 75]
    slot = dict(zip("AB", meta.prefill_slots))
    assert sorted(slot.values()) == [0, 1] and cache.free_slot_count() == 2 and cache.slot_in_use(slot["B"])
    x = (rng.standard_normal((128, ref.D)) * 0.05).astype(np.float32)
    off = meta.prefill_token_offset
    x[off:off + 70] = tokens["A"][:70]
    x[off + 70:off + 75] = tokens["B"][:5]
    x_in = x.copy()
    assert layer.forward(x, cache, meta) is x
    ssm, conv = cache.state_views(0)
    for r, start in (("A", off), ("B", off + 70)):
        n = lens[r]
        delta, final, vkq = ref.sequence(tokens[r][:n])
        got = x[start:start + n].astype(np.float64) - x_in[start:start + n]
        assert _max_ratio(got, delta) <= LAYER_BAR, f"prefill {r}: layer delta off by {_max_ratio(got, delta):.2e}"
        assert _max_ratio(ssm[slot[r]], final) <= LAYER_BAR, f"prefill {r}: ssm state"
        want_conv = vkq[-ref.W:].T.astype(np.float32)  # [conv_dim, W], column W-1 newest
        np.testing.assert_allclose(conv[slot[r]], want_conv, rtol=1e-5, atol=1e-7, err_msg=f"conv state of {r}")
    dead = np.r_[0:off, off + 75:128]
    assert x[dead].tobytes() == x_in[dead].tobytes(), "padding rows must come out unchanged"

    # ---- step 2: decode one token of each (bucket 1: 2 decode rows, no prefill) ----
    meta2 = plan.step(cache, decode_slots=[slot["A"], slot["B"]])
    assert (meta2.bucket, meta2.padded_token_count, meta2.decode_slots) == (1, 2, [slot["A"], slot["B"]])
    with pytest.raises(ValueError, match="stale"):
        layer.forward(x, cache, meta)
    xd = np.stack([tokens["A"][70], tokens["B"][5]])
    xd_in = xd.copy()
    layer.forward(xd, cache, meta2)
    for row, r in enumerate("AB"):
        n = lens[r]
        delta, final, _ = ref.sequence(tokens[r][:n + 1])
        got = xd[row].astype(np.float64) - xd_in[row]
        assert _max_ratio(got, delta[-1]) <= RECOMPUTE_BAR, f"decode {r}: {_max_ratio(got, delta[-1]):.2e}"
        assert _max_ratio(ssm[slot[r]], final) <= RECOMPUTE_BAR, f"decode {r}: ssm state"


def test_layer_errors(checkpoint):
    layer = gl.Layer(checkpoint, 0)
    cache = gl.StateCache(layer.shard, n_slots=2)
    plan = gl.StepPlan(CFG["num_householder"], 2, buckets=[(1, 4, 64)])
    meta = plan.step(cache, prefill=[gl.PrefillRequest(10, new=True)])
    ssm, conv = cache.state_views(0)
    before = ssm.copy(), conv.copy()
    x = np.ones((63, CFG["hidden_size"]), np.float32)
    with pytest.raises(ValueError, match=r"x"):
        layer.forward(x, cache, meta)
    assert np.all(x == 1) and ssm.tobytes() == before[0].tobytes() and conv.tobytes() == before[1].tobytes()
    with pytest.raises(TypeError, match=r"x has numpy dtype float64"):
        layer.forward(np.zeros((64, CFG["hidden_size"])), cache, meta)
    with pytest.raises(ValueError, match=r"3 new requests need slots but only 1 of"):
        plan.step(cache, prefill=[gl.PrefillRequest(1, new=True)] * 3)
    with pytest.raises(ValueError, match=r"100 prefill tokens\) fits none of the 1 buckets"):
        plan.step(cache, prefill=[gl.PrefillRequest(100, new=True)])
    with pytest.raises(TypeError, match=r"unknown field 'hiden_size'"):
        gl.layer_config(hiden_size=8)
    with pytest.raises(ValueError, match=r"num_heads"):
        gl.layer_config(hidden_size=8, num_heads=6, num_groups=4)
    with pytest.raises(ValueError, match=r"tp_size|divisible"):
        gl.Layer(checkpoint, 0, tp_rank=0, tp_size=3)
    with pytest.raises(RuntimeError):
        gl.Checkpoint(REPO / "does-not-exist.safetensors")


def test_layer_tp2_matches_tp1(checkpoint, tmp_path):
    """Two ranks under mpirun, each its shard over a gdp.layer.Comm (MPI), against a TP = 1
    layer on every rank: the same residual deltas and each rank's heads of the states."""
    mpirun = shutil.which("mpirun") or shutil.which("mpiexec")
    if mpirun is None:
        pytest.skip("mpirun is not installed")
    script = tmp_path / "tp2.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(REPO / "python")!r})
        import numpy as np
        from gdp import layer as gl
        comm = gl.Comm("mpi")
        rank, size = comm.rank, comm.size
        assert size == 2, size
        path = {str(checkpoint)!r}
        results = []
        for tp, c in ((2, comm), (1, None)):
            layer = gl.Layer(path, 0, tp_rank=rank if tp == 2 else 0, tp_size=tp, comm=c)
            cache = gl.StateCache(layer.shard, n_slots=2)
            plan = gl.StepPlan({CFG["num_householder"]}, 2, buckets=[(1, 1, 96)])
            meta = plan.step(cache, prefill=[gl.PrefillRequest(80, new=True)], comm=c)
            x = (np.random.default_rng(5).standard_normal((96, {CFG["hidden_size"]})) * 0.05).astype(np.float32)
            x_in = x.copy()
            layer.forward(x, cache, meta)
            results.append((x - x_in, cache.state_views(0)[0].copy(), layer.shard))
            del layer, cache, plan
        (d2, s2, shard), (d1, s1, _) = results
        bar = {LAYER_BAR} * np.abs(d1).max()
        assert np.abs(d2 - d1).max() <= bar, ("delta", np.abs(d2 - d1).max(), bar)
        heads = slice(shard.head_begin, shard.head_begin + shard.num_heads)
        assert s2.shape[1] == shard.num_heads == 2
        assert np.abs(s2 - s1[:, heads]).max() <= {LAYER_BAR} * np.abs(s1).max(), "states"
        # one file a rank, not a line on stdout: mpirun interleaves the ranks' output below a
        # line (CI once read two finished ranks' lines as one "rank 1 rank 0 ok" and one "ok")
        with open({str(tmp_path)!r} + f"/rank{{rank}}.ok", "w") as f:
            f.write("ok")
    """))
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")
    r = subprocess.run([mpirun, "-np", "2", "--oversubscribe", sys.executable, str(script)], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"mpirun failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
    done = sorted(p.name for p in tmp_path.glob("rank*.ok"))
    assert done == ["rank0.ok", "rank1.ok"], (done, r.stdout, r.stderr)
