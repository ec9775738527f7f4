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


def checked_batch(engine, token_ids, lengths, segment_ids, beam_width, top_k,
                  prefix_embeds=None, exclude_items=None):
    """What the eager runner searches: the arguments checked on the host
    (``checks.check_arguments``), the value rules on the tokens' device
    (``search.sanitise`` with ``runner.rules_for``) and their verdict read (raising for an
    invalid batch). Returns the sanitised ``search.RequestBatch`` on the engine's device."""
    from torch_engine import search
    from torch_engine.checks import Verdict, check_arguments
    from torch_engine.runner import rules_for

    args = check_arguments(engine.limits, token_ids, lengths, segment_ids, beam_width, top_k,
                           prefix_embeds, exclude_items)
    cfg = engine.model.config
    batch, flags = search.sanitise(args.token_ids, args.lengths, args.segment_ids,
                                   args.prefix_embeds, args.exclude_items, cfg.vocab_size,
                                   rules_for(args.token_ids.device))
    Verdict.of(args, flags, cfg.vocab_size, engine.catalog.levels,
               cfg.max_position).raise_if_invalid()
    return batch.to(engine.device)
