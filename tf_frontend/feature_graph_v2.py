"""The feature graph of the version 2 prompt (``xgr_common.prompt_v2``): the history split into
a long-term part that stays fixed while a user's time block is open and a recent part, both
through the semantic-ID lookup, assembled with the soft-vector markers after the long-term
part and the model's text spans between the parts.

Inputs as ``tf_frontend.feature_graph`` (``INPUTS``). Outputs: those of the version 1 graph
(``OUTPUTS``; ``token_ids`` now hold ``profile_tokens`` SOFT markers where the engine places the
soft vectors, and the seen-item history is the long-term items then the recent ones, known
items only) plus::

    frozen_lengths int32 [B]   tokens of each row's frozen prefix (BOS, intro, long-term items)

with L = ``spec.max_prompt_tokens`` (the layout's longest row: no row is ever cut).
"""

from __future__ import annotations

import tensorflow as tf

from tf_frontend.feature_graph import OUTPUTS, FeatureGraph
from tf_frontend.layers import XgrAssemblePromptV2, XgrSplitHistory
from xgr_common.prompt_spec import PromptSpec

STAGES_V2 = ("split_history", "semantic_ids", "context_lookup", "hash_ids", "sparse_embedding",
             "profile_tower", "profile_projection", "assemble_prompt_v2")
OUTPUTS_V2 = (*OUTPUTS, "frozen_lengths")


class FeatureGraphV2(FeatureGraph):
    """Request features -> the version 2 prompt, soft-prompt vectors and the seen-item history.

    Arguments as ``FeatureGraph``'s; ``spec.prompt_v2`` must be set (a version 1 model is
    refused by name)."""

    prompt_version = 2
    stages = STAGES_V2
    feature_outputs = OUTPUTS_V2

    def _build_history_stage(self, spec: PromptSpec) -> None:
        self.split_history = XgrSplitHistory(spec.prompt_v2.split, name="split_history")

    def _build_assembly_stage(self, spec: PromptSpec) -> None:
        self.assemble_prompt_v2 = XgrAssemblePromptV2(
            spec.layout, spec.prompt_v2, spec.profile_tokens, spec.max_prompt_tokens,
            name="assemble_prompt_v2")

    def _prompt(self, features: dict, context_tokens) -> dict:
        """The version 2 prompt and the history outputs."""
        long_values, long_splits, recent_values, recent_splits = self.stage("split_history")(
            features["history_items"], features["history_times"], features["history_splits"],
            features["request_time"])
        long_codes, long_code_splits, long_unknown, long_known = self._codes(
            long_values, long_splits)
        recent_codes, recent_code_splits, recent_unknown, recent_known = self._codes(
            recent_values, recent_splits)
        token_ids, lengths, segment_ids, frozen_lengths = self.stage("assemble_prompt_v2")(
            long_codes, long_code_splits, context_tokens, recent_codes, recent_code_splits)
        # The seen-item history: per row, the long-term items then the recent ones.
        seen = tf.concat([tf.RaggedTensor.from_row_splits(long_known, long_code_splits),
                          tf.RaggedTensor.from_row_splits(recent_known, recent_code_splits)],
                         axis=1)
        return {"token_ids": token_ids, "lengths": lengths, "segment_ids": segment_ids,
                "frozen_lengths": frozen_lengths, "history_values": seen.values,
                "history_splits": seen.row_splits, "unknown_items": long_unknown + recent_unknown}
