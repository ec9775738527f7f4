"""TF<->Torch meeting point: DLPack hand-off, Torch layers in TF, migration and parity.

The hand-off is at the top: ``from bridge import to_torch, to_tf`` (``bridge.dlpack`` holds
them, with the support table and the plans that say what a hand-off will do).
"""

from xgr_common.import_order import preload_triton

preload_triton()  # before TensorFlow: see xgr_common/import_order.py

from bridge.dlpack import to_tf, to_torch  # noqa: E402  (after the preload above)

__all__ = ["to_tf", "to_torch"]
