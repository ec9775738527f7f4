"""Fresh-process reload: ``python reload_child.py SAVED_MODEL FEATURES.npz OUT.npz [SIGNATURE]``.

Imports only tensorflow and custom_ops, loads the SavedModel, runs ``SIGNATURE`` (default
``serving_default``) on the features and writes its outputs, plus the names of the loaded
modules under ``modules``; a request the model refuses (InvalidArgument) writes its message
under ``error`` instead of outputs.
"""

import sys

import numpy as np
import tensorflow as tf

import custom_ops  # noqa: F401  (registers TorchCall and the feature ops)
from xgr_common.serving_names import SERVING_SIGNATURE


def main(saved_model: str, features_path: str, out_path: str,
         signature: str = SERVING_SIGNATURE) -> None:
    loaded = tf.saved_model.load(saved_model)
    serve = loaded.signatures[signature]
    with np.load(features_path) as data:
        features = {name: tf.constant(data[name]) for name in data.files}
    try:
        outputs = {name: value.numpy() for name, value in serve(**features).items()}
    except tf.errors.InvalidArgumentError as e:
        outputs = {"error": np.array(e.message)}
    np.savez(out_path, modules=np.array(sorted(sys.modules), dtype=object), **outputs)


if __name__ == "__main__":
    main(*sys.argv[1:5])
