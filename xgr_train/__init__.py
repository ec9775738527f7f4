"""From a team's catalog and behaviour logs to a trained generative retriever: the logs
(``logs``), fine-tuning (``xgr train``) and offline evaluation (``xgr evaluate``).

``logs`` is NumPy only; training and evaluation also need torch and TensorFlow."""

from xgr_common.import_order import preload_triton

preload_triton()  # before TensorFlow (training, evaluation): see xgr_common/import_order.py
