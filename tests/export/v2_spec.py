"""The small version 2 layout the package and prompt-cache tests share (two soft vectors, a few
text spans), in a module of its own that imports no TensorFlow: the GPU machine's tests read it
where ``custom_ops`` cannot load."""

from __future__ import annotations

from xgr_common.prompt_spec import PromptSpec
from xgr_common.prompt_v2 import HistorySplit, PromptV2Layout, TextSpans


def small_v2_spec(hidden: int) -> PromptSpec:
    return PromptSpec(model_hidden=hidden, profile_tokens=2, prompt_v2=PromptV2Layout(
        HistorySplit(100, 4, 4, 3), TextSpans(intro=(20,), before_recent=(21,),
                                              question=(22, 23))))
