"""TF<->Torch meeting point: DLPack hand-off, Torch layers in TF, migration and parity."""

from xgr_common.import_order import preload_triton

preload_triton()  # before TensorFlow: see xgr_common/import_order.py
