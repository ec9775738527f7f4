"""The Torch generative-retrieval engine. Never imports TensorFlow.

Heavy submodules load on first attribute access. The leaves it shares with the TF side
(errors, layout, prompt contract, tolerances) live in ``xgr_common``.
"""

from __future__ import annotations

import importlib

_LAZY = {
    "Engine": "torch_engine.engine",
    "Model": "torch_engine.model",
    "ModelConfig": "torch_engine.config",
    "Catalog": "torch_engine.catalog",
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'torch_engine' has no attribute {name!r}")
