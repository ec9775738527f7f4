"""The helpers behind ``bench_engine --stages=floor`` and ``experiments.probe_search_bound``: the
passes of one search, the chain of its matrix products and its hooks, and the power sampler's
parsing. CPU only (the stage and the probe time CUDA graphs)."""

from __future__ import annotations

import torch

from benchmarks import engine_analysis as ea
from benchmarks.power_sampler import POWER_CAP_BIT, PowerSampler, _parse
from torch_engine.config import preset


def test_search_passes_follow_the_engine_order():
    cfg = preset("qwen2-0.5b")
    passes = ea.search_passes(cfg, batch=2, prompt_rows=2 * 64, width=4, levels=3)
    layers = cfg.num_layers
    assert len(passes) == 3 * layers
    # Prefill over every bucket row, its last layer past q/k/v on one row per request.
    assert passes[:layers - 1] == [(128, 128)] * (layers - 1)
    assert passes[layers - 1] == (128, 2)
    assert passes[layers:] == [(8, 8)] * (2 * layers)


def test_products_chain_counts_and_runs_every_product():
    cfg = preset("tiny")
    passes = ea.search_passes(cfg, batch=1, prompt_rows=16, width=4, levels=2)
    chain = ea.products_chain(cfg, passes, [1, 4], torch.device("cpu"))
    flops = chain.flops
    shapes = ea.linear_shapes(cfg)
    per_row = {name: n * k for name, (n, k) in shapes.items()}
    rest = per_row["o_proj"] + per_row["gate_up"] + per_row["down"]
    want = sum(2 * q * per_row["qkv"] + 2 * r * rest for q, r in passes)
    want += 2 * 5 * per_row["level logits"]
    assert flops == want
    # The floors' count runs the prefill's last layer on every row: the chain's products are
    # that count less the last layer's output / MLP rows past the one per request, plus logits.
    params = ea.layer_params(cfg)
    skipped = 2 * (16 - 1) * rest
    assert flops == 2 * params * (16 + 4) - skipped + 2 * 5 * per_row["level logits"]
    # The residual adds land in the chain's stream: a run changes it, and nothing is NaN.
    before = chain.stream.clone()
    chain.run()
    assert not torch.equal(before, chain.stream)
    assert torch.isfinite(chain.stream.float()).all()


def test_power_sampler_parses_and_summarises():
    assert _parse("1560, 690.31, 700.00, 0x0000000000000004") == [(1560.0, 690.31, 700.0, 4)]
    assert _parse("[N/A], [N/A], 700.00, 0x1") == []
    assert _parse("") == []
    sampler = PowerSampler()
    sampler.samples = [(345.0, 104.0, 700.0, 0x1), (1500.0, 690.0, 700.0, POWER_CAP_BIT),
                       (1600.0, 680.0, 700.0, 0x0), (1550.0, 695.0, 700.0, POWER_CAP_BIT)]
    summary = sampler.summary()
    assert summary["sm_clock_mhz"] == 1550.0          # idle sample left out
    assert summary["power_w"] == 690.0
    assert summary["power_capped_share"] == 2 / 3
    assert summary["power_samples"] == 3
    assert PowerSampler().summary() == {}


def test_products_chain_hooks_run_where_the_engine_has_them():
    """``after_qkv`` once per pass after its q/k/v product; ``after_gate_up`` gets that pass's
    gate/up rows and residual rows, and the down product reads what it returns."""
    cfg = preset("tiny")
    passes = ea.search_passes(cfg, batch=1, prompt_rows=8, width=2, levels=2)
    seen, shapes = [], []

    def after_gate_up(i, gate_up, x):
        shapes.append((i, tuple(gate_up.shape), tuple(x.shape)))
        return torch.zeros(gate_up.shape[0], cfg.intermediate_size, dtype=gate_up.dtype)
    chain = ea.products_chain(cfg, passes, [1, 2], torch.device("cpu"), after_qkv=seen.append,
                              after_gate_up=after_gate_up)
    chain.run()
    assert seen == list(range(len(passes)))
    inter, hidden = cfg.intermediate_size, cfg.hidden_size
    assert shapes == [(i, (rest, 2 * inter), (rest, hidden)) for i, (_, rest) in
                      enumerate(passes)]
    # The down product reads the hook's activation: NaN rows poison the residual rows.
    poisoned = ea.products_chain(
        cfg, passes, [1, 2], torch.device("cpu"),
        after_gate_up=lambda i, gate_up, x: torch.full(
            (gate_up.shape[0], inter), float("nan"), dtype=gate_up.dtype))
    poisoned.run()
    assert torch.isnan(poisoned.stream[:passes[0][1]].float()).all()
