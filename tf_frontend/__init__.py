"""TF feature graphs, Keras layers, business rules, the feature graph's SavedModel and the
TF-Serving-compatible server (`serving/`). Never torch: the engine is reached through the
`TorchCall` op or, in process, through `bridge`."""

from xgr_common.import_order import preload_triton

preload_triton()  # before TensorFlow: see xgr_common/import_order.py
