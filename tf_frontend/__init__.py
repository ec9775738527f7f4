"""TF feature graphs, Keras layers, SavedModel export and the TF-Serving-compatible server."""

from xgr_common.import_order import preload_triton

preload_triton()  # before TensorFlow: see xgr_common/import_order.py
