"""The demo world and its training: a synthetic catalog with users, the embedded default model
fitted on it, and the offline evaluation (recall@K against popularity).

None of it is needed to serve: the engine (``torch_engine``) and the TF side
(``tf_frontend``, ``custom_ops``) run any catalog and model. ``synthetic`` is NumPy only;
``train`` and ``kmeans`` need torch; ``default_model`` and ``evaluation`` also TensorFlow.
"""

from xgr_common.import_order import preload_triton

preload_triton()  # before TensorFlow (default_model, evaluation): see xgr_common/import_order.py
