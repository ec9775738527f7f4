"""A random-weight preset as a team would hand it over to ``xgr export``: checkpoint with its
``xgr_model.json``, catalog file, feature-graph weights (an untrained tower of the prompt
contract's shapes). Shared by the benchmarks that export through the command line."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from xgr_common.layout import MaskMode


def write_team_files(folder: Path, preset: str, spec, item_ids: np.ndarray,
                     item_codes: np.ndarray, mask: MaskMode = MaskMode.ITEM_CAUSAL,
                     catalog_name: str = "catalog_1.parquet") -> dict[str, Path]:
    """The files ``xgr export --model --catalog --feature_graph`` takes, for ``preset`` with
    random weights (seed 0), the prompt contract ``spec`` (its ``model_hidden`` is the
    preset's) and the catalog ``item_ids`` / ``item_codes``."""
    from safetensors.numpy import save_file

    from torch_engine.model import Model
    from xgr_checkpoint.catalog_file import write_catalog
    from xgr_common.model_card import ModelCard

    folder.mkdir(parents=True, exist_ok=True)
    model = Model.from_preset(preset, seed=0)
    config = model.config
    model.save_pretrained(folder / "model")
    ModelCard(spec=spec, prefill_mask=mask, architecture=config.to_hf_dict()["model_type"],
              vocab_size=config.vocab_size, hidden_size=config.hidden_size).write(
        folder / "model")
    rng = np.random.default_rng(0)
    shapes = {"table": (spec.embedding_buckets, spec.embedding_dim),
              "tower_kernel": (2 * spec.embedding_dim, spec.tower_hidden),
              "tower_bias": (spec.tower_hidden,),
              "projection_kernel": (spec.tower_hidden, spec.profile_tokens * spec.model_hidden),
              "projection_bias": (spec.profile_tokens * spec.model_hidden,)}
    save_file({k: (rng.standard_normal(s) * 0.05).astype(np.float32) for k, s in shapes.items()},
              str(folder / "tower.safetensors"))
    write_catalog(folder / catalog_name, item_ids, item_codes)
    return {"model": folder / "model", "catalog": folder / catalog_name,
            "feature_graph": folder / "tower.safetensors"}
