"""The version 2 feature graph (``tf_frontend.feature_graph_v2``) against the Torch twins of
its ops composed by hand, the frozen prefix unchanged across one user's requests inside a time
block, and the graph refusing a model of the other prompt version."""

from dataclasses import replace

import numpy as np
import pytest
import tensorflow as tf
import torch

from custom_ops.torch_twins import assemble_prompt_v2, split_history
from custom_ops.torch_twins.semantic_ids import TorchSemanticIdTable, semantic_id_lookup
from tests.tf_frontend.conftest import SPEC
from tf_frontend.feature_graph import FeatureGraph, features_from_world
from tf_frontend.feature_graph_v2 import OUTPUTS_V2, STAGES_V2, FeatureGraphV2
from xgr_common.errors import ConfigError
from xgr_common.prompt_v2 import HistorySplit, PromptV2Layout, TextSpans

DAY = 86400
V2 = replace(SPEC, prompt_v2=PromptV2Layout(HistorySplit(3 * DAY, 4, 5, 3),
                                            TextSpans(intro=(3,), before_recent=(2, 3),
                                                      question=(2,))))


@pytest.fixture(scope="module")
def graph_v2(world, catalog_rows, weights):
    return FeatureGraphV2(V2, world.item_ids[catalog_rows], world.item_codes[catalog_rows],
                          embedding_table=weights["embedding_table"],
                          tower_weights=weights["tower_weights"])


def _twins(world, catalog_rows, features, context_tokens):
    """The graph's prompt outputs from the Torch twins of its ops."""
    t = {k: torch.from_numpy(v.numpy()) for k, v in features.items() if k != "country"}
    part = split_history(t["history_items"], t["history_times"], t["history_splits"],
                         t["request_time"], **V2.prompt_v2.split.as_attrs())
    table = TorchSemanticIdTable(world.item_ids[catalog_rows], world.item_codes[catalog_rows],
                                 V2.layout.codebook_size)
    base = V2.layout.code_base
    long = semantic_id_lookup(table, part.long_values, part.long_row_splits, code_base=base)
    recent = semantic_id_lookup(table, part.recent_values, part.recent_row_splits,
                                code_base=base)
    layout = V2.layout
    prompt = assemble_prompt_v2(
        long.code_tokens, long.row_splits, torch.from_numpy(context_tokens),
        recent.code_tokens, recent.row_splits, bos_id=layout.bos_id,
        profile_start_id=layout.profile_start_id, item_start_id=layout.item_start_id,
        soft_id=layout.soft_id, pad_id=layout.pad_id, soft_tokens=V2.profile_tokens,
        max_length=V2.max_prompt_tokens, **V2.prompt_v2.spans.as_attrs())
    known = set(world.item_ids[catalog_rows].tolist())
    seen, splits = [], [0]
    for row in range(len(t["request_time"])):
        for values, cut in ((part.long_values, part.long_row_splits),
                            (part.recent_values, part.recent_row_splits)):
            seen += [v for v in values[cut[row]:cut[row + 1]].tolist() if v in known]
        splits.append(len(seen))
    return {"token_ids": prompt.token_ids, "lengths": prompt.lengths,
            "segment_ids": prompt.segment_ids, "frozen_lengths": prompt.frozen_lengths,
            "history_values": torch.tensor(seen, dtype=torch.int64),
            "history_splits": torch.tensor(splits, dtype=torch.int64),
            "unknown_items": long.unknown_count + recent.unknown_count}


def test_outputs_equal_the_twins_composed(graph_v2, world, catalog_rows):
    features = features_from_world(world, slice(None))
    out = graph_v2(features)
    assert sorted(out) == sorted(OUTPUTS_V2)
    assert out["token_ids"].shape == (len(world.user_ids), V2.max_prompt_tokens)
    context = out["token_ids"].numpy()  # the context token follows PROFILE_START in each row
    at = np.argmax(context == V2.layout.profile_start_id, axis=1)
    context_tokens = context[np.arange(len(at)), at + 1][:, None].astype(np.int64)
    want = _twins(world, catalog_rows, features, context_tokens)
    for name, value in want.items():
        assert np.array_equal(out[name].numpy(), value.numpy()), name
    # Every row holds its soft markers, and some rows have unknown items and a long-term part.
    markers = (out["token_ids"].numpy() == V2.layout.soft_id).sum(axis=1)
    assert (markers == V2.profile_tokens).all()
    assert out["unknown_items"].numpy().sum() > 0
    assert (out["frozen_lengths"].numpy() > 2).any()


def test_the_frozen_prefix_stays_while_the_block_is_open(graph_v2, world):
    """Two requests of one user in one time block, with different recent events, country
    and request time: the frozen prefix's tokens and segments are bit-identical."""
    features = {k: v.numpy() for k, v in features_from_world(world, [5]).items()}
    block = V2.prompt_v2.split.block_seconds
    start = (int(features["request_time"][0]) // block) * block
    later = dict(features)
    later["request_time"] = np.array([start + block - 1], np.int64)
    later["history_items"] = np.concatenate([features["history_items"],
                                             world.item_ids[[1, 2]]])
    later["history_times"] = np.concatenate([features["history_times"],
                                             [start + block - 3, start + block - 2]])
    later["history_splits"] = np.array([0, len(later["history_items"])], np.int64)
    later["country"] = np.array([b"zz"], dtype=object)
    first, second = graph_v2({k: tf.constant(v) for k, v in features.items()}), \
        graph_v2({k: tf.constant(v) for k, v in later.items()})
    frozen = int(first["frozen_lengths"][0])
    assert frozen == int(second["frozen_lengths"][0]) and frozen > 2
    for name in ("token_ids", "segment_ids"):
        assert np.array_equal(first[name][0, :frozen], second[name][0, :frozen]), name
    # The rest of the prompt did change: the recent part and the context.
    assert not np.array_equal(first["token_ids"][0], second["token_ids"][0])


def test_stages_are_named_and_the_other_version_refused(graph_v2, world, catalog_rows):
    assert tuple(layer.name for layer in graph_v2.layers) == STAGES_V2
    assert graph_v2.stage("split_history").split == V2.prompt_v2.split
    ids, codes = world.item_ids[catalog_rows], world.item_codes[catalog_rows]
    with pytest.raises(ConfigError, match="FeatureGraphV2 .* needs prompt version 2; .* says "
                                          "version 1"):
        FeatureGraphV2(SPEC, ids, codes)
    with pytest.raises(ConfigError, match="FeatureGraph .* needs prompt version 1"):
        FeatureGraph(V2, ids, codes)


def test_the_saved_graph_serves_the_version_2_outputs(graph_v2, world, tmp_path):
    from tf_frontend.saved_model import export_feature_graph, load_saved_model

    path = export_feature_graph(graph_v2, tmp_path / "graph_v2")
    loaded = load_saved_model(path)     # held: its table resource lives as long as it does
    serve = loaded.signatures["serving_default"]
    assert sorted(serve.structured_outputs) == sorted(OUTPUTS_V2)
    features = features_from_world(world, [0, 3, 7])
    got, want = serve(**features), graph_v2(features)
    for name in ("token_ids", "lengths", "segment_ids", "frozen_lengths", "history_values",
                 "history_splits", "unknown_items"):
        assert np.array_equal(got[name].numpy(), want[name].numpy()), name


def test_the_export_builds_and_checks_the_graph_of_the_cards_version(world, catalog_rows):
    from xgr_export.feature_graphs import check_contract, load_feature_graph

    ids, codes = world.item_ids[catalog_rows], world.item_codes[catalog_rows]
    graph = load_feature_graph(None, V2, ids, codes)
    assert isinstance(graph, FeatureGraphV2)
    assert type(load_feature_graph(None, SPEC, ids, codes)) is FeatureGraph
    features = features_from_world(world, [0, 1])
    vocab = V2.layout.code_end
    check_contract(graph, features, V2, vocab)

    def without(name):
        return lambda f: {k: v for k, v in graph(f).items() if k != name}

    with pytest.raises(ConfigError, match="lacks the outputs \\['frozen_lengths'\\].*prompt "
                                          "version 2"):
        check_contract(without("frozen_lengths"), features, V2, vocab)

    def one_marker(f):
        out = dict(graph(f))
        tokens = out["token_ids"].numpy()
        first = np.argmax(tokens == V2.layout.soft_id, axis=1)
        tokens[np.arange(len(first)), first] = V2.layout.pad_id + 1
        return {**out, "token_ids": tf.constant(tokens)}

    with pytest.raises(ConfigError, match="rows with \\[1\\] SOFT markers .* needs "
                                          "profile_tokens = 2"):
        check_contract(one_marker, features, V2, vocab)
