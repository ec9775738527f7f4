"""Small catalogs and prompt batches that the engine tests share."""

import numpy as np
import torch


def small_world(seed=0, n=60, used_codes=5):
    """``n`` item ids and their 3-code paths over ``used_codes`` codes a level."""
    rng = np.random.default_rng(seed)
    ids = rng.choice(np.arange(1000, 1000 + 20 * n), size=n, replace=False).astype(np.int64)
    codes = rng.integers(0, used_codes, (n, 3)).astype(np.int32)
    return ids, codes


def prompts(seed, lengths, width=None, segmented=True):
    """Random tokens ``[B, width]``, the lengths, and segment ids that start a new item at
    about one token in four (None unless ``segmented``)."""
    gen = torch.Generator().manual_seed(seed)
    width = width or max(lengths)
    tokens = torch.randint(8, 1024, (len(lengths), width), generator=gen)
    segs = torch.zeros(len(lengths), width, dtype=torch.int32)
    for row in range(len(lengths)):
        steps = (torch.rand(width, generator=gen) < 0.25).to(torch.int32)
        steps[0] = 0
        segs[row] = torch.cumsum(steps, 0)
    return tokens, torch.tensor(lengths), (segs if segmented else None)
