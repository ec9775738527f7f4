"""Hostile values through an exported engine package, in a child process:
``python hostile_child.py ENGINE.pt2 HIDDEN SOFT [MAX_POSITION]``.

Imports TensorFlow and custom_ops only. Runs one valid request, each hostile case, then the
valid request again; prints one JSON line: case -> the TF error class (or "ok"), whether
the last request equals the first, and TorchCall's counters of the package (on CUDA: one
graph replay per valid call). With MAX_POSITION, a prompt longer than the model's positions
is one more case. A value that reached a kernel could end this process
(an AOTInductor bounds check inside an OpenMP loop aborts it), so the parent also asserts
the exit code.
"""

import json
import sys

import numpy as np
import tensorflow as tf

import custom_ops  # noqa: F401
from custom_ops.torch_call import package_stats, torch_call


def request(hidden: int, soft: int):
    tokens = np.tile(np.array([1, 5, 9, 4, 256, 512, 768, 4], np.int32), (2, 1))
    lengths = np.array([8, 5], np.int32)
    segments = np.tile(np.array([0, 0, 0, 1, 1, 1, 1, 2], np.int32), (2, 1))
    embeds = np.zeros((2, soft, hidden), np.float32)
    exclude = np.full((2, 2), -1, np.int64)
    return [tokens, lengths, segments, embeds, exclude]


def set_at(index, where, value):
    def change(inputs):
        inputs[index][where] = value
    return change


CASES = {
    "token_1024": set_at(0, (0, 3), 1024), "token_-1": set_at(0, (1, 0), -1),
    "token_huge": set_at(0, (0, 0), 2**31 - 1), "length_0": set_at(1, 0, 0),
    "length_-3": set_at(1, 1, -3), "length_9": set_at(1, 0, 9),
    "segment_back": set_at(2, (0, 5), 0), "segment_-2": set_at(2, (1, 1), -2),
    "exclude_-9": set_at(4, (1, 1), -9),
    "embeds_nan": set_at(3, (1, 0, 5), np.nan), "embeds_inf": set_at(3, (0, 1, 0), -np.inf),
}


def long_prompt(hidden: int, soft: int, max_position: int):
    """A valid-looking request whose prompt (soft tokens + length + the generated codes)
    does not fit the model's positions."""
    width = max_position
    tokens = np.ones((1, width), np.int32)
    return [tokens, np.array([width], np.int32), np.zeros((1, width), np.int32),
            np.zeros((1, soft, hidden), np.float32), np.full((1, 1), -1, np.int64)]


def main(path: str, hidden: int, soft: int, max_position: int | None = None) -> None:
    out = [tf.int64, tf.float32]
    first = torch_call(path, request(hidden, soft), out)[0].numpy()
    seen = {}
    cases = dict(CASES)
    if max_position is not None:
        cases["prompt_past_max_position"] = None
    for name, change in cases.items():
        if change is None:
            inputs = long_prompt(hidden, soft, max_position)
        else:
            inputs = request(hidden, soft)
            change(inputs)
        try:
            torch_call(path, inputs, out)
            seen[name] = "ok"
        except tf.errors.OpError as error:
            seen[name] = type(error).__name__
    last = torch_call(path, request(hidden, soft), out)[0].numpy()
    print(json.dumps({"cases": seen, "next_request_equal": bool(np.array_equal(first, last)),
                      "stats": package_stats().get(path, {})}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]),
         int(sys.argv[4]) if len(sys.argv) > 4 else None)
