"""A package with a prompt cache through TorchCall, in a child process (TF and custom_ops only,
the cache's budget from ``XGR_PROMPT_CACHE_BYTES``):
``python prompt_cache_child.py ENGINE.pt2 REQUESTS.npz``.

REQUESTS holds ``calls``: the number of calls; per call ``i`` its engine inputs
(``tokens_i``, ``lengths_i``, ``segments_i``, ``embeds_i``, ``exclude_i``,
``frozen_i``, ``keys_i``: uint8 [B, 8]) and the reference items ``want_items_i`` and scores
``want_scores_i`` (``Engine.recommend`` without a cache; absent for a call expected to be
refused). Prints one JSON line: per call "ok" (items equal, scores within ``atol``), "wrong"
or the TF error class and its message; and the package's counters after each call.
"""

import json
import sys

import numpy as np
import tensorflow as tf

import custom_ops  # noqa: F401
from custom_ops.torch_call import package_stats, torch_call

NAMES = ("tokens", "lengths", "segments", "embeds", "exclude", "frozen", "keys")


def main(package: str, requests: str) -> None:
    data = np.load(requests)
    atol = float(data["atol"])
    outcomes, stats = [], []
    for i in range(int(data["calls"])):
        inputs = [tf.constant(data[f"{name}_{i}"]) for name in NAMES]
        try:
            items, scores = torch_call(package, inputs, [tf.int64, tf.float32])
        except tf.errors.OpError as error:
            outcomes.append([type(error).__name__, error.message.splitlines()[0]])
        else:
            same = (f"want_items_{i}" in data
                    and np.array_equal(items.numpy(), data[f"want_items_{i}"])
                    and np.allclose(scores.numpy(), data[f"want_scores_{i}"], atol=atol))
            outcomes.append("ok" if same else "wrong")
        loaded = package_stats()     # empty when the package failed to load
        stats.append(next(iter(loaded.values())).get("prompt_cache") if loaded else None)
    print(json.dumps({"outcomes": outcomes, "stats": stats}))


if __name__ == "__main__":
    main(*sys.argv[1:3])
