"""_lib.py: the ctypes binding of libgdp.

What it holds:
  - locating and loading libgdp.so ($GDP_LIBRARY, next to this package, the build tree
    <repo>/build/libgdp.so, then the system loader), once, on first use;
  - ctypes mirrors of the public C structs (include/gdp/gdp.h, ops.h, config.h,
    checkpoint.h, cache.h, plan.h), with their sizes pinned by asserts so that a field
    added on one side without the other fails at import instead of corrupting memory;
  - the prototypes of every C function the package calls;
  - the status -> exception mapping (INVALID_ARGUMENT -> ValueError, or TypeError when the
    message is about a dtype; anything else -> RuntimeError), always with gdp_last_error();
  - tensor views: turning numpy arrays and torch tensors into gdp_tensor structs without
    copying (index arrays on the CPU backend excepted, see _view), and allocating outputs;
  - the cached contexts, one per (backend, device), and the CUDA stream and workspace
    handling around each call.
"""

import ctypes
import ctypes.util
import operator
import os
import sys
import threading
from pathlib import Path

# ---- locating libgdp -------------------------------------------------------------------

_PKG_DIR = Path(__file__).resolve().parent
_LIB_NAMES = ("libgdp.so", "libgdp.so.0", "libgdp.dylib")


def _source_roots():
    """Repository roots this package may belong to: the tree it is imported from (in-tree
    use or `pip install -e ./python`), then the one recorded at `pip install ./python`."""
    roots = []
    tree = _PKG_DIR.parent.parent  # <repo>/python/gdp -> <repo>
    if (tree / "include" / "gdp" / "gdp.h").is_file():
        roots.append(tree)
    try:
        from . import _build_info  # written by setup.py at install time

        recorded = Path(_build_info.SOURCE_ROOT)
        if recorded not in roots:
            roots.append(recorded)
    except ImportError:
        pass
    return roots


def _candidates():
    """(description, path) pairs in the order the loader tries them."""
    out = []
    for name in _LIB_NAMES:
        out.append(("next to the package", _PKG_DIR / name))
    for root in _source_roots():
        for name in _LIB_NAMES:
            out.append(("the build tree", root / "build" / name))
    return out


_lib = None
_lib_path = None
_lib_lock = threading.Lock()


def library_path():
    """The path of the libgdp that is (or will be) loaded."""
    lib()
    return _lib_path


def _load():
    env = os.environ.get("GDP_LIBRARY", "")
    if env:
        # An explicit choice never falls back to another library: a silent fallback would
        # test or serve a different build than the one asked for.
        path = Path(env)
        if path.is_dir():
            found = [path / n for n in _LIB_NAMES if (path / n).is_file()]
            if not found:
                raise OSError(f"GDP_LIBRARY={env} is a directory without libgdp.so; point it at the library "
                              f"file (e.g. <repo>/build/libgdp.so) or the directory holding it")
            path = found[0]
        if not path.is_file():
            raise OSError(f"GDP_LIBRARY={env} does not exist; build libgdp (cmake -B build && cmake --build build) "
                          f"and point GDP_LIBRARY at build/libgdp.so, or unset it")
        return ctypes.CDLL(str(path)), str(path)
    tried = []
    for where, path in _candidates():
        tried.append(f"{path} ({where})")
        if path.is_file():
            return ctypes.CDLL(str(path)), str(path)
    system = ctypes.util.find_library("gdp")
    tried.append("the system library path (ctypes.util.find_library('gdp'))")
    if system:
        return ctypes.CDLL(system), system
    raise OSError("libgdp.so not found. Tried:\n  " + "\n  ".join(tried) +
                  "\nBuild it (cd <repo> && cmake -B build && cmake --build build) or set GDP_LIBRARY to the "
                  "path of libgdp.so.")


def lib():
    """The loaded libgdp (loaded and prototyped on the first call)."""
    global _lib, _lib_path
    if _lib is None:
        with _lib_lock:
            if _lib is None:
                handle, path = _load()
                _declare(handle)
                _lib_path = path
                _lib = handle
    return _lib


# ---- enums (gdp.h, comm.h) ---------------------------------------------------------------

STATUS_SUCCESS = 0
STATUS_INVALID_ARGUMENT = 1
STATUS_INVALID_USAGE = 2
STATUS_UNSUPPORTED = 3
STATUS_NAMES = ("SUCCESS", "INVALID_ARGUMENT", "INVALID_USAGE", "UNSUPPORTED", "CUDA_ERROR", "CUBLAS_ERROR",
                "NCCL_ERROR", "MPI_ERROR", "SYSTEM_ERROR", "INTERNAL_ERROR", "REMOTE_ERROR")

DTYPE_FP32, DTYPE_BF16, DTYPE_FP16, DTYPE_INT32 = 0, 1, 2, 3
DTYPE_NAMES = {DTYPE_FP32: "float32", DTYPE_BF16: "bfloat16", DTYPE_FP16: "float16", DTYPE_INT32: "int32"}
FLOAT_DTYPES = (DTYPE_FP32, DTYPE_BF16, DTYPE_FP16)

BACKEND_CPU, BACKEND_CUDA = 0, 1

MAX_DIMS = 6
CHUNK_SIZE = 64

# ---- struct mirrors ----------------------------------------------------------------------
# C enums are int-sized on every ABI gdp builds for; int32_t fields are c_int32.
_c_enum = ctypes.c_int


class Tensor(ctypes.Structure):
    """gdp_tensor: a strided view (strides in elements, all 0 = contiguous; data NULL = None)."""
    _fields_ = [("data", ctypes.c_void_p), ("dtype", _c_enum), ("ndim", ctypes.c_int32),
                ("shape", ctypes.c_int64 * MAX_DIMS), ("stride", ctypes.c_int64 * MAX_DIMS)]


class PrepareArgs(ctypes.Structure):
    _fields_ = ([(n, Tensor) for n in ("x", "ba", "A_log", "dt_bias")] +
                [(n, ctypes.c_int32) for n in ("num_householder", "num_heads", "num_groups", "head_dim",
                                               "state_dim")] +
                [(n, Tensor) for n in ("query", "key", "value", "beta", "g")])


class ChunkArgs(ctypes.Structure):
    _fields_ = ([(n, Tensor) for n in ("q", "k", "v", "g", "beta")] +
                [("num_householder", ctypes.c_int32), ("cu_seqlens", Tensor), ("scale", ctypes.c_double),
                 ("initial_state", Tensor), ("output_final_state", ctypes.c_int32),
                 ("use_qk_l2norm_in_kernel", ctypes.c_int32)] +
                [(n, Tensor) for n in ("chunk_indices", "chunk_indices_dp", "chunk_offsets", "state",
                                       "state_indices")] +
                [("return_chunk_states", ctypes.c_int32), ("exact_log2e", ctypes.c_int32),
                 ("max_seqlen", ctypes.c_int64)] +
                [(n, Tensor) for n in ("o", "final_state", "chunk_states")])


class RecurrentArgs(ctypes.Structure):
    _fields_ = ([(n, Tensor) for n in ("q", "k", "v", "g", "beta")] +
                [("scale", ctypes.c_double), ("initial_state", Tensor), ("output_final_state", ctypes.c_int32),
                 ("use_qk_l2norm_in_kernel", ctypes.c_int32), ("cu_seqlens", Tensor), ("state", Tensor),
                 ("state_indices", Tensor), ("intermediate_states", Tensor), ("steps_per_token", ctypes.c_int32),
                 ("o", Tensor), ("final_state", Tensor)])


class LayerConfig(ctypes.Structure):
    """gdp_layer_config (config.h)."""
    _fields_ = [("hidden_size", ctypes.c_int64), ("num_heads", ctypes.c_int64), ("num_groups", ctypes.c_int64),
                ("head_dim", ctypes.c_int64), ("state_dim", ctypes.c_int64), ("num_householder", ctypes.c_int32),
                ("conv_width", ctypes.c_int32), ("num_layers", ctypes.c_int32), ("vocab_size", ctypes.c_int64),
                ("norm_eps", ctypes.c_double), ("out_norm_eps", ctypes.c_double)]


class TpShard(ctypes.Structure):
    """gdp_tp_shard (config.h)."""
    _fields_ = [("config", LayerConfig), ("tp_rank", ctypes.c_int32), ("tp_size", ctypes.c_int32),
                ("num_heads", ctypes.c_int64), ("num_groups", ctypes.c_int64), ("head_begin", ctypes.c_int64),
                ("group_begin", ctypes.c_int64), ("d_inner", ctypes.c_int64), ("conv_dim", ctypes.c_int64),
                ("in_proj_dim", ctypes.c_int64), ("num_in_proj_sections", ctypes.c_int32),
                ("num_conv_sections", ctypes.c_int32)]


class LayerWeights(ctypes.Structure):
    """gdp_layer_weights (checkpoint.h)."""
    _fields_ = ([("shard", TpShard), ("layer", ctypes.c_int32), ("dtype", _c_enum)] +
                [(n, Tensor) for n in ("norm_weight", "in_proj", "conv", "A_log", "dt_bias", "out_norm_weight",
                                       "out_proj")])


class CacheConfig(ctypes.Structure):
    """gdp_cache_config (cache.h)."""
    _fields_ = ([(n, ctypes.c_int32) for n in ("num_layers", "n_slots", "num_heads", "state_dim", "head_dim",
                                               "conv_dim", "conv_width")] +
                [("ssm_dtype", _c_enum), ("conv_dtype", _c_enum), ("max_draft_tokens", ctypes.c_int32),
                 ("n_snapshots", ctypes.c_int32)])


class StepBucket(ctypes.Structure):
    _fields_ = [("decode_count", ctypes.c_int32), ("prefill_count", ctypes.c_int32),
                ("token_count", ctypes.c_int32)]


class PrefillRequestC(ctypes.Structure):
    _fields_ = [(n, ctypes.c_int32) for n in ("slot", "n_tokens", "flags", "restore_snapshot", "save_snapshot",
                                              "save_offset")]


class DraftAcceptC(ctypes.Structure):
    _fields_ = [("slot", ctypes.c_int32), ("n_accepted", ctypes.c_int32)]


_P_I32 = ctypes.POINTER(ctypes.c_int32)


class StepDesc(ctypes.Structure):
    """gdp_step_desc (plan.h)."""
    _fields_ = [("decode_count", ctypes.c_int32), ("decode_tokens", ctypes.c_int32), ("decode_slots", _P_I32),
                ("prefill_count", ctypes.c_int32), ("prefill", ctypes.POINTER(PrefillRequestC)),
                ("release_count", ctypes.c_int32), ("release_slots", _P_I32), ("accept_count", ctypes.c_int32),
                ("accept", ctypes.POINTER(DraftAcceptC)), ("bucket", ctypes.c_int32)]


class PlanConfig(ctypes.Structure):
    _fields_ = [("num_householder", ctypes.c_int32), ("n_slots", ctypes.c_int32),
                ("max_decode_tokens", ctypes.c_int32), ("n_buckets", ctypes.c_int32),
                ("buckets", ctypes.POINTER(StepBucket)), ("debug_check", ctypes.c_int32)]


class StepArrays(ctypes.Structure):
    _fields_ = [(n, _P_I32) for n in ("decode_slots", "prefill_slots", "cu_seqlens", "chunk_indices",
                                      "chunk_indices_dp", "chunk_offsets", "seq_idx", "conv_seq_idx",
                                      "conv_seq_start", "save_snapshot", "save_offset", "save_chunk_row",
                                      "save_cu_seqlens")]


class StepMetadataC(ctypes.Structure):
    """gdp_step_metadata (plan.h); only ever read through the pointer the plan owns."""
    _fields_ = ([(n, ctypes.c_int32) for n in ("bucket", "decode_count", "decode_tokens", "prefill_count",
                                               "padded_decode_count", "padded_prefill_count",
                                               "padded_token_count", "prefill_token_offset", "prefill_rows",
                                               "prefill_tokens", "save_count", "chunk_state_saves")] +
                [("num_chunks", ctypes.c_int64), ("num_chunks_dp", ctypes.c_int64),
                 ("num_householder", ctypes.c_int32), ("host", StepArrays), ("device", StepArrays),
                 ("host_buffer", ctypes.c_void_p), ("buffer_bytes", ctypes.c_size_t),
                 ("step", ctypes.POINTER(StepDesc)), ("cache_id", ctypes.c_void_p),
                 ("cache_generation", ctypes.c_uint64)])


# Sizes worked out by hand from the C headers (LP64: 8-byte pointers, int64 and double
# aligned to 8, enums 4 bytes). tests/test_ops_cpu.py also compiles a probe against the
# headers and compares every field offset.
_EXPECTED_SIZES = {Tensor: 112, PrepareArgs: 1032, ChunkArgs: 1720, RecurrentArgs: 1368, LayerConfig: 80,
                   TpShard: 152, LayerWeights: 944, CacheConfig: 44, StepBucket: 12, PrefillRequestC: 24,
                   DraftAcceptC: 8, StepDesc: 72, PlanConfig: 32, StepArrays: 104, StepMetadataC: 320}
if ctypes.sizeof(ctypes.c_void_p) == 8:
    for _cls, _size in _EXPECTED_SIZES.items():
        assert ctypes.sizeof(_cls) == _size, (
            f"gdp: ctypes mirror {_cls.__name__} is {ctypes.sizeof(_cls)} bytes, the C struct is {_size}: "
            f"python/gdp/_lib.py is out of date with include/gdp/")

# ---- prototypes --------------------------------------------------------------------------

_status = ctypes.c_int
_vp = ctypes.c_void_p
_i32, _i64, _sz = ctypes.c_int32, ctypes.c_int64, ctypes.c_size_t
_P_I64 = ctypes.POINTER(ctypes.c_int64)
_P = ctypes.POINTER

_PROTOTYPES = {
    "gdp_get_version": (_status, [_P(ctypes.c_int)]),
    "gdp_status_string": (ctypes.c_char_p, [_c_enum]),
    "gdp_last_error": (ctypes.c_char_p, []),
    "gdp_backend_available": (ctypes.c_int, [_c_enum]),
    "gdp_ctx_init": (_status, [_P(_vp), _c_enum, _i32]),
    "gdp_ctx_free": (_status, [_vp]),
    "gdp_ctx_set_stream": (_status, [_vp, _vp]),
    "gdp_max_chunk_counts": (_status, [_i64, _i64, _i32, _P_I64, _P_I64]),
    "gdp_build_chunk_descriptors": (_status, [_P_I32, _i32, _i32, _i64, _P_I32, _P_I32, _P_I32, _P_I64,
                                              _P_I64]),
    "gdp_decode_prepare": (_status, [_vp, _P(PrepareArgs)]),
    "gdp_prefill_prepare": (_status, [_vp, _P(PrepareArgs)]),
    "gdp_chunk_gated_delta_product_varlen": (_status, [_vp, _P(ChunkArgs)]),
    "gdp_fused_recurrent_gated_delta_rule_update": (_status, [_vp, _P(RecurrentArgs)]),
    "gdp_chunk_get_workspace_size": (_status, [_i64, _i64, _i32, _i32, _i32, _i32, _P(_sz)]),
    "gdp_ctx_reserve_workspace": (_status, [_vp, _sz]),
    # layer stack (layer.py)
    "gdp_layer_config_default": (_status, [_P(LayerConfig)]),
    "gdp_layer_config_validate": (_status, [_P(LayerConfig)]),
    "gdp_tp_shard_init": (_status, [_P(TpShard), _P(LayerConfig), _i32, _i32]),
    "gdp_checkpoint_open": (_status, [_P(_vp), ctypes.c_char_p]),
    "gdp_checkpoint_free": (_status, [_vp]),
    "gdp_checkpoint_get_config": (_status, [_vp, _P(LayerConfig)]),
    "gdp_checkpoint_get_dtype": (_status, [_vp, _P(_c_enum)]),
    "gdp_checkpoint_check": (_status, [_vp, _i32]),
    "gdp_checkpoint_load_layer_shard": (_status, [_vp, _P(LayerWeights), _i32, _i32, _i32]),
    "gdp_layer_weights_free": (_status, [_P(LayerWeights)]),
    "gdp_checkpoint_write_synthetic": (_status, [ctypes.c_char_p, _P(LayerConfig), ctypes.c_uint64, _c_enum]),
    "gdp_layer_init": (_status, [_P(_vp), _vp, _vp, _P(LayerWeights), _c_enum]),
    "gdp_layer_free": (_status, [_vp]),
    "gdp_layer_get_shard": (_status, [_vp, _P(TpShard)]),
    "gdp_layer_forward": (_status, [_vp, _vp, _P(StepMetadataC), _P(Tensor)]),
    "gdp_cache_config_init": (_status, [_P(CacheConfig), _P(TpShard), _i32]),
    "gdp_cache_init": (_status, [_P(_vp), _vp, _P(CacheConfig)]),
    "gdp_cache_free": (_status, [_vp]),
    "gdp_cache_get_config": (_status, [_vp, _P(CacheConfig)]),
    "gdp_cache_apply_step": (_status, [_vp, _P(StepMetadataC)]),
    "gdp_cache_free_slot_count": (_status, [_vp, _P(_i32)]),
    "gdp_cache_slot_in_use": (_status, [_vp, _i32, _P(_i32)]),
    "gdp_cache_snapshot_saved": (_status, [_vp, _i32, _P(_i32)]),
    "gdp_cache_state_views": (_status, [_vp, _i32, _P(Tensor), _P(Tensor)]),
    "gdp_cache_snapshot_views": (_status, [_vp, _i32, _P(Tensor), _P(Tensor)]),
    "gdp_cache_draft_views": (_status, [_vp, _i32, _i32, _P(Tensor), _P(Tensor)]),
    "gdp_plan_init": (_status, [_P(_vp), _vp, _P(PlanConfig)]),
    "gdp_plan_free": (_status, [_vp]),
    "gdp_plan_bcast": (_status, [_vp, _vp, _i32, _P(StepDesc)]),
    "gdp_plan_build": (_status, [_vp, _vp, _vp, _P(_P(StepMetadataC))]),
    "gdp_comm_init": (_status, [_P(_vp), _c_enum, _vp, _c_enum]),
    "gdp_comm_free": (_status, [_vp]),
    "gdp_comm_rank": (_status, [_vp, _P(_i32)]),
    "gdp_comm_size": (_status, [_vp, _P(_i32)]),
}


def _declare(handle):
    for name, (restype, argtypes) in _PROTOTYPES.items():
        fn = getattr(handle, name, None)
        if fn is None:
            continue  # an older libgdp: calling it raises a clear error in call()
        fn.restype = restype
        fn.argtypes = argtypes


# ---- errors -------------------------------------------------------------------------------


class GdpError(Exception):
    """Base of every error libgdp reports; .status is the gdp_status_t name."""

    def __init__(self, message, status="INTERNAL_ERROR"):
        super().__init__(message)
        self.status = status


class GdpValueError(GdpError, ValueError):
    """A bad shape, value or combination of arguments (GDP_STATUS_INVALID_ARGUMENT)."""


class GdpTypeError(GdpError, TypeError):
    """A bad dtype or argument type."""


class GdpRuntimeError(GdpError, RuntimeError):
    """Anything else: unsupported on this backend, CUDA errors, misuse, out of memory."""


def last_error():
    msg = lib().gdp_last_error()
    return msg.decode("utf-8", "replace") if msg else ""


def raise_for_status(status, what):
    """Raises the exception of a failed call `what`, with gdp_last_error()'s text."""
    if status == STATUS_SUCCESS:
        return
    name = STATUS_NAMES[status] if 0 <= status < len(STATUS_NAMES) else f"status {status}"
    detail = last_error() or lib().gdp_status_string(status).decode()
    # libgdp's messages start with the function's name already.
    text = f"{detail if detail.startswith(what) else what + ': ' + detail} [GDP_STATUS_{name}]"
    if status == STATUS_INVALID_ARGUMENT:
        # The C checks phrase dtype problems as "<arg> has dtype X, expected Y".
        if " has dtype " in text or "invalid dtype" in text:
            raise GdpTypeError(text, name)
        raise GdpValueError(text, name)
    raise GdpRuntimeError(text, name)


def call(name, *args):
    """Calls C function `name` and raises on a non-success status."""
    fn = getattr(lib(), name, None)
    if fn is None:
        raise GdpRuntimeError(f"{name} is missing from {_lib_path}: that libgdp is older than this Python "
                              f"package; rebuild it", "UNSUPPORTED")
    raise_for_status(fn(*args), name)


def version():
    """The linked libgdp's version as (major, minor, patch)."""
    v = ctypes.c_int(0)
    call("gdp_get_version", ctypes.byref(v))
    return (v.value // 10000, v.value // 100 % 100, v.value % 100)


def backend_available(backend):
    return bool(lib().gdp_backend_available(backend))


# ---- optional array libraries ------------------------------------------------------------

try:
    import numpy as np
except ImportError:  # torch-only stacks; the CPU backend needs numpy
    np = None


def _torch():
    """torch if it is already imported (a torch tensor cannot exist otherwise)."""
    return sys.modules.get("torch")


def _np_bf16():
    try:
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    except ImportError:
        return None


def _numpy_dtype(gdp_dtype):
    if gdp_dtype == DTYPE_FP32:
        return np.dtype(np.float32)
    if gdp_dtype == DTYPE_FP16:
        return np.dtype(np.float16)
    if gdp_dtype == DTYPE_INT32:
        return np.dtype(np.int32)
    bf16 = _np_bf16()
    if bf16 is None:
        raise GdpTypeError("a bfloat16 numpy output needs ml_dtypes (pip install ml_dtypes)", "INVALID_ARGUMENT")
    return bf16


def _gdp_dtype_of_numpy(dt):
    if dt == np.float32:
        return DTYPE_FP32
    if dt == np.float16:
        return DTYPE_FP16
    if dt == np.int32:
        return DTYPE_INT32
    if dt.name == "bfloat16":  # ml_dtypes.bfloat16
        return DTYPE_BF16
    return None


def _torch_dtype(gdp_dtype):
    torch = _torch()
    return {DTYPE_FP32: torch.float32, DTYPE_BF16: torch.bfloat16, DTYPE_FP16: torch.float16,
            DTYPE_INT32: torch.int32}[gdp_dtype]


def _gdp_dtype_of_torch(dt):
    torch = _torch()
    return {torch.float32: DTYPE_FP32, torch.bfloat16: DTYPE_BF16, torch.float16: DTYPE_FP16,
            torch.int32: DTYPE_INT32}.get(dt)


def is_torch_tensor(obj):
    torch = _torch()
    return torch is not None and isinstance(obj, torch.Tensor)


# ---- where a call runs ---------------------------------------------------------------------


class Placement:
    """Where one op call runs and how its outputs are allocated: the CPU backend with
    numpy arrays (or torch CPU tensors), or the CUDA backend with torch CUDA tensors of
    one device. Fixed by the op's first tensor argument; every other tensor must agree."""

    def __init__(self, anchor_name, anchor):
        self.anchor_name = anchor_name
        if is_torch_tensor(anchor):
            self.torch = True
            self.device = anchor.device
            self.cuda = anchor.device.type == "cuda"
            if not self.cuda and anchor.device.type != "cpu":
                raise GdpTypeError(f"{anchor_name} is on device {anchor.device}; gdp takes torch CUDA tensors "
                                   f"(CUDA backend) or CPU tensors / numpy arrays (CPU backend)",
                                   "INVALID_ARGUMENT")
        elif np is not None and isinstance(anchor, np.ndarray):
            self.torch, self.cuda, self.device = False, False, None
        else:
            raise GdpTypeError(f"{anchor_name} is a {type(anchor).__module__}.{type(anchor).__name__}; pass a "
                               f"torch tensor or a numpy array", "INVALID_ARGUMENT")
        self.backend = BACKEND_CUDA if self.cuda else BACKEND_CPU
        self.device_index = (self.device.index if self.device.index is not None else
                             _torch().cuda.current_device()) if self.cuda else 0

    def where(self):
        return f"{self.device}" if self.torch else "numpy (host memory)"

    # -- outputs --------------------------------------------------------------------------
    def empty(self, shape, gdp_dtype):
        """An output the op writes completely (torch.empty on CUDA: no fill kernel)."""
        if self.torch:
            torch = _torch()
            fn = torch.empty if self.cuda else torch.zeros
            return fn(tuple(shape), dtype=_torch_dtype(gdp_dtype), device=self.device)
        return np.zeros(tuple(shape), dtype=_numpy_dtype(gdp_dtype))

    def dtype_of(self, obj):
        """gdp dtype of a tensor already accepted by view()."""
        if is_torch_tensor(obj):
            return _gdp_dtype_of_torch(obj.dtype)
        return _gdp_dtype_of_numpy(obj.dtype)

    # -- inputs ---------------------------------------------------------------------------
    def index(self, name, obj):
        """An int32 index array input (cu_seqlens, descriptors, slot indices), or None.
        On the CPU backend any integer array or sequence is converted to int32 (these are
        small, read-only host arrays); on CUDA it must already be an int32 CUDA tensor, so
        that the call stays copy-free and capturable."""
        if obj is None:
            return None
        if self.cuda:
            return obj
        if is_torch_tensor(obj):
            torch = _torch()
            if obj.device.type != "cpu":
                return obj  # view() names the device mismatch
            if obj.dtype == torch.int32:
                return obj
            if obj.dtype.is_floating_point or obj.dtype == torch.bool:
                raise GdpTypeError(f"{name} has dtype {obj.dtype}; it must be an integer array (int32)",
                                   "INVALID_ARGUMENT")
            obj = obj.numpy()
        arr = np.asarray(obj)
        if arr.dtype == np.int32:
            return arr
        if arr.size == 0 and arr.dtype == np.float64 and not isinstance(obj, np.ndarray):
            return arr.astype(np.int32)  # an empty Python list
        if arr.dtype.kind not in "iu":
            raise GdpTypeError(f"{name} has dtype {arr.dtype}; it must be an integer array (int32)",
                               "INVALID_ARGUMENT")
        if arr.size and (arr.min() < -2**31 or arr.max() > 2**31 - 1):
            raise GdpValueError(f"{name} holds values outside int32 ([{arr.min()}, {arr.max()}])",
                                "INVALID_ARGUMENT")
        return arr.astype(np.int32)

    def view(self, name, obj, *, writes=False):
        """gdp_tensor view of `obj` (None -> the zeroed "absent" tensor). No copy."""
        t = Tensor()
        if obj is None:
            return t
        if self.torch and not is_torch_tensor(obj) and self.cuda:
            raise GdpTypeError(f"{name} is a {type(obj).__name__}; {self.anchor_name} is a torch tensor on "
                               f"{self.device}, so {name} must be a torch tensor on that device too",
                               "INVALID_ARGUMENT")
        if is_torch_tensor(obj):
            if obj.device != self.device and (self.cuda or obj.device.type != "cpu"):
                raise GdpValueError(f"{name} is on {obj.device} but {self.anchor_name} is on {self.where()}; "
                                    f"every tensor of one call must be on the same device", "INVALID_ARGUMENT")
            dt = _gdp_dtype_of_torch(obj.dtype)
            if dt is None:
                raise GdpTypeError(f"{name} has dtype {obj.dtype}; gdp takes float32, bfloat16, float16 "
                                   f"(or int32 for index arrays)", "INVALID_ARGUMENT")
            shape, strides, ptr = tuple(obj.shape), tuple(obj.stride()), obj.data_ptr()
            if writes and obj.requires_grad:
                raise GdpValueError(f"{name} requires grad; gdp writes it in place: pass a tensor without "
                                    f"requires_grad (or under torch.no_grad)", "INVALID_ARGUMENT")
        elif np is not None and isinstance(obj, np.ndarray):
            dt = _gdp_dtype_of_numpy(obj.dtype)
            if dt is None:
                raise GdpTypeError(f"{name} has numpy dtype {obj.dtype}; gdp takes float32, float16, "
                                   f"ml_dtypes.bfloat16 (or int32 for index arrays); convert it, e.g. "
                                   f"{name}.astype(numpy.float32)", "INVALID_ARGUMENT")
            if writes and not obj.flags.writeable:
                raise GdpValueError(f"{name} is a read-only array; gdp writes it in place", "INVALID_ARGUMENT")
            item = obj.itemsize
            if any(s % item for s in obj.strides):
                raise GdpValueError(f"{name} has byte strides {obj.strides} that are not multiples of its "
                                    f"{item}-byte elements; pass a copy", "INVALID_ARGUMENT")
            shape, strides, ptr = obj.shape, tuple(s // item for s in obj.strides), obj.ctypes.data
        else:
            raise GdpTypeError(f"{name} is a {type(obj).__module__}.{type(obj).__name__}; pass a "
                               f"{'torch tensor' if self.torch else 'numpy array'}", "INVALID_ARGUMENT")
        if len(shape) > MAX_DIMS:
            raise GdpValueError(f"{name} has {len(shape)} dims; gdp tensors have at most {MAX_DIMS}",
                                "INVALID_ARGUMENT")
        t.data = ptr if ptr else None
        if t.data is None and any(d == 0 for d in shape):
            # An empty tensor has no storage, but it is present, not None: give C a non-NULL
            # pointer it never dereferences (zero elements).
            t.data = ctypes.addressof(_EMPTY_STORAGE)
        t.dtype = dt
        t.ndim = len(shape)
        for d, (n, s) in enumerate(zip(shape, strides)):
            t.shape[d] = n
            t.stride[d] = s
        return t


_EMPTY_STORAGE = ctypes.c_int64(0)


# ---- contexts ------------------------------------------------------------------------------


class _Ctx:
    """One gdp_ctx_t, its lock (CUDA: the stream set + enqueue must not interleave across
    threads) and, on CUDA, the chunk workspace bookkeeping."""

    def __init__(self, backend, device):
        handle = ctypes.c_void_p()
        call("gdp_ctx_init", ctypes.byref(handle), backend, device)
        self.handle = handle
        self.backend = backend
        self.device = device
        self.lock = threading.Lock()
        self.workspace_bytes = 0  # what this package reserved (the C side never shrinks it)
        self.captured = False     # some call on this ctx was captured into a CUDA graph

    def free(self):
        if self.handle:
            lib().gdp_ctx_free(self.handle)
            self.handle = None


_ctxs = {}
_ctxs_lock = threading.Lock()


def get_ctx(backend, device=0):
    """The cached context of (backend, device), created on first use."""
    key = (backend, device if backend == BACKEND_CUDA else 0)
    ctx = _ctxs.get(key)
    if ctx is None:
        with _ctxs_lock:
            ctx = _ctxs.get(key)
            if ctx is None:
                if backend == BACKEND_CUDA and not backend_available(BACKEND_CUDA):
                    raise GdpRuntimeError(f"the libgdp at {_lib_path} was built without the CUDA backend, so it "
                                          f"cannot run torch CUDA tensors; rebuild with -DGDP_WITH_CUDA=ON (nvcc "
                                          f"on PATH) or pass CPU tensors / numpy arrays", "UNSUPPORTED")
                ctx = _Ctx(backend, device)
                _ctxs[key] = ctx
    return ctx


def ctx_for(placement):
    return get_ctx(placement.backend, placement.device_index)


class run_on:
    """Context manager around one C call on `placement`. On CUDA it takes the ctx lock (the
    stream is ctx state: setting it and enqueuing must not interleave across threads),
    makes the tensors' device current and points the ctx at torch's current stream, so
    the op is ordered with the surrounding torch work and can be captured in a graph. CPU
    calls take no lock: they are synchronous and share no ctx state, so threads run
    them in parallel (ctypes releases the GIL)."""

    def __init__(self, placement):
        self.placement = placement
        self.ctx = ctx_for(placement)
        self._device_guard = None
        self._locked = False

    def __enter__(self):
        if not self.placement.cuda:
            return self.ctx
        self.ctx.lock.acquire()
        self._locked = True
        try:
            if self.placement.cuda:
                torch = _torch()
                self._device_guard = torch.cuda.device(self.placement.device_index)
                self._device_guard.__enter__()
                stream = torch.cuda.current_stream(self.placement.device_index)
                call("gdp_ctx_set_stream", self.ctx.handle, ctypes.c_void_p(stream.cuda_stream))
                if torch.cuda.is_current_stream_capturing():
                    self.ctx.captured = True
        except BaseException:
            self._exit()
            raise
        return self.ctx

    def _exit(self):
        if self._device_guard is not None:
            self._device_guard.__exit__(None, None, None)
            self._device_guard = None
        if self._locked:
            self._locked = False
            self.ctx.lock.release()

    def __exit__(self, *exc):
        self._exit()
        return False


def ensure_chunk_workspace(ctx, tokens, requests, num_householder, num_heads, key_dim, value_dim):
    """CUDA chunk op: make the ctx workspace hold a call of these sizes (called under the
    ctx lock). Growing frees the old buffer, which CUDA graphs captured earlier may still
    use, so growing is refused during capture and after a capture on this ctx."""
    if ctx.backend != BACKEND_CUDA:
        return
    need = ctypes.c_size_t(0)
    status = lib().gdp_chunk_get_workspace_size(tokens, requests, num_householder, num_heads, key_dim,
                                                value_dim, ctypes.byref(need))
    if status != STATUS_SUCCESS:
        return  # bad sizes: the op itself reports them with the argument names
    if need.value <= ctx.workspace_bytes:
        return
    torch = _torch()
    hint = (f"call gdp.reserve_chunk_workspace(max_tokens, max_requests, num_householder, num_heads, key_dim, "
            f"value_dim) for the largest step before capturing CUDA graphs ({need.value} bytes needed, "
            f"{ctx.workspace_bytes} reserved)")
    if torch.cuda.is_current_stream_capturing():
        raise GdpRuntimeError(f"chunk_gated_delta_product_varlen: the chunk workspace is too small and cannot "
                              f"grow during CUDA graph capture; {hint}", "INVALID_USAGE")
    if ctx.captured:
        raise GdpRuntimeError(f"chunk_gated_delta_product_varlen: the chunk workspace is too small, and growing "
                              f"it would free memory that CUDA graphs captured earlier still use; {hint}, then "
                              f"capture again", "INVALID_USAGE")
    call("gdp_ctx_reserve_workspace", ctx.handle, need.value)
    ctx.workspace_bytes = need.value


def reserve_chunk_workspace(max_tokens, max_requests, num_householder, num_heads, key_dim, value_dim, device=None):
    """Reserves the CUDA chunk workspace of `device` (default: the current CUDA device) for
    calls up to these sizes. Call before capturing CUDA graphs; growing afterwards frees
    memory earlier graphs use, so capture them again. Returns the bytes reserved."""
    import torch  # the CUDA backend is only reachable through torch

    if device is None:
        index = torch.cuda.current_device()
    else:
        dev = device if isinstance(device, torch.device) else torch.device("cuda", device) \
            if isinstance(device, int) else torch.device(device)
        if dev.type != "cuda":
            raise GdpValueError(f"device is {dev}; the chunk workspace is CUDA memory: pass a CUDA device",
                                "INVALID_ARGUMENT")
        index = dev.index if dev.index is not None else torch.cuda.current_device()
    ctx = get_ctx(BACKEND_CUDA, index)
    need = ctypes.c_size_t(0)
    call("gdp_chunk_get_workspace_size", as_int("max_tokens", max_tokens), as_int("max_requests", max_requests),
         as_int("num_householder", num_householder), as_int("num_heads", num_heads), as_int("key_dim", key_dim),
         as_int("value_dim", value_dim), ctypes.byref(need))
    with ctx.lock:
        if need.value > ctx.workspace_bytes:
            with torch.cuda.device(index):
                call("gdp_ctx_reserve_workspace", ctx.handle, need.value)
            ctx.workspace_bytes = need.value
            ctx.captured = False  # the caller recaptures after growing, as documented
    return ctx.workspace_bytes


# ---- small argument helpers ----------------------------------------------------------------


def as_int(name, value):
    """An integer argument (bool and float refused, numpy/torch integer scalars accepted)."""
    if isinstance(value, bool):
        raise GdpTypeError(f"{name} is a bool; pass an int", "INVALID_ARGUMENT")
    try:
        return operator.index(value)
    except TypeError:
        raise GdpTypeError(f"{name} is {value!r} ({type(value).__name__}); pass an int",
                           "INVALID_ARGUMENT") from None


def as_int32(name, value):
    v = as_int(name, value)
    if not -2**31 <= v < 2**31:
        raise GdpValueError(f"{name} = {v} does not fit int32", "INVALID_ARGUMENT")
    return v


def as_scale(scale):
    """Megatron's scale: None selects K^-0.5 (C: 0). An explicit 0 has no C spelling."""
    if scale is None:
        return 0.0
    try:
        s = float(scale)
    except (TypeError, ValueError):
        raise GdpTypeError(f"scale is {scale!r}; pass a float or None (K ** -0.5)", "INVALID_ARGUMENT") from None
    if s == 0.0:
        raise GdpValueError("scale is 0, which gdp reserves for 'the default K ** -0.5'; pass None for the "
                            "default (a zero scale would only zero the output)", "INVALID_ARGUMENT")
    return s


def shape_of(name, obj, ndim, expected):
    """The shape of a tensor argument that output shapes are derived from, checked for its
    number of dims before anything is allocated (the C op checks everything else)."""
    if obj is None:
        raise GdpValueError(f"{name} is None; pass a tensor shaped {expected}", "INVALID_ARGUMENT")
    shape = tuple(int(d) for d in getattr(obj, "shape", ()))
    if not hasattr(obj, "shape") or len(shape) != ndim:
        raise GdpValueError(f"{name} has shape {list(shape) if hasattr(obj, 'shape') else type(obj).__name__}, "
                            f"expected {expected}", "INVALID_ARGUMENT")
    return shape
