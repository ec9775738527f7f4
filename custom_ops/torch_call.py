"""``torch_call``: run a Torch package (AOTInductor ``.pt2`` or TorchScript) inside a TF graph.

Imports TensorFlow only. The package is usually a ``tf.saved_model.Asset``, so a SavedModel
that calls it carries the file and loads anywhere ``custom_ops`` is importable: no Python
engine code and no torch Python package are needed at load time (libtorch comes with the op
library). Packages are made by ``xgr_export.torch_package`` and carry their calling contract;
the op checks every call against it and raises ``InvalidArgumentError`` (bad dtype, shape,
count), ``NotFoundError`` (missing file) or ``FailedPreconditionError`` (a CUDA package on a
host without CUDA) instead of crashing the process.

Inputs stay on the TF host; the op moves them to the package's device and the results back.
A package whose contract buckets its shapes runs padded to its bucket, and on CUDA as one
replayed graph per bucket (``package_stats`` counts the replays).
"""

from __future__ import annotations

import ctypes
import functools
import json
from typing import Sequence

import tensorflow as tf

from custom_ops._loader import library_path, load_library
from xgr_common.errors import InvalidInputError, require

_DTYPES = (tf.float32, tf.float64, tf.float16, tf.bfloat16, tf.int8, tf.uint8, tf.int32,
           tf.int64, tf.bool)


@functools.lru_cache(maxsize=256)
def _attrs(output_dtypes: tuple, output_shapes: tuple | None) -> tuple[list, list]:
    """Checked ``Tout`` and ``output_shapes`` attrs (cached: eager calls repeat them)."""
    require(len(output_dtypes) >= 1, InvalidInputError, "output_dtypes must name >= 1 output")
    dtypes = []
    for i, dtype in enumerate(output_dtypes):
        require(tf.as_dtype(dtype) in _DTYPES, InvalidInputError,
                f"output_dtypes[{i}] = {dtype} is not one of {[d.name for d in _DTYPES]}")
        dtypes.append(tf.as_dtype(dtype))
    if output_shapes is None:
        return dtypes, []
    require(len(output_shapes) == len(output_dtypes), InvalidInputError,
            f"output_shapes has {len(output_shapes)} entries for {len(output_dtypes)} outputs")
    return dtypes, [tf.TensorShape(s) for s in output_shapes]


@functools.lru_cache(maxsize=64)
def _path_tensor(path: str) -> tf.Tensor:
    """An eager string tensor of ``path``, built once per path: ``tf.constant`` on every call
    would be a measurable part of a small call's cost."""
    return tf.constant(path, tf.string)


def torch_call(package, inputs: Sequence[tf.Tensor], output_dtypes: Sequence[tf.DType],
               output_shapes: Sequence[Sequence[int | None]] | None = None,
               intra_op_threads: int = 1, concurrency: int = 1,
               name: str | None = None, tables=None) -> list[tf.Tensor]:
    """Runs the package at path ``package`` (scalar string tensor or Asset) on ``inputs``.

    Args:
      package: scalar ``tf.string`` path, or a ``tf.saved_model.Asset``.
      inputs: host tensors in the package's input order (dtypes and dims as its contract says).
      output_dtypes: one ``tf.DType`` per package output; checked against the package.
      output_shapes: optional static shapes (``None`` for dynamic dims) for shape inference.
      intra_op_threads: torch threads used by each calling TF thread (set once per thread).
      concurrency: AOTInductor model instances that may run at once in this process.
      tables: for a package whose contract names tables (an engine exported with a catalog
        capacity), the tables file (scalar ``tf.string`` path or ``tf.saved_model.Asset``):
        loaded once onto the package's device, never sent per call.

    Returns:
      One host tensor per output.
    """
    shapes = None if output_shapes is None else tuple(
        tuple(s) if s is not None else None for s in output_shapes)
    dtypes, shape_attrs = _attrs(tuple(output_dtypes), shapes)
    path, tables_path = _path(package), [] if tables is None else [_path(tables)]
    op = load_library("torch_call")
    return op.torch_call(package=path, tables=tables_path, inputs=list(inputs), Tout=dtypes,
                         output_shapes=shape_attrs, intra_op_threads=intra_op_threads,
                         concurrency=concurrency, name=name)


def _path(file):
    """A scalar path of ``file`` (a path or an asset) for the op."""
    path = file.asset_path if isinstance(file, tf.saved_model.Asset) else file
    if isinstance(path, str) and tf.executing_eagerly():
        path = _path_tensor(path)
    return path


def release_packages(folder) -> int:
    """Every TorchCall kernel of this process lets go of the packages (and tables) under
    ``folder``, a model version's folder being unloaded: TF's eager runtime keeps the
    kernels of an unloaded model's functions cached, and they would keep its packages (its
    weights and device memory, its prompt cache) alive. A package another loaded version
    also runs (a catalog-only version's hard-linked package) stays. Returns how many
    references were dropped (0 in a process that never loaded TorchCall: it is not loaded
    for this)."""
    if not _torch_call_loaded():
        return 0
    entry = ctypes.CDLL(str(library_path("torch_call"))).XgrTorchCallRelease
    entry.restype, entry.argtypes = ctypes.c_int, [ctypes.c_char_p]
    return entry(_folder_prefix(folder).encode())


def _folder_prefix(folder) -> str:
    """``folder`` as an absolute path ending in a separator: what the paths under it start with."""
    import os

    return os.path.join(os.path.abspath(os.fspath(folder)), "")


def _torch_call_loaded() -> bool:
    """Whether this process loaded the TorchCall library (any kernel may hold packages)."""
    if load_library.cache_info().currsize == 0:
        return False
    path = str(library_path("torch_call"))
    with open("/proc/self/maps") as maps:
        return any(line.rstrip().endswith(path) for line in maps)


def package_stats() -> dict:
    """The counters of every package this process has loaded, by path: for a package replayed
    as CUDA graphs, ``calls``, ``replays``, ``captures``, ``eager_runs`` (shapes not admitted
    to the graph budget, or every call after a failed capture), ``evictions``, ``held``
    (graphs kept), ``budget`` (graphs kept at most) and ``failure`` (why capture was given
    up); ``{"graphs": false}`` for a package that runs eagerly."""
    load_library("torch_call")
    entry = ctypes.CDLL(str(library_path("torch_call"))).XgrTorchCallStats
    entry.restype, entry.argtypes = ctypes.c_int, [ctypes.c_char_p, ctypes.c_int]
    size = entry(None, 0)
    buffer = ctypes.create_string_buffer(size)
    entry(buffer, size)
    return json.loads(buffer.value.decode())


def packages_under(folder) -> dict:
    """``package_stats`` of the packages under ``folder`` (a model version's), by path; empty
    in a process that never loaded TorchCall (it is not loaded for this)."""
    import os

    if not _torch_call_loaded():
        return {}
    prefix = _folder_prefix(folder)
    return {path: stats for path, stats in package_stats().items()
            if os.path.abspath(path).startswith(prefix)}
