"""SavedModel export of the whole pipeline, and its verification.

``export_saved_model(ExportConfig(out=...)) -> ExportReport`` builds the engine, packages it
for TorchCall, saves feature graph -> TorchCall -> rules as one SavedModel and, when asked,
reloads it in a fresh process and compares its items with the in-process pipeline. The pieces,
in the order an export runs them:

    config           ExportConfig, EngineExportConfig (plain data)
    torch_package    a torch module -> a TorchCall package (AOTInductor or TorchScript) and
                     its calling contract
    engine_package   ``Engine.recommend`` as such a package
    saved_model      the SavedModel: feature graph -> TorchCall -> rules
    verify           the SavedModel in a fresh process (``run_saved_model``: TF + custom_ops
                     only) against reference outputs
    check            ... against ``bridge.pipeline.RecommendPipeline`` on the same requests
    export           ``export_saved_model``, the one entry point (``xgr export`` calls it)

Importing the package loads none of them: ``run_saved_model`` must run with TensorFlow and
``custom_ops`` alone and ``engine_package`` without TensorFlow, so the names below load their
module on first use.
"""

import importlib

from xgr_common.import_order import preload_triton

preload_triton()  # before TensorFlow: see xgr_common/import_order.py

_HOMES = {"EngineExportConfig": "xgr_export.config", "ExportConfig": "xgr_export.config",
          "ExportReport": "xgr_export.export", "export_saved_model": "xgr_export.export"}

__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module 'xgr_export' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)
