"""Keras masks at a Torch stage's boundary.

Keras attaches a mask to a tensor (``Embedding(mask_zero=True)`` marks padding) and passes it
to every later layer whose ``call`` takes ``mask``. A Torch stage sits between TF layers, so
the runner carries masks across it both ways:

* in: a converted stage takes its input masks as extra graph inputs (it was traced with
  them); a hand-written module receives them as ``forward(..., mask=...)`` (one mask, or a
  tuple with one entry per tensor input) when ``forward`` takes ``mask``. A stage whose TF
  layer reads masks but whose module cannot take them is refused: the mask would be lost.
* out: a converted stage returns its output masks after its outputs; a hand-written module
  with ``returns_mask = True`` returns ``(output, mask)``; any other module's outputs get the
  mask the TF layer's ``compute_mask`` gives, as Keras itself does after ``call``.
"""

from __future__ import annotations

import inspect
from typing import Any

import tensorflow as tf

from bridge.migration.keras_flavours import keras_mask


def takes_mask(fn: Any) -> bool:
    """Whether ``fn`` (a layer's ``call``, a module's ``forward``) has a ``mask`` parameter."""
    try:
        return "mask" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def first_argument(args: tuple, kwargs: dict) -> Any:
    return args[0] if args else next(iter(kwargs.values()), None)


def previous_mask(args: tuple, kwargs: dict) -> Any:
    """The masks Keras would hand ``compute_mask``: those of the first argument's tensors."""
    masks = tf.nest.map_structure(keras_mask, first_argument(args, kwargs))
    return None if all(m is None for m in tf.nest.flatten(masks)) else masks


def tf_output_mask(layer: Any, args: tuple, kwargs: dict) -> Any:
    """The mask the TF layer gives its output for these arguments, or None."""
    if not getattr(layer, "supports_masking", False):
        return None
    try:
        mask = layer.compute_mask(first_argument(args, kwargs), previous_mask(args, kwargs))
    except (TypeError, ValueError, NotImplementedError):
        return None   # tf_keras: the layer does not support masking
    return mask if tf.is_tensor(mask) else None
