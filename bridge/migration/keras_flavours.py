"""The two Kerases a team's model may be written in, and which one a process can run.

* ``keras3``: the ``keras`` package (what ``tf.keras`` is by default since TF 2.16).
* ``tf_keras``: Keras 2 (the ``tf_keras`` package), what ``tf.keras`` is when the environment
  holds ``TF_USE_LEGACY_KERAS=1`` *when TensorFlow is imported*. Most production TF
  recommendation code is written against it.

TensorFlow reads that variable once, at import, so one process serves one ``tf.keras``: a model
factory written with ``tf.keras`` builds a Keras 2 model only in a process started with the
variable set. The CLI therefore runs each plan in the process its Keras needs
(:func:`process_env`), and :func:`check_process` refuses, with the reason, to build a plan's
model in the wrong one.

Both Kerases attach a layer's output mask to the eager tensor as ``_keras_mask``; both keep a
Functional model's graph in ``_nodes_by_depth`` (their node classes differ: see
:mod:`bridge.migration.functional`).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from xgr_common.errors import MigrationError

KERAS3 = "keras3"
TF_KERAS = "tf_keras"
FLAVOURS = (KERAS3, TF_KERAS)
LEGACY_ENV = "TF_USE_LEGACY_KERAS"
_TRUE = ("1", "true", "yes")


def check_flavour(flavour: str, where: str) -> str:
    if flavour not in FLAVOURS:
        raise MigrationError(f"{where}: keras must be one of {FLAVOURS}, got {flavour!r}")
    return flavour


def flavour_of(obj: Any) -> str | None:
    """``keras3`` / ``tf_keras`` for a Keras model, layer or symbolic tensor; None otherwise."""
    for cls in type(obj).__mro__:
        root = cls.__module__.split(".")[0]
        if root == "tf_keras":
            return TF_KERAS
        if root == "keras":
            return KERAS3
    return None


def env_flavour(environ: Any = None) -> str:
    """The Keras that ``tf.keras`` is (or will be) in a process with ``environ``."""
    value = (os.environ if environ is None else environ).get(LEGACY_ENV, "")
    return TF_KERAS if value.strip().lower() in _TRUE else KERAS3


def process_flavour() -> str:
    """The Keras that ``tf.keras`` is in this process (decided when TF was imported)."""
    return env_flavour()


def tensorflow_imported() -> bool:
    return "tensorflow" in sys.modules


def process_env(flavour: str, environ: Any = None) -> dict[str, str]:
    """``environ`` (default: this process's) set up for a child running ``flavour``."""
    env = dict(os.environ if environ is None else environ)
    if flavour == TF_KERAS:
        env[LEGACY_ENV] = "1"
    else:
        env.pop(LEGACY_ENV, None)
    return env


def prepare_process(flavour: str) -> bool:
    """Make this process run ``flavour`` if TF is not imported yet; True when it now does."""
    if not tensorflow_imported():
        if flavour == TF_KERAS:
            os.environ[LEGACY_ENV] = "1"
        else:
            os.environ.pop(LEGACY_ENV, None)
    return process_flavour() == flavour


def check_process(flavour: str, what: str) -> None:
    """Raise when this process cannot build ``what`` (a model of ``flavour``)."""
    here = process_flavour()
    if here != flavour:
        how = f"{LEGACY_ENV}=1" if flavour == TF_KERAS else f"{LEGACY_ENV} unset"
        raise MigrationError(
            f"{what} is a {flavour} model, but tf.keras in this process is {here}: TensorFlow "
            f"reads {LEGACY_ENV} once, when it is imported, so run it in a process started with "
            f"{how} (the xgr CLI does this itself)")


def is_keras_model(obj: Any) -> bool:
    """A ``keras.Model`` of either Keras."""
    return flavour_of(obj) is not None and any(
        cls.__name__ == "Model" for cls in type(obj).__mro__)


def is_keras_tensor(obj: Any) -> bool:
    """A symbolic Keras tensor (a Functional graph's edge) of either Keras."""
    return flavour_of(obj) is not None and any(
        cls.__name__ == "KerasTensor" for cls in type(obj).__mro__)


def is_layer_class(layer: Any, name: str) -> bool:
    """``layer`` is (a subclass of) the built-in Keras layer ``name`` of either Keras."""
    return flavour_of(layer) is not None and any(
        cls.__name__ == name and cls.__module__.split(".")[0] in ("keras", "tf_keras")
        for cls in type(layer).__mro__)


def keras_mask(tensor: Any) -> Any:
    """The Keras mask attached to an eager tensor, or None."""
    return getattr(tensor, "_keras_mask", None)


def set_keras_mask(tensor: Any, mask: Any) -> Any:
    """Attach ``mask`` to ``tensor`` as both Kerases do; returns the tensor."""
    if mask is not None:
        try:
            tensor._keras_mask = mask
        except AttributeError:   # a tensor type that takes no attributes
            raise MigrationError(f"cannot attach a Keras mask to a {type(tensor).__name__}") \
                from None
    return tensor


def rerun_in_child(subcommand: str, args: list[str], flag_args: list[str], flavour: str) -> int:
    """Run ``xgr SUBCOMMAND ARGS FLAGS`` in a fresh process whose ``tf.keras`` is ``flavour``
    (this one imported TF with the other Keras); relays its output, returns its exit status."""
    import subprocess

    proc = subprocess.run([sys.executable, "-m", "xgr_cli.main", subcommand, *args, *flag_args],
                          env=process_env(flavour), capture_output=True, text=True)
    sys.stdout.write(proc.stdout)
    sys.stderr.write(proc.stderr)
    return proc.returncode
