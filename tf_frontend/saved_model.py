"""Export the feature graph as a TF SavedModel, and load one with a clear missing-op error.

``export_feature_graph`` writes a SavedModel whose ``serving_default`` signature names every
input and output of ``FeatureGraph`` (the semantic-ID catalog travels as an asset). Loading it
needs only TensorFlow and the op library: ``import custom_ops`` and then
``tf.saved_model.load(path)``, or ``load_saved_model(path)``, which turns TF's bare
``Op type not registered`` into an ``OpLibraryError`` that says which library and how to load it.

This module never imports ``custom_ops`` itself, so it can report the library as missing.
"""

from __future__ import annotations

import importlib.machinery
import os
import re
from pathlib import Path

import tensorflow as tf

from xgr_common.errors import ExportError, OpLibraryError
from xgr_common.serving_names import SERVING_SIGNATURE

_OPS_DIR = Path(__file__).resolve().parent.parent / "custom_ops"
_UNREGISTERED = re.compile(r"Op type not registered '([^']+)'")


class _Servable(tf.Module):
    """Holds the graph (and through it the table, lookup tables and weights) for saving."""

    def __init__(self, graph):
        super().__init__(name="feature_graph_servable")
        self.graph = graph
        self.serve = serving_function(graph)


def serving_function(graph) -> tf.types.experimental.PolymorphicFunction:
    """The traced function ``export_feature_graph`` saves: features dict -> outputs dict.

    Graph mode may fuse kernels (MatMul + BiasAdd + activation), so float outputs can differ
    from eager ``graph(features)`` by rounding; a reloaded SavedModel matches this function
    exactly.
    """
    from tf_frontend.feature_graph import INPUTS, OUTPUTS

    specs = {name: tf.TensorSpec([None], dtype, name=name) for name, dtype in INPUTS.items()}
    # The graph's own outputs (a version 2 graph adds frozen_lengths).
    names = getattr(graph, "feature_outputs", OUTPUTS)

    def serve(features):
        out = graph(features)
        return {name: out[name] for name in names}

    return tf.function(serve, input_signature=[specs])


def export_feature_graph(graph, path: str | os.PathLike) -> Path:
    """Saves ``graph`` (a ``FeatureGraph``) as a SavedModel at ``path``; returns the path.

    The ``serving_default`` signature takes the six input features by name (all 1-D, batch
    and event dimensions dynamic) and returns the eight outputs by name.
    """
    path = Path(path)
    servable = _Servable(graph)
    try:
        signature = servable.serve.get_concrete_function()
        tf.saved_model.save(servable, str(path), signatures={SERVING_SIGNATURE: signature})
    except (tf.errors.OpError, ValueError, TypeError) as err:
        raise ExportError(f"could not export the feature graph to {path}: {err}") from err
    return path


def op_library_of(op_name: str) -> str | None:
    """The ``custom_ops`` library (short name, e.g. ``feature_ops``) that registers
    ``op_name``, read from the C++ sources; None if no library does."""
    pattern = re.compile(r'REGISTER_OP\("' + re.escape(op_name) + r'"\)')
    for source in sorted((_OPS_DIR / "cc").glob("*/*.cc")):
        if pattern.search(source.read_text(errors="replace")):
            return source.parent.name
    return None


def _library_file(short_name: str) -> Path:
    candidates = [_OPS_DIR / f"_{short_name}{suffix}"
                  for suffix in importlib.machinery.EXTENSION_SUFFIXES]
    return next((p for p in candidates if p.exists()), candidates[0])


def load_saved_model(path: str | os.PathLike):
    """``tf.saved_model.load(path)``, with a missing custom op reported as ``OpLibraryError``.

    Raises:
      OpLibraryError: the SavedModel uses an op no loaded library registers; the message names
        the op, the library file and how to load it (``import custom_ops``).
    """
    try:
        return tf.saved_model.load(str(path))
    except (tf.errors.OpError, RuntimeError, ValueError) as err:  # TF 2.21 raises RuntimeError
        match = _UNREGISTERED.search(str(err))
        if match is None:
            raise
        op = match.group(1)
        library = op_library_of(op)
        if library is None:
            raise OpLibraryError(
                f"SavedModel {path} uses op {op!r}, which neither TensorFlow nor any "
                f"custom_ops library registers") from err
        raise OpLibraryError(
            f"SavedModel {path} uses op {op!r} from the C++ op library custom_ops._{library} "
            f"({_library_file(library)}), which is not loaded in this process. Load it with "
            f"`import custom_ops` before loading the SavedModel (build it first with "
            f"`python setup.py build_ext --inplace` if the file is missing).") from None
