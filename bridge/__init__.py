"""TF<->Torch meeting point: DLPack hand-off, Torch layers in TF, migration and parity."""

from torch_engine.import_order import preload_triton

preload_triton()  # before TensorFlow: see torch_engine/import_order.py
