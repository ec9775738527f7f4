"""Where the C++ op libraries live and how they are loaded into TensorFlow.

One library per folder ``custom_ops/cc/<lib>/`` (the build rule in ``custom_ops/_build.py``);
it is built next to this file as ``_<lib><extension suffix>`` by ``build_ext --inplace`` or an
editable install. TensorFlow is imported only when a library is actually loaded.
"""

from __future__ import annotations

import functools
import importlib.machinery
from pathlib import Path

from custom_ops import _build
from xgr_common.errors import OpLibraryError

PACKAGE_DIR = Path(__file__).resolve().parent
BUILD_COMMAND = ("`make install` or `pip install --no-build-isolation -e .` "
                 "(or `python setup.py build_ext --inplace`) in the repository root")


def library_names() -> tuple[str, ...]:
    """Short names (``feature_ops``, ``torch_call``) of the libraries with sources here."""
    return tuple(lib.name.rsplit("._", 1)[1]
                 for lib in _build.discover_libraries(PACKAGE_DIR.parent))


def _short_name(name: str) -> str:
    """Accepts ``feature_ops``, ``_feature_ops`` or ``custom_ops._feature_ops``."""
    short = name.rsplit(".", 1)[-1].lstrip("_")
    if short not in library_names():
        raise OpLibraryError(f"unknown op library {name!r}; the libraries with sources under "
                             f"{PACKAGE_DIR / 'cc'} are {list(library_names())}")
    return short


def library_path(name: str) -> Path:
    """The shared object of library ``name``: the built one, else where the build puts it."""
    short = _short_name(name)
    candidates = [PACKAGE_DIR / f"_{short}{suffix}"
                  for suffix in importlib.machinery.EXTENSION_SUFFIXES]
    return next((p for p in candidates if p.exists()), candidates[0])


def library_paths() -> dict[str, Path]:
    """``{short name: shared object path}`` for every library with sources."""
    return {name: library_path(name) for name in library_names()}


@functools.cache
def load_library(name: str):
    """Loads library ``name`` into TensorFlow once per process and returns its op module.

    Raises ``OpLibraryError`` naming the missing file and the build command when the library
    is not built, or TF's loader message when it does not load (e.g. built for another TF).
    """
    path = library_path(name)
    if not path.exists():
        raise OpLibraryError(
            f"op library custom_ops._{_short_name(name)} is not built: {path} does not exist. "
            f"Build it with {BUILD_COMMAND}.")
    import tensorflow as tf

    try:
        return tf.load_op_library(str(path))
    except (tf.errors.NotFoundError, tf.errors.InvalidArgumentError, OSError) as err:
        raise OpLibraryError(
            f"op library {path} failed to load ({err}); rebuild it against the installed "
            f"TensorFlow with {BUILD_COMMAND}.") from err
