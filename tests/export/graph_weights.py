"""Weights of the reference feature graph in the layout training writes them, drawn at random:
what a team's ``feature_graph.safetensors`` holds, for the export tests."""

from __future__ import annotations

import numpy as np

from xgr_common.prompt_spec import PromptSpec


def graph_weights(spec: PromptSpec, seed: int = 0) -> dict[str, np.ndarray]:
    """``{table, tower_kernel, tower_bias, projection_kernel, projection_bias}`` sized by
    ``spec``, float32 N(0, 0.05^2)."""
    rng = np.random.default_rng(seed)
    shapes = {"table": (spec.embedding_buckets, spec.embedding_dim),
              "tower_kernel": (2 * spec.embedding_dim, spec.tower_hidden),
              "tower_bias": (spec.tower_hidden,),
              "projection_kernel": (spec.tower_hidden, spec.profile_tokens * spec.model_hidden),
              "projection_bias": (spec.profile_tokens * spec.model_hidden,)}
    return {k: (rng.standard_normal(s) * 0.05).astype(np.float32) for k, s in shapes.items()}
