"""The v2 prompt layout's contract object: checks, JSON round trip, refusal of another
version, and the longest row it promises matching what the assembly op emits."""

import numpy as np
import pytest
import torch

from custom_ops.torch_twins import assemble_prompt_v2, split_history
from xgr_common.errors import ConfigError
from xgr_common.layout import TokenLayout
from xgr_common.prompt_v2 import HistorySplit, PromptV2Layout, TextSpans

LAYOUT = TokenLayout()


def test_round_trip_and_refusals():
    layout = PromptV2Layout(HistorySplit(3600, 24, 30, 10), TextSpans(intro=(7, 8), question=(9,)))
    assert PromptV2Layout.from_dict(layout.to_dict()) == layout
    with pytest.raises(ConfigError, match="version 1"):
        PromptV2Layout.from_dict({**layout.to_dict(), "version": 1})
    with pytest.raises(ConfigError, match="lacks fields"):
        PromptV2Layout.from_dict({"version": 2, "split": {}, "spans": layout.to_dict()["spans"]})
    with pytest.raises(ConfigError, match="recent_items"):
        HistorySplit(recent_items=0)
    with pytest.raises(ConfigError, match="intro"):
        TextSpans(intro=(-1,))


def test_the_longest_row_is_what_the_op_emits_at_the_budgets():
    layout = PromptV2Layout(HistorySplit(100, 5, 4, 3), TextSpans(intro=(7,), before_profile=(8,),
                                                                 question=(9, 10)))
    times = np.arange(0, 1000, 7, dtype=np.int64)
    part = split_history(torch.arange(times.size), torch.from_numpy(times),
                         torch.tensor([0, times.size]), torch.tensor([995]),
                         **layout.split.as_attrs())
    codes = lambda v: torch.stack([v * 0 + LAYOUT.code_token(level, 1) for level in range(3)], 1)
    out = assemble_prompt_v2(codes(part.long_values), part.long_row_splits,
                             torch.tensor([[LAYOUT.profile_base + 1]]), codes(part.recent_values),
                             part.recent_row_splits, bos_id=1, profile_start_id=5,
                             item_start_id=4, soft_id=LAYOUT.soft_id, pad_id=0, soft_tokens=2,
                             **layout.spans.as_attrs())
    assert part.long_values.numel() == 4 and part.recent_values.numel() == 3
    assert int(out.lengths[0]) == layout.max_prompt_tokens(levels=3, soft_tokens=2,
                                                           context_tokens=1)


# ------------------------------------------------------------ the layout in the prompt spec
def test_a_spec_without_the_layout_is_version_1_and_its_json_unchanged():
    from xgr_common.prompt_spec import PromptSpec

    spec = PromptSpec(keep_last=40, profile_tokens=2)
    data = spec.to_dict()
    # The JSON a version 1 card has always held: no key for version 2.
    assert sorted(data) == ["context_vocab", "embedding_buckets", "embedding_dim", "keep_last",
                            "layout", "model_hidden", "profile_tokens", "tower_hidden",
                            "window_seconds"]
    assert spec.version == 1 and PromptSpec.from_dict(data) == spec
    assert spec.max_prompt_tokens == 3 + 40 * 4 + 1


def test_a_spec_with_the_layout_is_version_2_through_json():
    from xgr_common.prompt_spec import PromptSpec

    layout = PromptV2Layout(HistorySplit(3600, 24, 30, 10), TextSpans(intro=(7, 8)))
    spec = PromptSpec(profile_tokens=2, prompt_v2=layout)
    back = PromptSpec.from_dict(spec.to_dict())
    assert back == spec and back.version == 2 and back.prompt_v2 == layout
    assert spec.max_prompt_tokens == layout.max_prompt_tokens(3, 2, 1)
    with pytest.raises(ConfigError, match="version 1"):
        PromptSpec.from_dict({**spec.to_dict(), "prompt_v2": {**layout.to_dict(), "version": 1}})
    with pytest.raises(ConfigError, match="unknown prompt spec fields \\['prompt_v3'\\]"):
        PromptSpec.from_dict({**spec.to_dict(), "prompt_v3": {}})
    with pytest.raises(ConfigError, match="prompt_v2 must be a PromptV2Layout"):
        PromptSpec(prompt_v2=layout.to_dict())


def test_a_model_in_the_other_version_is_refused_naming_both():
    from xgr_common.prompt_spec import PromptSpec

    v1, v2 = PromptSpec(), PromptSpec(prompt_v2=PromptV2Layout())
    v1.require_version(1, "the feature graph")
    v2.require_version(2, "the v2 feature graph")
    with pytest.raises(ConfigError, match="the v2 feature graph needs prompt version 2; this "
                                          "model's card \\(prompt_spec\\) says version 1"):
        v1.require_version(2, "the v2 feature graph")
    with pytest.raises(ConfigError, match="needs prompt version 1; .* says version 2"):
        v2.require_version(1, "the feature graph")


def test_a_model_card_carries_the_layout():
    from xgr_common.model_card import ModelCard
    from xgr_common.prompt_spec import PromptSpec

    spec = PromptSpec(model_hidden=64, prompt_v2=PromptV2Layout(spans=TextSpans(question=(5,))))
    card = ModelCard(spec=spec, prefill_mask="item_causal", architecture="qwen2",
                     vocab_size=spec.layout.code_end, hidden_size=64)
    assert ModelCard.from_json(card.to_json()).spec.prompt_v2 == spec.prompt_v2


def test_prompt_text_encodes_by_the_given_tokenizer_within_the_text_vocabulary():
    from xgr_common.prompt_v2 import PromptText

    words = {"next": [5, 6], "item": [7], "sid": [300]}
    text = PromptText(intro="next", question="item")
    spans = text.encode(lambda t: words[t], text_vocab=100)
    assert spans == TextSpans(intro=(5, 6), question=(7,))
    with pytest.raises(ConfigError, match="prompt text question 'sid' encodes to ids \\[300\\], "
                                          "some outside the text vocabulary \\[0, 100\\)"):
        PromptText(question="sid").encode(lambda t: words[t], text_vocab=100)
    with pytest.raises(ConfigError, match="prompt text intro must be a string"):
        PromptText(intro=3)

