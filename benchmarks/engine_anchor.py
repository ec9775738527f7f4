"""The ``transformers`` anchor of ``bench_engine.py``: Hugging Face beam search on the engine's
own weights, constrained to the same catalog through ``prefix_allowed_tokens_fn``."""

from __future__ import annotations

import statistics
import time

import numpy as np
import torch

from torch_engine.catalog import Catalog
from xgr_common.layout import TokenLayout
from torch_engine.model import Model

LAYOUT = TokenLayout()


def allowed_tokens_fn(catalog: Catalog, prompt: int):
    """``prefix_allowed_tokens_fn`` for transformers: walks the catalog's CSR on the host."""
    indptr = [t.cpu().numpy() for t in catalog.level_indptr]
    codes = [t.cpu().numpy() for t in catalog.level_codes]

    def allowed(_batch_id, input_ids):
        generated = input_ids[prompt:].tolist()
        prefix = 0
        for level, token in enumerate(generated):
            code = token - LAYOUT.level_range(level)[0]
            lo, hi = indptr[level][prefix], indptr[level][prefix + 1]
            prefix = lo + int(np.searchsorted(codes[level][lo:hi], code))
        level = len(generated)
        if level >= LAYOUT.levels:
            return [LAYOUT.eos_id]
        lo, hi = indptr[level][prefix], indptr[level][prefix + 1]
        return (codes[level][lo:hi] + LAYOUT.level_range(level)[0]).tolist()

    return allowed


def hf_model(model: Model):
    """The transformers model of the same architecture holding ``model``'s weights (names are
    equal, so the state dict loads as is; no checkpoint written)."""
    import transformers
    config = dict(model.config.to_hf_dict())
    kind = config.pop("model_type")
    config.pop("architectures")
    hf_config = transformers.AutoConfig.for_model(kind, **config)
    device = next(model.parameters()).device
    with torch.device(device):
        hf = transformers.AutoModelForCausalLM.from_config(hf_config, dtype=model.dtype
                                                           if hasattr(model, "dtype") else
                                                           next(model.parameters()).dtype)
    missing, unexpected = hf.load_state_dict(model.state_dict(), strict=False)
    missing = [k for k in missing if not k.endswith("rotary_emb.inv_freq")]
    if missing or unexpected:
        raise RuntimeError(f"state dict mismatch: missing {missing[:5]}, unexpected "
                           f"{unexpected[:5]}")
    if model.config.tie_word_embeddings:
        hf.tie_weights()
    return hf.to(next(model.parameters()).dtype).eval()


def hf_anchor(model: Model, catalog: Catalog, prompt: int, beam: int, batches: list[int],
              repeats: int, device: torch.device, warmups: int = 1) -> list[dict]:
    """Wall milliseconds of ``generate`` per batch size, or a row saying why it is absent."""
    try:
        import transformers
        hf = hf_model(model)
    except (ImportError, RuntimeError) as err:
        return [{"system": "transformers", "absent": str(err)[:300]}]
    fn = allowed_tokens_fn(catalog, prompt)
    rows = []
    for batch in batches:
        tokens = torch.randint(LAYOUT.code_base, LAYOUT.code_end, (batch, prompt),
                               generator=torch.Generator().manual_seed(3)).to(device)

        def call():
            with torch.no_grad():
                return hf.generate(tokens, attention_mask=torch.ones_like(tokens),
                                   num_beams=beam, max_new_tokens=LAYOUT.levels,
                                   min_new_tokens=LAYOUT.levels, do_sample=False,
                                   prefix_allowed_tokens_fn=fn, pad_token_id=LAYOUT.pad_id,
                                   eos_token_id=LAYOUT.eos_id)
        try:
            for _ in range(warmups):
                call()
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                call()
                if device.type == "cuda":
                    torch.cuda.synchronize()
                times.append((time.perf_counter() - start) * 1e3)
        except torch.cuda.OutOfMemoryError as err:
            rows.append({"system": "transformers", "batch": batch, "absent": f"OOM: {err}"[:200]})
            torch.cuda.empty_cache()
            continue
        rows.append({"system": f"transformers {transformers.__version__} "
                               f"({model.config.architecture}, prompt {prompt})",
                     "batch": batch, "median_ms": statistics.median(times),
                     "p99_ms": max(times), "calls": len(times)})
    del hf
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return rows
