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


def v2_prompts(users, layout, soft_tokens=2, intro=(20, 21), before_profile=(22,),
               question=(23,), code_of=None, before_recent=()):
    """A right-padded v2 prompt batch (``xgr_common.prompt_v2``) built without TensorFlow,
    as ``XgrAssemblePromptV2`` lays it out (``tests/torch_engine/test_prompt_v2.py`` checks
    it against the op's twin): ``users`` holds (long-term items, recent items, context
    token offset) per row; ``code_of(item, level)`` gives an item's code (default: item x 7
    + level). Returns token_ids int32 ``[B, L]`` (pad 0), lengths, segment_ids (-1 on
    padding) and frozen_lengths, each a tensor."""
    code_of = code_of or (lambda item, level: (item * 7 + level) % layout.codebook_size)
    rows, segs, frozen = [], [], []
    for long_items, recent_items, context in users:
        tokens = [layout.bos_id, *intro]
        seg = [0] * len(tokens)

        def item(number, segment):
            tokens.extend([layout.item_start_id] + [
                layout.code_token(level, 0) + code_of(number, level)
                for level in range(layout.levels)])
            seg.extend([segment] * (1 + layout.levels))

        for k, number in enumerate(long_items):
            item(number, k + 1)
        frozen.append(len(tokens))
        profile = len(long_items) + 1
        part = [*before_profile, *[layout.soft_id] * soft_tokens, layout.profile_start_id,
                layout.profile_base + 1 + context, *before_recent]
        tokens.extend(part)
        seg.extend([profile] * len(part))
        for k, number in enumerate(recent_items):
            item(number, profile + 1 + k)
        last = [*question, layout.item_start_id]
        tokens.extend(last)
        seg.extend([profile + 1 + len(recent_items)] * len(last))
        rows.append(tokens)
        segs.append(seg)
    width = max(len(r) for r in rows)
    token_ids = torch.zeros((len(rows), width), dtype=torch.int32)
    segment_ids = torch.full((len(rows), width), -1, dtype=torch.int32)
    for b, (tokens, seg) in enumerate(zip(rows, segs)):
        token_ids[b, :len(tokens)] = torch.tensor(tokens)
        segment_ids[b, :len(seg)] = torch.tensor(seg)
    return (token_ids, torch.tensor([len(r) for r in rows], dtype=torch.int32), segment_ids,
            torch.tensor(frozen, dtype=torch.int32))
