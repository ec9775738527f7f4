"""SavedModel export of the whole pipeline, and its verification."""

from xgr_common.import_order import preload_triton

preload_triton()  # before TensorFlow: see xgr_common/import_order.py
