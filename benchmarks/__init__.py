"""Benchmarks of the product beside its anchors, run as modules from the repository root:
``python -m benchmarks.bench_engine --helpfull``. Each writes its result through
``benchmarks.results_file``."""

import os

# TensorFlow reads its C++ log level when it is first imported: set before any benchmark
# module imports it.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
