"""Probe: can one exported search serve every beam width, the width a dynamic dimension?

    TRITON_INTERPRET=1 python -m experiments.probe_dynamic_beam_width

Traces ``torch_engine.search.search_features`` with the beam width read from the length of
an extra input (``width [W]``, its values unused), ``Dim.DYNAMIC`` on it, over the tiny
preset and a small catalog on the CPU; prints the width range torch.export derived and, per
width in that range, whether the exported program's items equal ``Engine.recommend`` at that
width. If it holds, per-request widths need one package (the weights once) whose runtime
captures one graph per (rows, length, exclusions, width) bucket, and a batcher that groups
requests by width.
"""

from __future__ import annotations

import numpy as np
import torch

import torch_engine.kernels  # noqa: F401  (registers the xgr ops)
from torch_engine.catalog import Catalog
from torch_engine.config import PRESETS, EngineConfig
from torch_engine.engine import Engine
from torch_engine.model import Model
from torch_engine.search import search_features
from xgr_common.prompt_spec import PromptSpec
from xgr_export.engine_package import example_inputs

TOP_K = 10


class WidthProgram(torch.nn.Module):
    def __init__(self, engine):
        super().__init__()
        self.engine, self.model = engine, engine.model

    def forward(self, token_ids, lengths, segment_ids, profile_embeds, exclude_items, width):
        items, scores, _ = search_features(
            self.model, self.engine.catalog, token_ids, lengths, segment_ids, profile_embeds,
            exclude_items, width.shape[0], TOP_K, self.engine.options)
        return items, scores


def main() -> None:
    model = Model(PRESETS["tiny"])
    model.init_weights(0)
    rng = np.random.default_rng(1)
    ids = rng.choice(np.arange(10_000), size=300, replace=False).astype(np.int64)
    engine = Engine(model.eval(), Catalog.from_arrays(ids, rng.integers(0, 8, (300, 3))),
                    EngineConfig(cuda_graphs=False))
    spec = PromptSpec(model_hidden=model.config.hidden_size, keep_last=3)
    args = example_inputs(engine, spec) + (torch.zeros(16, dtype=torch.int8),)
    batch, dynamic = torch.export.Dim("batch", min=1, max=8), torch.export.Dim.DYNAMIC
    program = torch.export.export(
        WidthProgram(engine), args, strict=False,
        dynamic_shapes=({0: batch, 1: dynamic}, {0: batch}, {0: batch, 1: dynamic}, {0: batch},
                        {0: batch, 1: torch.export.Dim("exclude", min=1, max=8)},
                        {0: dynamic}))
    width_input = [n for n in program.graph.nodes if n.op == "placeholder"][-1]
    symbol = width_input.meta["val"].shape[0].node.expr
    span = program.range_constraints[symbol]
    low, high = int(span.lower), int(span.upper)
    print(f"traced; the width's range as torch.export derived it: [{low}, {high}]")
    gen = torch.Generator().manual_seed(9)
    tokens = torch.randint(8, model.config.vocab_size - 8, (2, 12), generator=gen,
                           dtype=torch.int32)
    lengths = torch.tensor([7, 12], dtype=torch.int32)
    segments = torch.arange(12, dtype=torch.int32).div(4, rounding_mode="floor").expand(2, 12)
    soft = torch.randn(2, spec.profile_tokens, model.config.hidden_size, generator=gen)
    exclude = torch.tensor([[int(ids[1]), -1]] * 2)
    for width in (low - 1, low, 2 * low, (low + high) // 2, high, high + 1):
        try:
            got = program.module()(tokens, lengths, segments.contiguous(), soft, exclude,
                                   torch.zeros(width, dtype=torch.int8))
        except AssertionError as err:   # outside the traced range
            print(f"width {width}: {err}")
            continue
        want = engine.recommend(tokens, lengths, segments, beam_width=width, top_k=TOP_K,
                                prefix_embeds=soft, exclude_items=exclude)
        print(f"width {width}: items equal {torch.equal(got[0], want[0])}, "
              f"largest score difference {(got[1] - want[1]).abs().max().item():.2e}")


if __name__ == "__main__":
    main()
