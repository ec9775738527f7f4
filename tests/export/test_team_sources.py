"""A team's files for ``xgr export``, each refused before any compile with the file and the
field, row or output at fault: the model card, the catalog file, the feature graph."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf
from safetensors.numpy import save_file

from tests.export.graph_weights import graph_weights
from tf_frontend.feature_graph import INPUTS, FeatureGraph
from torch_engine.model import Model
from xgr_checkpoint.catalog_file import write_catalog
from xgr_common.errors import CatalogError, ConfigError
from xgr_common.model_card import MODEL_CARD_FILE, ModelCard
from xgr_common.prompt_spec import PromptSpec
from xgr_export.config import ExportConfig
from xgr_export.export import export_saved_model, team_sources
from xgr_export.feature_graphs import save_feature_graph
from xgr_world.synthetic import WorldConfig, make_world

SPEC = PromptSpec()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A tiny checkpoint with its card, a catalog file and trained graph weights."""
    root = tmp_path_factory.mktemp("team")
    model = Model.from_preset("tiny", seed=1)
    model.save_pretrained(root / "model")
    ModelCard(SPEC, "item_causal", "qwen2", model.config.vocab_size,
              model.config.hidden_size).write(root / "model")
    world = make_world(WorldConfig(num_items=300, num_users=10))
    write_catalog(root / "catalog.parquet", world.item_ids, world.item_codes)
    save_file(graph_weights(SPEC), str(root / "graph.safetensors"))
    return {"model": str(root / "model"), "catalog": str(root / "catalog.parquet"),
            "feature_graph": str(root / "graph.safetensors"), "root": root, "world": world}


def _config(files, tmp_path, **changes) -> ExportConfig:
    values = {"out": str(tmp_path / "out"), "model": files["model"],
              "catalog": files["catalog"], "feature_graph": files["feature_graph"], **changes}
    return ExportConfig(**values)


def test_good_files_are_read_with_the_cards_contract(files, tmp_path):
    sources = team_sources(_config(files, tmp_path, verify_requests=5))
    assert sources.spec == SPEC and sources.prefill_mask.value == "item_causal"
    np.testing.assert_array_equal(sources.item_ids, files["world"].item_ids)
    assert isinstance(sources.graph, FeatureGraph)
    assert int(sources.requests["history_splits"].shape[0]) == 5 + 1


def _copy_model(files, tmp_path):
    import shutil
    folder = tmp_path / "model"
    shutil.copytree(files["model"], folder)
    return folder


def test_missing_card_is_refused_before_anything_is_built(files, tmp_path):
    folder = _copy_model(files, tmp_path)
    (folder / MODEL_CARD_FILE).unlink()
    with pytest.raises(ConfigError, match=f"has no {MODEL_CARD_FILE}"):
        export_saved_model(_config(files, tmp_path, model=str(folder)))
    assert not (tmp_path / "out").exists()


def test_card_contradicting_the_config_is_refused(files, tmp_path):
    folder = _copy_model(files, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config["hidden_size"] = 128
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="hidden_size = 64 contradicts config.json"):
        team_sources(_config(files, tmp_path, model=str(folder)))


def test_a_mask_flag_contradicting_the_card_is_refused(files, tmp_path):
    with pytest.raises(ConfigError, match="mask 'causal' contradicts .*prefill_mask "
                                          "'item_causal'"):
        team_sources(_config(files, tmp_path, mask="causal"))


def test_a_bad_catalog_file_is_refused_naming_the_row(files, tmp_path):
    world = files["world"]
    ids = world.item_ids.copy()
    ids[7] = ids[3]
    path = tmp_path / "dup.npz"
    np.savez(path, item_id=ids, codes=world.item_codes)
    with pytest.raises(CatalogError, match=r"dup.npz.*rows? 3.*7|dup.npz.*duplicate"):
        export_saved_model(_config(files, tmp_path, catalog=str(path)))


def test_a_catalog_of_other_levels_is_refused(files, tmp_path):
    world = files["world"]
    path = tmp_path / "two_levels.npz"
    np.savez(path, item_id=world.item_ids, codes=world.item_codes[:, :2])
    with pytest.raises(CatalogError, match="two_levels.npz"):
        team_sources(_config(files, tmp_path, catalog=str(path)))


@pytest.mark.parametrize("edit, rule", [
    (lambda w: w.pop("tower_bias"), r"lack \['tower_bias'\]"),
    (lambda w: w.update(table=w["table"][:10]), "table has shape"),
    (lambda w: w["tower_kernel"].__setitem__((0, 0), np.nan), "must be finite floats"),
])
def test_bad_feature_graph_weights_are_refused(files, tmp_path, edit, rule):
    weights = graph_weights(SPEC)
    edit(weights)
    path = tmp_path / "graph.safetensors"
    save_file(weights, str(path))
    with pytest.raises(ConfigError, match=rule):
        team_sources(_config(files, tmp_path, feature_graph=str(path)))


def test_a_feature_graph_of_another_kind_is_refused(files, tmp_path):
    path = tmp_path / "graph.h5"
    path.write_bytes(b"x")
    with pytest.raises(ConfigError, match="must be a .safetensors file .* or a SavedModel"):
        team_sources(_config(files, tmp_path, feature_graph=str(path)))


def test_a_saved_model_graph_with_other_inputs_is_refused(files, tmp_path):
    signature = {name: tf.TensorSpec([None], dtype, name=name)
                 for name, dtype in INPUTS.items() if name != "country"}
    module = tf.Module()
    module.serve = tf.function(lambda f: {"x": f["user_id"]}, input_signature=[signature])
    folder = str(tmp_path / "g")
    tf.saved_model.save(module, folder,
                        signatures={"serving_default": module.serve.get_concrete_function()})
    with pytest.raises(ConfigError, match="takes .*; the served pipeline feeds exactly"):
        team_sources(_config(files, tmp_path, feature_graph=folder))


def test_a_saved_model_graph_breaking_the_contract_is_refused(files, tmp_path):
    world = files["world"]
    graph = FeatureGraph(SPEC, world.item_ids, world.item_codes)

    def narrow(features):
        out = dict(graph(features))
        out["profile_embeds"] = out["profile_embeds"][:, :, :32]
        return out

    folder = str(save_feature_graph(graph, tmp_path / "g", call=narrow))
    with pytest.raises(ConfigError, match=r"'profile_embeds' has shape .*\[batch, profile_tokens"
                                          r", hidden\] = \[8, 2, 64\]"):
        team_sources(_config(files, tmp_path, feature_graph=folder))


@pytest.mark.parametrize("changes, rule", [
    ({"catalog": None}, "model and ExportConfig.catalog go together"),
    ({"feature_graph": None}, "must name the trained feature graph"),
    ({"keep_last": 20}, "keep_last is the model's"),
    ({"mask": "segment"}, "mask must be one of"),
])
def test_export_config_refuses_incomplete_team_files(files, tmp_path, changes, rule):
    with pytest.raises(ConfigError, match=rule):
        _config(files, tmp_path, **changes)
