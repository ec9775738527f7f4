"""Version 2 prompts for the engine-package tests: rows built by the assembly op's twin from a
catalog's code paths (the small layout is ``tests/export/v2_spec.py``). Shared by the
package tests and the TorchCall prompt-cache tests (a helper module, not a test module, so a
machine without TensorFlow skips its importers cleanly)."""

from __future__ import annotations

import torch

from custom_ops.torch_twins import assemble_prompt_v2
from xgr_common.prompt_spec import PromptSpec


def v2_rows(spec: PromptSpec, catalog_codes, long_counts, recent_counts):
    """Version 2 rows from the assembly op's twin: each row's items from the catalog's own
    code paths, padded to the longest row the layout allows."""
    layout = spec.layout
    codes = torch.tensor(catalog_codes, dtype=torch.int64)
    tokens = codes + torch.tensor([layout.code_token(level, 0) for level in range(3)])

    def part(counts, offset):
        items = torch.cat([tokens[offset + 3 * row: offset + 3 * row + n]
                           for row, n in enumerate(counts)])
        splits = torch.tensor([0, *torch.tensor(counts).cumsum(0).tolist()])
        return items, splits

    long, long_splits = part(long_counts, 0)
    recent, recent_splits = part(recent_counts, 20)
    context = torch.tensor([[spec.context_token(k)] for k in range(len(long_counts))])
    return assemble_prompt_v2(
        long, long_splits, context, recent, recent_splits, bos_id=layout.bos_id,
        profile_start_id=layout.profile_start_id, item_start_id=layout.item_start_id,
        soft_id=layout.soft_id, pad_id=layout.pad_id, soft_tokens=spec.profile_tokens,
        max_length=spec.max_prompt_tokens, **spec.prompt_v2.spans.as_attrs())
