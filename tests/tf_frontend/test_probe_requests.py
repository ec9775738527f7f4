"""The export's probe requests (``xgr_export.probe_requests``) reach the longest prompt and the
widest exclusion row each prompt version's feature graph can emit, so an export's checks and
warm-up run the sizes a served request can send, not only short ones."""

from dataclasses import replace

import numpy as np
import pytest

from tests.tf_frontend.conftest import SPEC
from tf_frontend.rules import history_exclusion
from xgr_common.prompt_v2 import HistorySplit, PromptV2Layout, TextSpans
from xgr_export.feature_graphs import load_feature_graph
from xgr_export.probe_requests import probe_features

DAY = 86400
V2 = replace(SPEC, prompt_v2=PromptV2Layout(HistorySplit(DAY, 6, 9, 4),
                                            TextSpans(intro=(3,), question=(2,))))
# keep_last (6) below the version 2 history (13): the history bound is the split's, not it.
V2_CUT_AT_ONE_BLOCK = replace(SPEC, prompt_v2=PromptV2Layout(HistorySplit(DAY, 1, 5, 2)))


@pytest.mark.parametrize("spec", [SPEC, V2, V2_CUT_AT_ONE_BLOCK], ids=["v1", "v2", "v2-one-block"])
def test_the_second_probe_fills_the_longest_prompt(spec, world, catalog_rows):
    ids, codes = world.item_ids[catalog_rows], world.item_codes[catalog_rows]
    graph = load_feature_graph(None, spec, ids, codes)
    probes = probe_features(ids, spec, 5, seed=2)
    out = graph(probes)
    lengths = out["lengths"].numpy()
    assert lengths[1] == spec.max_prompt_tokens == lengths.max()
    splits = out["history_splits"].numpy()
    assert splits[2] - splits[1] == spec.max_history_items
    assert splits[1] == splits[0]                       # the first probe has no history
    exclude = history_exclusion(out["history_values"], out["history_splits"])
    assert exclude.shape[1] == spec.max_history_items + 1
    # More events than the prompt keeps were sent: the cut is exercised too.
    sent = probes["history_splits"].numpy()
    assert sent[2] - sent[1] > spec.max_history_items


def test_the_history_bound_of_each_version():
    assert SPEC.max_history_items == SPEC.keep_last == 6
    assert V2.max_history_items == 9 + 4
    # Other seeds still put the full request second and keep the first empty.
    for seed in range(4):
        sent = probe_features(np.arange(50, 90), V2, 3, seed)["history_splits"].numpy()
        assert sent[1] == 0 and sent[2] - sent[1] == V2.max_history_items + 2
