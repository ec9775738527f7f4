"""Development path: call a Torch callable from a TF graph through ``tf.py_function`` + DLPack.

NOT PORTABLE. The graph holds only a key to a Python callback registered in this process; a
SavedModel made with it loads elsewhere but every call there fails. For anything that leaves
the process (TF Serving, another host, a fresh process), export with ``xgr export`` or
``xgr_export.saved_model.export_pipeline``: they compile the Torch code into a package that the
``TorchCall`` op (``custom_ops.torch_call``) runs from a SavedModel asset.

The callback key carries that explanation, so the error in the other process reads, e.g.:
``Could not find callback with key=xgr-torch-layer-3 (NOT PORTABLE: ...) in the registry``.
(Choosing the key uses TF's private ``script_ops`` registry; ``tf.py_function`` offers no
public way to name it.)

Inputs cross to Torch without a copy (``bridge.to_torch``) and results come back the
same way (``bridge.dlpack.to_tf``, one copy only when TF cannot use the torch memory).
"""

from __future__ import annotations

import itertools
from typing import Callable, Sequence

import keras
import tensorflow as tf
from tensorflow.python.framework import ops
from tensorflow.python.ops import gen_script_ops, script_ops

from bridge import to_tf, to_torch
from xgr_common.errors import BridgeError, require

NOT_PORTABLE = ("NOT PORTABLE: this graph calls Torch through tf.py_function, whose Python "
                "callback exists only in the process that built it. Export portably with "
                "`xgr export --out DIR` or xgr_export.saved_model.export_pipeline, which embed the "
                "Torch code through the TorchCall op")
_KEYS = itertools.count()  # callback keys must be unique in the process, like TF's own


def _register(callback: Callable, output_dtypes: list[tf.DType]) -> str:
    """Registers ``callback`` under a self-explaining key; keeps it alive with the graph."""
    key = f"xgr-torch-layer-{next(_KEYS)} ({NOT_PORTABLE})"
    func = script_ops.EagerFunc(callback, output_dtypes, False)
    script_ops._py_funcs._funcs[key] = func  # noqa: SLF001 (see the module docstring)
    graph = ops.get_default_graph()
    while getattr(graph, "outer_graph", None) is not None:
        graph = graph.outer_graph
    if not hasattr(graph, "_py_funcs_used_in_graph"):
        graph._py_funcs_used_in_graph = []
    graph._py_funcs_used_in_graph.append(func)  # the registry holds only a weak reference
    return key


def torch_function(fn: Callable, inputs: Sequence[tf.Tensor], output_dtypes: Sequence[tf.DType],
                   output_shapes: Sequence[Sequence[int | None]] | None = None,
                   name: str | None = None) -> list[tf.Tensor]:
    """Runs ``fn(*torch_tensors) -> tensor | tuple of tensors`` on ``inputs``; not portable.

    output_dtypes: one ``tf.DType`` per result; output_shapes: optional static shapes.
    Returns one TF tensor per result.
    """
    dtypes = [tf.as_dtype(d) for d in output_dtypes]
    require(len(dtypes) >= 1, BridgeError, "output_dtypes must name at least one output")

    def callback(*tensors):
        results = fn(*(to_torch(t) for t in tensors))
        results = results if isinstance(results, (tuple, list)) else (results,)
        require(len(results) == len(dtypes), BridgeError,
                f"the Torch callable returned {len(results)} tensors, output_dtypes names "
                f"{len(dtypes)}")
        out = []
        for i, (value, dtype) in enumerate(zip(results, dtypes)):
            converted = to_tf(value.detach().contiguous())
            require(converted.dtype == dtype, BridgeError,
                    f"output {i}: the Torch callable returned {converted.dtype.name}, "
                    f"output_dtypes says {dtype.name}")
            out.append(converted)
        return out

    key = _register(callback, dtypes)
    outputs = gen_script_ops.eager_py_func(input=list(inputs), token=key, is_async=False,
                                           Tout=dtypes, name=name)
    for tensor, shape in zip(outputs, output_shapes or ()):
        tensor.set_shape(shape)
    return list(outputs)


class TorchLayer(keras.layers.Layer):
    """A Keras layer running a Torch callable (development only; see the module docstring).

    fn: torch tensors -> tensor or tuple of tensors; output_dtypes, output_shapes: as in
    ``torch_function``. ``call(*inputs)`` returns one tensor, or a list for several outputs.
    """

    def __init__(self, fn: Callable, output_dtypes: Sequence[tf.DType],
                 output_shapes: Sequence[Sequence[int | None]] | None = None, **kwargs):
        super().__init__(**kwargs)
        self.fn, self.output_dtypes, self.output_shapes = fn, list(output_dtypes), output_shapes

    def call(self, *inputs):
        out = torch_function(self.fn, inputs, self.output_dtypes, self.output_shapes)
        return out[0] if len(out) == 1 else out
