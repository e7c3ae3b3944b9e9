"""layer.py: the layer-level entry of gdp for stacks that keep their own scheduler: a
TP-sharded GDP mixer layer built from a checkpoint, the per-rank state cache, the step
plan, and one forward step on given hidden states (include/gdp/layer.h, cache.h, plan.h,
checkpoint.h, config.h, comm.h; docs/layer.md walks through a step).

    ckpt  = Checkpoint("model.safetensors")
    layer = Layer(ckpt, layer=0, tp_rank=rank, tp_size=tp, comm=comm)   # comm=None: tp = 1
    cache = StateCache(layer.shard, n_slots=64)
    plan  = StepPlan(layer.shard.config.num_householder, n_slots=64,
                     buckets=[(decode_count, prefill_count, token_count), ...])
    # every step, on every rank of the TP group:
    meta = plan.step(cache, decode_slots=[...], prefill=[PrefillRequest(n_tokens=100, new=True)],
                     comm=comm)                       # broadcast from root, build, apply
    x = ...                                           # [meta.padded_token_count, D] float32
    layer.forward(x, cache, meta)                     # in place: x += mixer(x)

Rows of x follow plan.h's token layout: decode request r's token s at row r*S + s, then
the prefill block from meta.prefill_token_offset (request i's tokens at
prefill_token_offset + meta.cu_seqlens[i] + t), then padding rows, which come out unchanged.

The CPU backend takes float32 numpy arrays (or torch CPU tensors); the CUDA backend
(device="cuda" or "cuda:N") takes torch CUDA tensors on the layer's device, and runs on the
current torch stream of that device.
"""

import atexit
import ctypes
import ctypes.util
import sys
from dataclasses import dataclass
from os import fspath
from typing import Optional

from . import _lib
from ._lib import (BACKEND_CPU, BACKEND_CUDA, DTYPE_BF16, DTYPE_FP16, DTYPE_FP32, GdpTypeError, GdpValueError,
                   CacheConfig, DraftAcceptC, LayerConfig, LayerWeights, PlanConfig, PrefillRequestC, StepBucket,
                   StepDesc, StepMetadataC, Tensor, TpShard, as_int32, call)

__all__ = ["Checkpoint", "Comm", "Layer", "StateCache", "StepPlan", "StepMetadata", "PrefillRequest",
           "layer_config", "write_synthetic_checkpoint", "SLOT_AUTO", "TP_ALLREDUCE", "TP_SEQUENCE_PARALLEL"]

SLOT_AUTO = -2             # GDP_SLOT_AUTO: the lowest free slot, the same on every rank
PREFILL_NEW, PREFILL_RESTORE, PREFILL_SAVE = 1, 2, 4
TP_ALLREDUCE, TP_SEQUENCE_PARALLEL = 0, 1
COMM_MPI, COMM_NCCL = 0, 1

_DTYPES = {"float32": DTYPE_FP32, "fp32": DTYPE_FP32, "bfloat16": DTYPE_BF16, "bf16": DTYPE_BF16,
           "float16": DTYPE_FP16, "fp16": DTYPE_FP16}


def _dtype(name, value):
    if isinstance(value, str) and value.lower() in _DTYPES:
        return _DTYPES[value.lower()]
    torch = _lib._torch()
    if torch is not None and isinstance(value, torch.dtype) and _lib._gdp_dtype_of_torch(value) in _lib.FLOAT_DTYPES:
        return _lib._gdp_dtype_of_torch(value)
    if _lib.np is not None:
        try:
            dt = _lib._gdp_dtype_of_numpy(_lib.np.dtype(value))
            if dt in _lib.FLOAT_DTYPES:
                return dt
        except TypeError:
            pass
    raise GdpTypeError(f"{name} is {value!r}; pass 'float32', 'bfloat16' or 'float16'", "INVALID_ARGUMENT")


def _device(device):
    """(backend, device index) of 'cpu', 'cuda', 'cuda:N', an int (CUDA ordinal) or a torch.device."""
    if device is None or device == "cpu":
        return BACKEND_CPU, 0
    if isinstance(device, int) and not isinstance(device, bool):
        return BACKEND_CUDA, device
    text = str(device)
    if text == "cuda" or text.startswith("cuda:"):
        index = int(text.split(":")[1]) if ":" in text else None
        if index is None:
            import torch

            index = torch.cuda.current_device()
        return BACKEND_CUDA, index
    raise GdpValueError(f"device is {device!r}; pass 'cpu', 'cuda', 'cuda:N' or a torch.device",
                        "INVALID_ARGUMENT")


def _tp_mode(mode):
    if mode in (TP_ALLREDUCE, "allreduce", "all-reduce"):
        return TP_ALLREDUCE
    if mode in (TP_SEQUENCE_PARALLEL, "sp", "sequence-parallel", "sequence_parallel"):
        return TP_SEQUENCE_PARALLEL
    raise GdpValueError(f"mode is {mode!r}; pass 'allreduce' or 'sp' (sequence parallel)", "INVALID_ARGUMENT")


class _Handle:
    """An owned C handle freed once, by close() or when garbage-collected."""

    _free_fn = None

    def __init__(self):
        self._handle = ctypes.c_void_p()

    @property
    def handle(self):
        if not self._handle:
            raise _lib.GdpRuntimeError(f"this {type(self).__name__} is closed", "INVALID_USAGE")
        return self._handle

    def close(self):
        if getattr(self, "_handle", None):
            getattr(_lib.lib(), self._free_fn)(self._handle)
            self._handle = ctypes.c_void_p()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter teardown: the library may be gone already
            pass


# ---- config and checkpoints ------------------------------------------------------------


def layer_config(**fields):
    """A gdp_layer_config: Megatron's defaults (G = 8, P = 64, N = 128, M = 3, W = 4, one
    layer, eps 1e-5) with `fields` set (hidden_size and num_heads have no default).
    Validated: ValueError names the field."""
    cfg = LayerConfig()
    call("gdp_layer_config_default", ctypes.byref(cfg))
    names = {f for f, _ in LayerConfig._fields_}
    for key, value in fields.items():
        if key not in names:
            raise GdpTypeError(f"layer_config: unknown field {key!r}; the fields are {sorted(names)}",
                               "INVALID_ARGUMENT")
        setattr(cfg, key, float(value) if key.endswith("eps") else _lib.as_int(key, value))
    call("gdp_layer_config_validate", ctypes.byref(cfg))
    return cfg


def config_dict(cfg):
    """A gdp_layer_config (or gdp_tp_shard) as a plain dict."""
    out = {}
    for name, _ in type(cfg)._fields_:
        value = getattr(cfg, name)
        out[name] = config_dict(value) if isinstance(value, ctypes.Structure) else value
    return out


def write_synthetic_checkpoint(path, config, seed=0, dtype="float32"):
    """Writes a seeded synthetic checkpoint with Megatron's initial distributions
    (gdp_checkpoint_write_synthetic); `config` is a gdp_layer_config (layer_config())."""
    if not isinstance(config, LayerConfig):
        raise GdpTypeError("config must come from gdp.layer.layer_config(...)", "INVALID_ARGUMENT")
    call("gdp_checkpoint_write_synthetic", fspath(path).encode(), ctypes.byref(config),
         ctypes.c_uint64(_lib.as_int("seed", seed)), _dtype("dtype", dtype))


class Checkpoint(_Handle):
    """An opened GDP checkpoint (one safetensors file holding every layer at TP = 1)."""

    _free_fn = "gdp_checkpoint_free"

    def __init__(self, path):
        super().__init__()
        self.path = fspath(path)
        call("gdp_checkpoint_open", ctypes.byref(self._handle), self.path.encode())

    @property
    def config(self):
        cfg = LayerConfig()
        call("gdp_checkpoint_get_config", self.handle, ctypes.byref(cfg))
        return cfg

    @property
    def dtype(self):
        dt = ctypes.c_int(0)
        call("gdp_checkpoint_get_dtype", self.handle, ctypes.byref(dt))
        return _lib.DTYPE_NAMES[dt.value]

    def check(self, tp_size):
        """Validates every layer for tensor-parallel size tp_size (no tensor data read)."""
        call("gdp_checkpoint_check", self.handle, as_int32("tp_size", tp_size))


# ---- MPI and comms -----------------------------------------------------------------------

_mpi_lib = None
_mpi_we_initialized = False
_close_registered = False
_live_comms = []


def _libmpi():
    """The MPI library libgdp is linked against (found in this process's mappings, so it
    is the very same library), else the system's libmpi."""
    global _mpi_lib
    if _mpi_lib is None:
        _lib.lib()
        path = None
        try:
            with open("/proc/self/maps") as maps:
                for line in maps:
                    if "/libmpi.so" in line:
                        path = line.split()[-1]
                        break
        except OSError:
            pass
        path = path or ctypes.util.find_library("mpi")
        if path is None:
            raise _lib.GdpRuntimeError("cannot find the MPI library libgdp uses", "MPI_ERROR")
        _mpi_lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    return _mpi_lib


def _ensure_mpi():
    """MPI_Init unless MPI is initialized (by mpi4py or an earlier call); finalized at exit
    if this module initialized it."""
    global _mpi_we_initialized
    mpi = _libmpi()
    flag = ctypes.c_int(0)
    mpi.MPI_Initialized(ctypes.byref(flag))
    if flag.value:
        return
    rc = mpi.MPI_Init(None, None)
    if rc != 0:
        raise _lib.GdpRuntimeError(f"MPI_Init failed with error code {rc}", "MPI_ERROR")
    _mpi_we_initialized = True
    atexit.register(_finalize_mpi)


def _close_live_comms():
    # Registered after whatever initialized MPI (this module or mpi4py), so atexit's LIFO
    # order frees the comms (collectively) before MPI_Finalize runs.
    for comm in reversed(list(_live_comms)):
        comm.close()


def _finalize_mpi():
    _close_live_comms()
    flag = ctypes.c_int(0)
    _mpi_lib.MPI_Finalized(ctypes.byref(flag))
    if not flag.value:
        _mpi_lib.MPI_Finalize()


class Comm(_Handle):
    """The tensor-parallel group (gdp_comm_t) over MPI_COMM_WORLD or an mpi4py communicator.

    backend: 'mpi' (host-staged; the CPU backend) or 'nccl' (device buffers). Initializes
    MPI if nothing has (and finalizes it at exit); collective over the group's ranks."""

    _free_fn = "gdp_comm_free"

    def __init__(self, backend="mpi", mpi_comm=None, device_buffers=None):
        super().__init__()
        backends = {"mpi": COMM_MPI, "nccl": COMM_NCCL}
        if backend not in backends:
            raise GdpValueError(f"backend is {backend!r}; pass 'mpi' or 'nccl'", "INVALID_ARGUMENT")
        if device_buffers is None:
            device_buffers = backend == "nccl"
        address = None
        if mpi_comm is not None:
            MPI = sys.modules.get("mpi4py.MPI")
            if MPI is None or not isinstance(mpi_comm, MPI.Comm):
                raise GdpTypeError("mpi_comm must be an mpi4py communicator (or None for MPI_COMM_WORLD)",
                                   "INVALID_ARGUMENT")
            address = MPI._addressof(mpi_comm)  # the address of its MPI_Comm handle
        _ensure_mpi()
        call("gdp_comm_init", ctypes.byref(self._handle), backends[backend], ctypes.c_void_p(address),
             1 if device_buffers else 0)
        global _close_registered
        if not _close_registered:
            atexit.register(_close_live_comms)
            _close_registered = True
        _live_comms.append(self)

    @property
    def rank(self):
        r = ctypes.c_int32(0)
        call("gdp_comm_rank", self.handle, ctypes.byref(r))
        return r.value

    @property
    def size(self):
        s = ctypes.c_int32(0)
        call("gdp_comm_size", self.handle, ctypes.byref(s))
        return s.value

    def close(self):
        super().close()
        if self in _live_comms:
            _live_comms.remove(self)


def _comm_handle(comm):
    if comm is None:
        return None
    if not isinstance(comm, Comm):
        raise GdpTypeError(f"comm is a {type(comm).__name__}; pass a gdp.layer.Comm or None (tp = 1)",
                           "INVALID_ARGUMENT")
    return comm.handle


# ---- layer ---------------------------------------------------------------------------------


class Layer(_Handle):
    """Rank tp_rank's shard of layer `layer` of a checkpoint (gdp_layer_init): weights copied
    into buffers the layer owns, in the backend's compute dtype (float32 on the CPU)."""

    _free_fn = "gdp_layer_free"

    def __init__(self, checkpoint, layer, tp_rank=0, tp_size=1, comm=None, mode="allreduce", device="cpu"):
        super().__init__()
        backend, index = _device(device)
        self._ctx = _lib.get_ctx(backend, index)
        own = not isinstance(checkpoint, Checkpoint)
        ckpt = Checkpoint(checkpoint) if own else checkpoint
        weights = LayerWeights()
        try:
            call("gdp_checkpoint_load_layer_shard", ckpt.handle, ctypes.byref(weights), as_int32("layer", layer),
                 as_int32("tp_rank", tp_rank), as_int32("tp_size", tp_size))
            try:
                call("gdp_layer_init", ctypes.byref(self._handle), self._ctx.handle, _comm_handle(comm),
                     ctypes.byref(weights), _tp_mode(mode))
            finally:
                _lib.lib().gdp_layer_weights_free(ctypes.byref(weights))
        finally:
            if own:
                ckpt.close()
        self._comm = comm  # keeps the comm alive as long as the layer
        self.index = layer

    @property
    def shard(self):
        """The gdp_tp_shard it runs: .config (gdp_layer_config), .tp_rank, .tp_size, .num_heads
        (H_t), .num_groups, .d_inner, .conv_dim, .in_proj_dim."""
        s = TpShard()
        call("gdp_layer_get_shard", self.handle, ctypes.byref(s))
        return s

    def forward(self, x, cache, meta):
        """Runs the layer on one step in place on x (x += mixer(x)); returns x.

        x: float32 [meta.padded_token_count, D] (sequence parallel: this rank's
        padded_token_count / tp rows), contiguous; cache: the StateCache the step was applied
        to; meta: that step's StepMetadata (plan.step()). Collective over the layer's comm."""
        if not isinstance(cache, StateCache):
            raise GdpTypeError(f"cache is a {type(cache).__name__}; pass a gdp.layer.StateCache",
                               "INVALID_ARGUMENT")
        if not isinstance(meta, StepMetadata):
            raise GdpTypeError(f"meta is a {type(meta).__name__}; pass the StepMetadata of plan.step()",
                               "INVALID_ARGUMENT")
        pl = _lib.Placement("x", x)
        if pl.backend != self._ctx.backend:
            raise GdpValueError(f"x is on {pl.where()} but the layer runs on the "
                                f"{'CUDA' if self._ctx.backend == BACKEND_CUDA else 'CPU'} backend",
                                "INVALID_ARGUMENT")
        tx = pl.view("x", x, writes=True)
        with _lib.run_on(pl) as ctx:
            if ctx is not self._ctx:
                raise GdpValueError(f"x is on {pl.where()}, another device than the layer's", "INVALID_ARGUMENT")
            call("gdp_layer_forward", self.handle, cache.handle, meta._pointer(), ctypes.byref(tx))
        return x


# ---- state cache ---------------------------------------------------------------------------


class StateCache(_Handle):
    """One rank's state cache of a layer stack (gdp_cache_init): ssm and conv states of
    n_slots requests for every layer, optional draft-token states and prefix snapshots."""

    _free_fn = "gdp_cache_free"

    def __init__(self, shard, n_slots, ssm_dtype="float32", conv_dtype="float32", max_draft_tokens=0,
                 n_snapshots=0, device="cpu"):
        super().__init__()
        if not isinstance(shard, TpShard):
            raise GdpTypeError("shard must be a gdp_tp_shard (Layer.shard)", "INVALID_ARGUMENT")
        backend, index = _device(device)
        self._ctx = _lib.get_ctx(backend, index)
        cfg = CacheConfig()
        call("gdp_cache_config_init", ctypes.byref(cfg), ctypes.byref(shard), as_int32("n_slots", n_slots))
        cfg.ssm_dtype = _dtype("ssm_dtype", ssm_dtype)
        cfg.conv_dtype = _dtype("conv_dtype", conv_dtype)
        cfg.max_draft_tokens = as_int32("max_draft_tokens", max_draft_tokens)
        cfg.n_snapshots = as_int32("n_snapshots", n_snapshots)
        call("gdp_cache_init", ctypes.byref(self._handle), self._ctx.handle, ctypes.byref(cfg))

    @property
    def config(self):
        cfg = CacheConfig()
        call("gdp_cache_get_config", self.handle, ctypes.byref(cfg))
        return cfg

    def free_slot_count(self):
        n = ctypes.c_int32(0)
        call("gdp_cache_free_slot_count", self.handle, ctypes.byref(n))
        return n.value

    def slot_in_use(self, slot):
        v = ctypes.c_int32(0)
        call("gdp_cache_slot_in_use", self.handle, as_int32("slot", slot), ctypes.byref(v))
        return bool(v.value)

    def snapshot_saved(self, snapshot):
        v = ctypes.c_int32(0)
        call("gdp_cache_snapshot_saved", self.handle, as_int32("snapshot", snapshot), ctypes.byref(v))
        return bool(v.value)

    def _views(self, fn, *args):
        ssm, conv = Tensor(), Tensor()
        call(fn, self.handle, *args, ctypes.byref(ssm), ctypes.byref(conv))
        if self._ctx.backend != BACKEND_CPU:
            raise _lib.GdpRuntimeError("cache views as arrays are available on the CPU backend only (the CUDA "
                                       "buffers are device memory libgdp owns)", "UNSUPPORTED")
        return _host_array(ssm, self), _host_array(conv, self)

    def state_views(self, layer):
        """numpy views (no copy, valid while the cache lives) of layer `layer`'s ssm state
        [n_slots, H_t, K, V] and conv state [n_slots, conv_dim_t, W]. CPU backend only."""
        return self._views("gdp_cache_state_views", as_int32("layer", layer))

    def snapshot_views(self, layer):
        """The prefix snapshots of the layer: ssm [n_snapshots, H_t, K, V], conv [.., conv_dim_t, W]."""
        return self._views("gdp_cache_snapshot_views", as_int32("layer", layer))

    def draft_views(self, layer, S):
        """Draft-token states for steps of S tokens: ssm [n_slots, S, H_t, K, V], conv [.., S, conv_dim_t, W]."""
        return self._views("gdp_cache_draft_views", as_int32("layer", layer), as_int32("S", S))


def _host_array(t, owner):
    """A numpy array over a gdp_tensor in host memory that keeps `owner` alive."""
    np = _lib.np
    shape = tuple(t.shape[d] for d in range(t.ndim))
    dtype = _lib._numpy_dtype(t.dtype) if t.dtype != DTYPE_BF16 or _lib._np_bf16() is not None \
        else np.dtype(np.uint16)  # bf16 without ml_dtypes: the raw bits
    count = 1
    for d in shape:
        count *= d
    buf = (ctypes.c_char * (count * dtype.itemsize)).from_address(t.data)
    buf._gdp_owner = owner  # the array's base is buf, so the cache outlives the view
    return np.frombuffer(buf, dtype=dtype).reshape(shape)


# ---- step plan -----------------------------------------------------------------------------


@dataclass
class PrefillRequest:
    """One prefill slice of a request (gdp_prefill_request)."""
    n_tokens: int
    slot: int = SLOT_AUTO              # SLOT_AUTO only with new=True
    new: bool = False                  # the request's first slice: claim the slot (zeroed or restored)
    restore_snapshot: Optional[int] = None  # with new: start from this prefix snapshot
    save_snapshot: Optional[int] = None     # save the state after save_offset tokens into this snapshot
    save_offset: Optional[int] = None       # a multiple of 64 in [0, n_tokens], or n_tokens (default)

    def _c(self, i):
        flags = PREFILL_NEW if self.new else 0
        if self.restore_snapshot is not None:
            flags |= PREFILL_RESTORE
        if self.save_snapshot is not None:
            flags |= PREFILL_SAVE
        n = as_int32(f"prefill[{i}].n_tokens", self.n_tokens)
        return PrefillRequestC(
            as_int32(f"prefill[{i}].slot", self.slot), n, flags,
            as_int32(f"prefill[{i}].restore_snapshot", self.restore_snapshot or 0),
            as_int32(f"prefill[{i}].save_snapshot", self.save_snapshot or 0),
            as_int32(f"prefill[{i}].save_offset", n if self.save_offset is None else self.save_offset))


def _i32_array(name, values):
    values = [as_int32(f"{name}[{i}]", v) for i, v in enumerate(values)]
    return (ctypes.c_int32 * max(1, len(values)))(*values), len(values)


class StepPlan(_Handle):
    """The step plan (gdp_plan_t): turns one scheduler step into the padded per-step
    metadata every rank builds identically.

    buckets: [(decode_count, prefill_count, token_count), ...], the padded step shapes
    (what CUDA graphs are captured for); max_decode_tokens: the largest S = 1 + draft
    tokens a step may use; debug_check: compare a hash of the metadata across ranks."""

    _free_fn = "gdp_plan_free"

    def __init__(self, num_householder, n_slots, buckets, max_decode_tokens=1, debug_check=False, device="cpu"):
        super().__init__()
        backend, index = _device(device)
        self._ctx = _lib.get_ctx(backend, index)
        try:
            rows = [tuple(b) for b in buckets]
        except TypeError:
            raise GdpTypeError("buckets must be a list of (decode_count, prefill_count, token_count)",
                               "INVALID_ARGUMENT") from None
        if not rows or any(len(r) != 3 for r in rows):
            raise GdpValueError(f"buckets is {buckets!r}; pass at least one (decode_count, prefill_count, "
                                f"token_count)", "INVALID_ARGUMENT")
        arr = (StepBucket * len(rows))(*[StepBucket(*(as_int32(f"buckets[{i}]", v) for v in r))
                                         for i, r in enumerate(rows)])
        cfg = PlanConfig(as_int32("num_householder", num_householder), as_int32("n_slots", n_slots),
                         as_int32("max_decode_tokens", max_decode_tokens), len(rows), arr, int(bool(debug_check)))
        call("gdp_plan_init", ctypes.byref(self._handle), self._ctx.handle, ctypes.byref(cfg))
        self.buckets = rows
        self._generation = 0

    def step(self, cache, decode_slots=(), decode_tokens=1, prefill=(), release_slots=(), accept=(), bucket=None,
             comm=None, root=0, apply=True):
        """One step on every rank: broadcast the root's step (other ranks' step arguments
        are ignored), build its metadata against `cache`, and (apply=True) apply its slot
        operations to the cache. Returns the StepMetadata, valid until the next step.

        decode_slots: slots of the decode requests (S = decode_tokens tokens each);
        prefill: PrefillRequest slices; release_slots: slots freed before the step; accept:
        (slot, n_accepted) draft verifications of the previous step; bucket: an index into
        buckets, or None for the smallest that fits."""
        if not isinstance(cache, StateCache):
            raise GdpTypeError(f"cache is a {type(cache).__name__}; pass a gdp.layer.StateCache",
                               "INVALID_ARGUMENT")
        ds, n_decode = _i32_array("decode_slots", decode_slots)
        rs, n_release = _i32_array("release_slots", release_slots)
        prefill = list(prefill)
        for i, p in enumerate(prefill):
            if not isinstance(p, PrefillRequest):
                raise GdpTypeError(f"prefill[{i}] is a {type(p).__name__}; pass gdp.layer.PrefillRequest",
                                   "INVALID_ARGUMENT")
        pr = (PrefillRequestC * max(1, len(prefill)))(*[p._c(i) for i, p in enumerate(prefill)])
        accepts = []
        for i, a in enumerate(accept):
            try:
                slot, n = a
            except (TypeError, ValueError):
                raise GdpTypeError(f"accept[{i}] is {a!r}; pass (slot, n_accepted)", "INVALID_ARGUMENT") from None
            accepts.append(DraftAcceptC(as_int32(f"accept[{i}].slot", slot),
                                        as_int32(f"accept[{i}].n_accepted", n)))
        ac = (DraftAcceptC * max(1, len(accepts)))(*accepts)
        desc = StepDesc(n_decode, as_int32("decode_tokens", decode_tokens), ds, len(prefill), pr, n_release, rs,
                        len(accepts), ac, -1 if bucket is None else as_int32("bucket", bucket))
        comm_h = _comm_handle(comm)
        call("gdp_plan_bcast", self.handle, comm_h, as_int32("root", root), ctypes.byref(desc))
        meta = ctypes.POINTER(StepMetadataC)()
        call("gdp_plan_build", self.handle, cache.handle, comm_h, ctypes.byref(meta))
        self._generation += 1
        step = StepMetadata(self, meta, self._generation)
        if apply:
            call("gdp_cache_apply_step", cache.handle, meta)
        return step


class StepMetadata:
    """One built step (gdp_step_metadata, owned by the plan): padded sizes and the host
    arrays, valid until the plan builds the next step."""

    def __init__(self, plan, pointer, generation):
        self._plan = plan
        self._ptr = pointer
        self._generation = generation

    def _pointer(self):
        if self._generation != self._plan._generation:
            raise GdpValueError("this StepMetadata is stale: its plan has built a newer step since; pass the "
                                "metadata of the step being run", "INVALID_ARGUMENT")
        return self._ptr

    def _c(self):
        return self._pointer().contents

    def __getattr__(self, name):
        # The scalar fields of gdp_step_metadata: bucket, decode_count, decode_tokens,
        # prefill_count, padded_decode_count, padded_prefill_count, padded_token_count,
        # prefill_token_offset, prefill_rows, prefill_tokens, num_chunks, num_chunks_dp, ...
        if name.startswith("_") or name not in {f for f, t in StepMetadataC._fields_ if t in (
                ctypes.c_int32, ctypes.c_int64)}:
            raise AttributeError(name)
        return getattr(self._c(), name)

    def _host(self, field, n):
        p = getattr(self._c().host, field)
        return [p[i] for i in range(n)]

    @property
    def decode_slots(self):
        """[padded_decode_count] slots, -1 for padding requests."""
        return self._host("decode_slots", self._c().padded_decode_count)

    @property
    def prefill_slots(self):
        """[padded_prefill_count] slots (SLOT_AUTO resolved), -1 for padding requests."""
        return self._host("prefill_slots", self._c().padded_prefill_count)

    @property
    def cu_seqlens(self):
        """[padded_prefill_count + 1] token offsets inside the prefill block."""
        return self._host("cu_seqlens", self._c().padded_prefill_count + 1)
