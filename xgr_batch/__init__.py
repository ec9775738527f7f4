"""Offline batch recommendation: every user of a Parquet file through an exported SavedModel
on a Ray cluster, the results to Parquet, resumable (``xgr batch``)."""

from xgr_common.import_order import preload_triton

preload_triton()  # before TensorFlow: see xgr_common/import_order.py
