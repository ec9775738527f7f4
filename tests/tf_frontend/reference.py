"""A plain NumPy/Python reference of the feature graph, written from the PromptSpec contract."""

import numpy as np

from xgr_common.layout import PAD_SEGMENT


def clean_row(items, times, request_time, window_seconds, keep_last):
    """Window filter (drop t > request or t < request - window), collapse runs, keep last N."""
    kept = [(v, t) for v, t in zip(items, times)
            if request_time - window_seconds <= t <= request_time]
    runs = []
    for v, t in kept:
        if runs and runs[-1][0] == v:
            runs[-1] = (v, t)
        else:
            runs.append((v, t))
    return [v for v, _ in runs[-keep_last:]]


def prompt_row(spec, context_token, codes_of_items):
    """Token and segment rows of one request, right-padded to spec.max_prompt_tokens."""
    layout = spec.layout
    tokens = [layout.bos_id, layout.profile_start_id, context_token]
    segments = [0, 0, 0]
    for k, codes in enumerate(codes_of_items, start=1):
        tokens += [layout.item_start_id] + [layout.code_token(lvl, int(c))
                                            for lvl, c in enumerate(codes)]
        segments += [k] * (1 + layout.levels)
    tokens.append(layout.item_start_id)
    segments.append(len(codes_of_items) + 1)
    length = len(tokens)
    pad = spec.max_prompt_tokens - length
    return tokens + [layout.pad_id] * pad, segments + [PAD_SEGMENT] * pad, length


def reference_outputs(spec, catalog: dict, features: dict) -> dict:
    """The id outputs of the graph for ``features`` (NumPy arrays), row by row."""
    splits = features["history_splits"]
    out = {"token_ids": [], "segment_ids": [], "lengths": [], "history_values": [],
           "history_splits": [0], "unknown_items": []}
    for b, country in enumerate(features["country"]):
        lo, hi = splits[b], splits[b + 1]
        cleaned = clean_row(features["history_items"][lo:hi], features["history_times"][lo:hi],
                            features["request_time"][b], spec.window_seconds, spec.keep_last)
        known = [v for v in cleaned if v in catalog]
        vocab = list(spec.context_vocab)
        index = vocab.index(country.decode()) if country.decode() in vocab else -1
        tokens, segments, length = prompt_row(spec, spec.context_token(index),
                                              [catalog[v] for v in known])
        out["token_ids"].append(tokens)
        out["segment_ids"].append(segments)
        out["lengths"].append(length)
        out["history_values"] += known
        out["history_splits"].append(out["history_splits"][-1] + len(known))
        out["unknown_items"].append(len(cleaned) - len(known))
    return {k: np.asarray(v) for k, v in out.items()}


def profile_embeds(spec, table, weights, profile_ids):
    """float64: embeddings [user | country] -> silu(x W1 + b1) W2 + b2 -> [B, S, hidden]."""
    x = np.concatenate([table[profile_ids[:, 0]], table[profile_ids[:, 1]]], axis=1)
    (w1, b1), (w2, b2) = weights["profile_tower"], weights["profile_projection"]
    h = x @ w1 + b1
    h = h / (1.0 + np.exp(-h))
    return (h @ w2 + b2).reshape(-1, spec.profile_tokens, spec.model_hidden)
