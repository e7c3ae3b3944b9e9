"""gdp: Python bindings of libgdp, the Gated DeltaProduct (GDP) runtime.

The ops keep the names, arguments, defaults and return values of Megatron's
core.ssm.ops.gdp package, so a serving stack swaps its import and nothing else:

    from gdp import (max_gdp_chunk_counts, build_gdp_chunk_descriptors,
                     gdp_decode_prepare, gdp_prefill_prepare,
                     chunk_gated_delta_product_varlen,
                     fused_recurrent_gated_delta_rule_update)

torch CUDA tensors run on libgdp's CUDA backend, on torch's current stream, without
copies or host synchronization (CUDA-graph capturable with the chunk descriptors given;
reserve the chunk workspace first with reserve_chunk_workspace). numpy arrays (float32,
float16 or ml_dtypes.bfloat16) and torch CPU tensors run on the CPU reference backend.
Bad arguments raise ValueError or TypeError naming the argument; other failures raise
RuntimeError. All carry libgdp's message (gdp_last_error()).

gdp.layer wraps the layer-level C API (checkpoint -> TP-sharded layer, state cache, step
plan, one forward step). libgdp.so is found through $GDP_LIBRARY, next to this package, the
build tree <repo>/build/libgdp.so, or the system loader (docs/python.md).
"""

from ._lib import (GdpError, GdpRuntimeError, GdpTypeError, GdpValueError, backend_available, library_path,
                   reserve_chunk_workspace, version)
from ._ops import (build_gdp_chunk_descriptors, chunk_gated_delta_product_varlen,
                   fused_recurrent_gated_delta_rule_update, gdp_decode_prepare, gdp_prefill_prepare,
                   max_gdp_chunk_counts)

CHUNK_SIZE = 64

__all__ = ["max_gdp_chunk_counts", "build_gdp_chunk_descriptors", "gdp_decode_prepare", "gdp_prefill_prepare",
           "chunk_gated_delta_product_varlen", "fused_recurrent_gated_delta_rule_update",
           "reserve_chunk_workspace", "backend_available", "cuda_available", "library_path", "version",
           "GdpError", "GdpValueError", "GdpTypeError", "GdpRuntimeError", "CHUNK_SIZE", "layer"]

__version__ = "0.1.0"


def cuda_available():
    """True if the loaded libgdp has the CUDA backend (not whether a GPU is present)."""
    from . import _lib

    return backend_available(_lib.BACKEND_CUDA)


def __getattr__(name):
    # gdp.layer is imported on first use: it is the larger half and most callers need
    # only the ops.
    if name == "layer":
        import importlib

        return importlib.import_module(".layer", __name__)
    raise AttributeError(f"module 'gdp' has no attribute {name!r}")
