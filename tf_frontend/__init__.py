"""TF feature graphs, Keras layers, SavedModel export and the TF-Serving-compatible server."""

from torch_engine.import_order import preload_triton

preload_triton()  # before TensorFlow: see torch_engine/import_order.py
