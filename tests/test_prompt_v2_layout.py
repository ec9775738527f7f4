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
