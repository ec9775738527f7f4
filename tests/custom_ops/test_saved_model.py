"""A SavedModel using the semantic-ID table (inside a Keras layer) and all three ops, reloaded
in a fresh process.

The child imports only tensorflow and custom_ops; the SavedModel is moved and the original
catalog file deleted first, so the table can only come from the SavedModel's own asset.
"""

import json
import shutil
import subprocess
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

from xgr_common.layout import TokenLayout

# Heavy (a SavedModel reloaded in a fresh process): left out of `make test-quick`.
pytestmark = pytest.mark.heavy

LAYOUT = TokenLayout(levels=3, codebook_size=8, code_base=16)
IDS = np.array([101, 205, 309, 412], np.int64)
CODES = np.array([[1, 2, 3], [0, 7, 1], [5, 5, 5], [2, 0, 6]], np.int64)
INPUTS = dict(items=[101, 205, 205, 999, 309, 412, 412, 309],
              times=[10, 16, 17, 18, 19, 30, 31, 99],
              splits=[0, 5, 8], request=[50, 40], context=[[9, 10], [11, 12]])


class SemanticIdLayer(keras.layers.Layer):
    """A Keras layer owning the table, as a team's feature layers would."""

    def __init__(self, table, **kwargs):
        super().__init__(**kwargs)
        self.table = table

    def call(self, items, row_splits):
        tokens = self.table.lookup(items, row_splits, code_base=LAYOUT.code_base)
        return tokens.code_tokens, tokens.row_splits, tokens.unknown_count


class PromptModule(tf.Module):
    """History -> prompt with the project's ops, as a team's feature graph would do it."""

    def __init__(self, ops, catalog_path):
        super().__init__()
        self.table = ops.SemanticIdTable.from_arrays(catalog_path, IDS, CODES,
                                                     LAYOUT.codebook_size)
        self.tokenize = SemanticIdLayer(self.table)
        self._ops = ops

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)] * 3 +
                 [tf.TensorSpec([None], tf.int64), tf.TensorSpec([None, 2], tf.int64)])
    def __call__(self, items, times, splits, request, context):
        cleaned = self._ops.clean_sequence(items, times, splits, request, window_seconds=35,
                                           keep_last=3)
        code_tokens, code_splits, unknown = self.tokenize(cleaned.values, cleaned.row_splits)
        prompt = self._ops.assemble_prompt(
            context, code_tokens, code_splits, bos_id=LAYOUT.bos_id,
            profile_start_id=LAYOUT.profile_start_id, item_start_id=LAYOUT.item_start_id,
            pad_id=LAYOUT.pad_id, max_length=14)
        return {"token_ids": prompt.token_ids, "lengths": prompt.lengths,
                "segment_ids": prompt.segment_ids, "unknown": unknown,
                "table_size": self.table.size()}


CHILD = textwrap.dedent("""
    import json, sys
    import numpy as np
    import tensorflow as tf
    import custom_ops
    inputs = json.loads(sys.argv[2])
    args = [tf.constant(inputs[k], tf.int64)
            for k in ("items", "times", "splits", "request", "context")]
    # Two loads of one SavedModel hold separate tables: destroying the first (what garbage
    # collection of a restored resource runs, called directly because collection time is not
    # deterministic) must not break the second.
    first = tf.saved_model.load(sys.argv[1])
    first(*args)
    model = tf.saved_model.load(sys.argv[1])
    first.table._destroy_resource()
    del first
    out = model(*args)
    mods = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
    print(json.dumps({"out": {k: v.numpy().tolist() for k, v in out.items()},
                      "torch_modules": mods}))
""")


def test_saved_model_round_trip_in_fresh_process(ops, tmp_path, python, subprocess_env):
    catalog = tmp_path / "catalog.bin"
    module = PromptModule(ops, catalog)
    expected = {k: v.numpy().tolist() for k, v in module(
        *(tf.constant(INPUTS[k], tf.int64)
          for k in ("items", "times", "splits", "request", "context"))).items()}
    # Row 0: 101 is older than 50 - 35; the run 205, 205 collapses; 999 is not in the catalog.
    # Row 1: 309 at 99 is in the future; the run 412, 412 collapses.
    b, p, i, x = LAYOUT.bos_id, LAYOUT.profile_start_id, LAYOUT.item_start_id, LAYOUT.pad_id
    path = {item: [LAYOUT.code_token(level, int(c)) for level, c in enumerate(CODES[k])]
            for k, item in enumerate(IDS)}
    assert expected["token_ids"] == [
        [b, p, 9, 10, i, *path[205], i, *path[309], i, x],
        [b, p, 11, 12, i, *path[412], i, x, x, x, x, x]]
    assert expected["segment_ids"] == [[0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, -1],
                                       [0, 0, 0, 0, 1, 1, 1, 1, 2, -1, -1, -1, -1, -1]]
    assert expected["unknown"] == [1, 0] and expected["lengths"] == [13, 9]
    assert expected["table_size"] == len(IDS)

    saved = tmp_path / "saved"
    tf.saved_model.save(module, str(saved))
    moved = tmp_path / "moved"
    shutil.move(str(saved), str(moved))
    catalog.unlink()
    proc = subprocess.run([python, "-c", CHILD, str(moved), json.dumps(INPUTS)],
                          env=subprocess_env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["out"] == expected
    assert result["torch_modules"] == []
