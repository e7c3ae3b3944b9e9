"""_ops.py: the GDP ops with Megatron's names, arguments, defaults and return values
(core.ssm.ops.gdp.{metadata,prepare,chunk} and fused_recurrent_gated_delta_rule_update;
../../shared/docs/api-reference/ and gdp-math.md are the contract).

Each op turns its arguments into gdp_tensor views (no copies), allocates its outputs with
upstream's shapes and dtypes (torch.empty on CUDA, numpy.zeros on the CPU backend), and
makes exactly one libgdp call; libgdp checks every argument before it writes anything,
so a failing call raises with nothing modified. The backend follows the tensors: torch
CUDA tensors run on the CUDA backend, on torch's current stream; numpy arrays (and torch
CPU tensors) on the CPU backend.
"""

import ctypes

from . import _lib
from ._lib import (CHUNK_SIZE, DTYPE_FP32, ChunkArgs, GdpValueError, Placement, PrepareArgs, RecurrentArgs,
                   as_int, as_int32, as_scale, call, run_on, shape_of)

__all__ = ["max_gdp_chunk_counts", "build_gdp_chunk_descriptors", "gdp_decode_prepare", "gdp_prefill_prepare",
           "chunk_gated_delta_product_varlen", "fused_recurrent_gated_delta_rule_update"]


# ---- metadata: chunk descriptors (host) -------------------------------------------------


def max_gdp_chunk_counts(max_tokens, max_requests, num_householder):
    """Worst-case chunk counts, used to size the persistent buffers.

    Returns (max_chunks, max_chunks_dp) for the unexpanded and the Householder-expanded
    stream: max_tokens // 64 + max_requests and max_tokens * M // 64 + max_requests.
    """
    max_chunks, max_chunks_dp = ctypes.c_int64(0), ctypes.c_int64(0)
    call("gdp_max_chunk_counts", as_int("max_tokens", max_tokens), as_int("max_requests", max_requests),
         as_int32("num_householder", num_householder), ctypes.byref(max_chunks), ctypes.byref(max_chunks_dp))
    return max_chunks.value, max_chunks_dp.value


def build_gdp_chunk_descriptors(cu_seqlens, prefill_count, num_householder, padded_token_count):
    """Build the padded chunk descriptors for one prefill step (on the host).

    cu_seqlens: prefill_count + 1 cumulative sequence lengths (a list, or any integer
    array; entries past prefill_count + 1 are ignored, as upstream). Returns
    (chunk_indices, chunk_indices_dp, chunk_offsets, num_chunks, num_chunks_dp): the two
    index lists are flattened (sequence, chunk) pairs padded to num_chunks and
    num_chunks_dp rows; chunk_offsets is the prefix sum of unexpanded chunk counts.
    """
    prefill_count = as_int32("prefill_count", prefill_count)
    num_householder = as_int32("num_householder", num_householder)
    padded_token_count = as_int("padded_token_count", padded_token_count)
    if _lib.is_torch_tensor(cu_seqlens):
        cu_seqlens = cu_seqlens.tolist()  # a host list by contract; a device tensor syncs here
    try:
        cu = [as_int32(f"cu_seqlens[{i}]", c) for i, c in enumerate(cu_seqlens)]
    except TypeError:
        raise _lib.GdpTypeError(f"cu_seqlens is a {type(cu_seqlens).__name__}; pass a list of ints",
                                "INVALID_ARGUMENT") from None
    if prefill_count < 0:
        raise GdpValueError(f"build_gdp_chunk_descriptors: prefill_count is {prefill_count}, must be >= 0",
                            "INVALID_ARGUMENT")
    if len(cu) < prefill_count + 1:
        raise GdpValueError(f"build_gdp_chunk_descriptors: cu_seqlens has {len(cu)} entries; prefill_count = "
                            f"{prefill_count} needs prefill_count + 1 = {prefill_count + 1}", "INVALID_ARGUMENT")
    cap, cap_dp = max_gdp_chunk_counts(padded_token_count, prefill_count, num_householder)
    cu_c = (ctypes.c_int32 * (prefill_count + 1))(*cu[:prefill_count + 1])
    indices = (ctypes.c_int32 * (2 * cap))()
    indices_dp = (ctypes.c_int32 * (2 * cap_dp))()
    offsets = (ctypes.c_int32 * (prefill_count + 1))()
    num_chunks, num_chunks_dp = ctypes.c_int64(0), ctypes.c_int64(0)
    call("gdp_build_chunk_descriptors", cu_c, prefill_count, num_householder, padded_token_count, indices,
         indices_dp, offsets, ctypes.byref(num_chunks), ctypes.byref(num_chunks_dp))
    return list(indices), list(indices_dp), list(offsets), num_chunks.value, num_chunks_dp.value


# ---- prepare -----------------------------------------------------------------------------


def _prepare(op, decode, x, ba, A_log, dt_bias, num_householder, num_heads, num_groups, head_dim, state_dim):
    sizes = {"num_householder": num_householder, "num_heads": num_heads, "num_groups": num_groups,
             "head_dim": head_dim, "state_dim": state_dim}
    sizes = {name: as_int32(name, value) for name, value in sizes.items()}
    bad = {name: value for name, value in sizes.items() if value < 1}
    if bad:
        raise GdpValueError(f"{op}: {', '.join(f'{n} = {v}' for n, v in bad.items())}: every size must be >= 1",
                            "INVALID_ARGUMENT")
    M, H, G, P, N = (sizes[n] for n in ("num_householder", "num_heads", "num_groups", "head_dim", "state_dim"))
    width = M * H * P + M * G * N + G * N
    pl = Placement("x", x)
    n, T, _ = shape_of("x", x, 3, f"[n, T, M*H*P + M*G*N + G*N] = [n, T, {width}]")
    a = PrepareArgs()
    a.x = pl.view("x", x)
    a.ba = pl.view("ba", ba)
    a.A_log = pl.view("A_log", A_log)
    a.dt_bias = pl.view("dt_bias", dt_bias)
    a.num_householder, a.num_heads, a.num_groups, a.head_dim, a.state_dim = M, H, G, P, N
    rows_exp = T * M
    rows_tok = T * M if decode else T  # decode interleaves query and g onto the copies
    x_dt, ba_dt = a.x.dtype, a.ba.dtype
    query = pl.empty((n, rows_tok, H, N), x_dt)
    key = pl.empty((n, rows_exp, H, N), x_dt)
    value = pl.empty((n, rows_exp, H, P), x_dt)
    beta = pl.empty((n, rows_exp, H), ba_dt)
    g = pl.empty((n, rows_tok, H), DTYPE_FP32)
    for name, t in (("query", query), ("key", key), ("value", value), ("beta", beta), ("g", g)):
        setattr(a, name, pl.view(name, t, writes=True))
    with run_on(pl) as ctx:
        call(op, ctx.handle, ctypes.byref(a))
    return query, key, value, beta, g


def gdp_decode_prepare(x, ba, A_log, dt_bias, num_householder, num_heads, num_groups, head_dim, state_dim):
    """Split, reshape and gate one decode step's post-conv activations.

    x [n, S, M*H*P + M*G*N + G*N] (rows may be strided), ba [n, S, M*H + H] (rows may be
    strided), A_log [H] float32, dt_bias [H]. Returns (query, key, value, beta, g) shaped
    [n, S*M, H, N], [n, S*M, H, N], [n, S*M, H, P], [n, S*M, H], [n, S*M, H]: query only on
    copy M-1 and g (float32) only on copy 0; query/key/value in x's dtype, beta in ba's.
    """
    return _prepare("gdp_decode_prepare", True, x, ba, A_log, dt_bias, num_householder, num_heads, num_groups,
                    head_dim, state_dim)


def gdp_prefill_prepare(x, ba, A_log, dt_bias, num_householder, num_heads, num_groups, head_dim, state_dim):
    """Split, reshape and gate a prefill step's post-conv activations (n == 1).

    Returns (query, key, value, beta, g) shaped [n, T, H, N], [n, T*M, H, N],
    [n, T*M, H, P], [n, T*M, H] and [n, T, H] (float32): what
    chunk_gated_delta_product_varlen consumes, with the L2 norm left to it.
    """
    return _prepare("gdp_prefill_prepare", False, x, ba, A_log, dt_bias, num_householder, num_heads, num_groups,
                    head_dim, state_dim)


# ---- chunked prefill -----------------------------------------------------------------------


def _ceil_div(a, b):
    return -(-a // b)


def _host_chunk_count(pl, cu, N):
    """sum ceil(L_i / 64) over the sequences of cu_seqlens (no descriptors given). On CUDA
    this reads the device tensor on the host, which synchronizes: the descriptor-free
    path does so anyway (it derives the descriptors), and upstream sizes its states with
    the same count."""
    values = cu.tolist() if _lib.is_torch_tensor(cu) else [int(c) for c in cu]
    return sum(max(0, _ceil_div(values[i + 1] - values[i], CHUNK_SIZE)) for i in range(N))


def chunk_gated_delta_product_varlen(q, k, v, g, beta, num_householder, cu_seqlens, scale=None, initial_state=None,
                                     output_final_state=False, use_qk_l2norm_in_kernel=False, chunk_indices=None,
                                     chunk_indices_dp=None, chunk_offsets=None, state=None, state_indices=None,
                                     return_chunk_states=False, max_seqlen=None):
    """Variable-length chunked Gated Delta Product forward pass.

    q [1, T, H, K]; k [1, T*M, H, K] and v [1, T*M, H, V] (Householder-expanded, q's
    dtype); g [1, T, H] float32 natural-log decays; beta [1, T*M, H]; cu_seqlens [N+1]
    int32 over the token stream; scale defaults to K ** -0.5; initial_state [N, H, K, V]
    or None (zeros); chunk_indices [num_chunks, 2], chunk_indices_dp [num_chunks_dp, 2],
    chunk_offsets [N+1] int32 from build_gdp_chunk_descriptors (all three or none; given,
    the call never synchronizes and is CUDA-graph capturable); state [slots, H, K, V] +
    state_indices [N] int32: cache mode, final states written in place (-1: nothing).
    max_seqlen (gdp's addition, as flash-attn's): the longest sequence's tokens, or None
    for unknown; with descriptors given, the CUDA op takes its one-pass Hopper kernel
    only when this says every sequence fits its estimate (a wrong value costs speed,
    never correctness).

    Returns (o, final_state), or (o, final_state, chunk_states) with return_chunk_states:
    o [1, T, H, V] in q's dtype, rows past cu_seqlens[-1] zero; final_state is the state
    tensor itself in cache mode, dense float32 [N, H, K, V] with output_final_state, else
    None; chunk_states [num_chunks (padded) or NT, H, K, V] in the cache's dtype (else
    initial_state's, else k's): row chunk_offsets[i] + c is sequence i's state after its
    first 64 * c tokens (rows past chunk_offsets[N] untouched).
    """
    M = as_int32("num_householder", num_householder)
    c_scale = as_scale(scale)
    pl = Placement("q", q)
    _, T, H, K = shape_of("q", q, 4, "[1, T, H, K]")
    V = shape_of("v", v, 4, "[1, T*M, H, V]")[3]
    cu = pl.index("cu_seqlens", cu_seqlens)
    N = shape_of("cu_seqlens", cu, 1, "[N+1] (int32)")[0] - 1
    chunk_indices = pl.index("chunk_indices", chunk_indices)
    chunk_indices_dp = pl.index("chunk_indices_dp", chunk_indices_dp)
    chunk_offsets = pl.index("chunk_offsets", chunk_offsets)
    state_indices = pl.index("state_indices", state_indices)

    a = ChunkArgs()
    for name, t in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta), ("cu_seqlens", cu),
                    ("initial_state", initial_state), ("chunk_indices", chunk_indices),
                    ("chunk_indices_dp", chunk_indices_dp), ("chunk_offsets", chunk_offsets),
                    ("state_indices", state_indices)):
        setattr(a, name, pl.view(name, t))
    a.state = pl.view("state", state, writes=True)
    a.num_householder = M
    a.scale = c_scale
    a.output_final_state = int(bool(output_final_state))
    a.use_qk_l2norm_in_kernel = int(bool(use_qk_l2norm_in_kernel))
    a.return_chunk_states = int(bool(return_chunk_states))
    a.max_seqlen = 0 if max_seqlen is None else as_int("max_seqlen", max_seqlen)

    o = pl.empty((1, T, H, V), a.q.dtype)
    a.o = pl.view("o", o, writes=True)
    if state is not None:
        final_state = state  # cache mode: the cache itself, updated in place
    elif output_final_state:
        final_state = pl.empty((max(N, 0), H, K, V), DTYPE_FP32)
        a.final_state = pl.view("final_state", final_state, writes=True)
    else:
        final_state = None
    chunk_states = None
    if return_chunk_states:
        if chunk_indices is not None:
            rows = shape_of("chunk_indices", chunk_indices, 2, "[num_chunks, 2] (int32)")[0]
        else:
            rows = _host_chunk_count(pl, cu, max(N, 0))
        states_dtype = a.state.dtype if state is not None else (
            a.initial_state.dtype if initial_state is not None else a.k.dtype)
        chunk_states = pl.empty((rows, H, K, V), states_dtype)
        a.chunk_states = pl.view("chunk_states", chunk_states, writes=True)

    with run_on(pl) as ctx:
        if pl.cuda:
            _lib.ensure_chunk_workspace(ctx, T, max(N, 0), M, H, K, V)
        call("gdp_chunk_gated_delta_product_varlen", ctx.handle, ctypes.byref(a))
    if return_chunk_states:
        return o, final_state, chunk_states
    return o, final_state


# ---- decode ----------------------------------------------------------------------------------


def fused_recurrent_gated_delta_rule_update(q, k, v, g=None, beta=None, scale=None, initial_state=None,
                                            output_final_state=False, use_qk_l2norm_in_kernel=False,
                                            cu_seqlens=None, state=None, state_indices=None,
                                            intermediate_states=None, steps_per_token=1):
    """Gated delta rule decode over T recurrence steps per request.

    q, k [B, T, H, K]; v [B, T, H, V] (one dtype); g [B, T, H] float32 or None; beta
    [B, T, H] or None; scale defaults to K ** -0.5 (after the optional L2 norm);
    initial_state [B, H, K, V] / output_final_state: dense mode; cu_seqlens must be None;
    state [slots, H, K, V] float32 | bfloat16 + state_indices [B] int32 (None: request b
    uses slot b): read and written in place, -1 rows give o = 0 and touch no slot;
    intermediate_states [slots, S, H, K, V] (cache dtype, S = T / steps_per_token): row
    [slot, s] receives the state after token s; steps_per_token: M for GDP decode.

    Returns (o, final_state): o shaped like v in v's dtype; final_state is the state
    tensor itself in cache mode, dense float32 [B, H, K, V] with output_final_state, else
    None.
    """
    steps = as_int32("steps_per_token", steps_per_token)
    c_scale = as_scale(scale)
    pl = Placement("q", q)
    B, _, H, K = shape_of("q", q, 4, "[B, T, H, K]")
    vshape = shape_of("v", v, 4, "[B, T, H, V]")
    # Converted index arrays (CPU: lists, other integer dtypes) must outlive the call: keep
    # them in locals, the views hold only their addresses.
    cu_seqlens = pl.index("cu_seqlens", cu_seqlens)
    state_indices = pl.index("state_indices", state_indices)
    a = RecurrentArgs()
    for name, t in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta), ("initial_state", initial_state),
                    ("cu_seqlens", cu_seqlens), ("state_indices", state_indices)):
        setattr(a, name, pl.view(name, t))
    a.state = pl.view("state", state, writes=True)
    a.intermediate_states = pl.view("intermediate_states", intermediate_states, writes=True)
    a.scale = c_scale
    a.output_final_state = int(bool(output_final_state))
    a.use_qk_l2norm_in_kernel = int(bool(use_qk_l2norm_in_kernel))
    a.steps_per_token = steps
    o = pl.empty(vshape, a.v.dtype)
    a.o = pl.view("o", o, writes=True)
    if state is not None:
        final_state = state
    elif output_final_state:
        final_state = pl.empty((B, H, K, vshape[3]), DTYPE_FP32)
        a.final_state = pl.view("final_state", final_state, writes=True)
    else:
        final_state = None
    with run_on(pl) as ctx:
        call("gdp_fused_recurrent_gated_delta_rule_update", ctx.handle, ctypes.byref(a))
    return o, final_state
