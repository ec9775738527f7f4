"""Run a SavedModel with TensorFlow and ``custom_ops`` alone, as a serving host would.

    python -m xgr_export.run_saved_model SAVED_MODEL FEATURES.npz OUT.npz [--repeats N]

Loads the SavedModel in this (fresh) process, calls ``serving_default`` on the features of
``FEATURES.npz`` (one array per input; byte strings for string inputs) and writes its outputs
to ``OUT.npz``, with ``modules`` (the names of every module this process imported: proof that
no Python torch or engine code was needed) and ``seconds`` (load, first call, then the median
of ``--repeats`` further calls), and the last further call's outputs as ``repeat_<name>`` (a
SavedModel with a prompt cache answers it from the cache). ``xgr_export.verify`` compares the
outputs with the in-process pipeline. Importing ``xgr_export`` loads none of its heavy modules, so this child
needs only TensorFlow, NumPy and ``custom_ops``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np
import tensorflow as tf

import custom_ops  # noqa: F401  (registers TorchCall and the feature ops)
from xgr_common.serving_names import SERVING_SIGNATURE


def run(saved_model: str, features_path: str, out_path: str, repeats: int = 0) -> None:
    """Loads ``saved_model``, runs it on the features, writes outputs and timings."""
    started = time.perf_counter()
    loaded = tf.saved_model.load(saved_model)
    serve = loaded.signatures[SERVING_SIGNATURE]
    with np.load(features_path) as data:
        features = {name: tf.constant(data[name]) for name in data.files}
    load_seconds = time.perf_counter() - started
    started = time.perf_counter()
    outputs = {name: value.numpy() for name, value in serve(**features).items()}
    first_seconds = time.perf_counter() - started
    again, last = [], {}
    for _ in range(repeats):
        started = time.perf_counter()
        last = {f"repeat_{name}": value.numpy() for name, value in serve(**features).items()}
        again.append(time.perf_counter() - started)
    seconds = np.array([load_seconds, first_seconds,
                        statistics.median(again) if again else np.nan], np.float64)
    np.savez(out_path, modules=np.array(sorted(sys.modules), dtype=object), seconds=seconds,
             **outputs, **last)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("saved_model")
    parser.add_argument("features")
    parser.add_argument("out")
    parser.add_argument("--repeats", type=int, default=0,
                        help="timed calls after the first (median reported)")
    args = parser.parse_args(argv)
    run(args.saved_model, args.features, args.out, args.repeats)


if __name__ == "__main__":
    main()
