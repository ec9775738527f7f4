"""Automatic conversion: MLP stages convert exactly (fp32 tolerance) and survive storage;
unconvertible stages are all reported together, each with its reason, and stay in TF."""

from __future__ import annotations

import numpy as np
import pytest
import toy_models

from bridge.migration.auto import auto_migrate
from bridge.migration.convert import convert_stages, format_reasons
from bridge.migration.plan import MigrationPlan, load_plan, save_plan
from bridge.migration.runner import PlanRunner
from bridge.onnx_torch.module import OnnxGraphModule
from bridge.parity.harness import run_parity

# Heavy (tf2onnx conversions of whole models): left out of `make test-quick`.
pytestmark = pytest.mark.heavy


def test_auto_converted_mlp_stages_match_tf(tmp_path):
    model = toy_models.mlp()
    plan = MigrationPlan("toy_models:mlp")
    plan, results = auto_migrate(plan, tmp_path, model, ["hidden", "norm", "middle", "head"])
    assert [r.reasons for r in results] == [()] * 4
    save_plan(plan, tmp_path / "plan.json")
    reloaded = load_plan(tmp_path / "plan.json")
    assert {s.name: s.converted for s in reloaded.torch_stages()} == {
        n: f"converted/{n}" for n in ("hidden", "norm", "middle", "head")}
    runner = PlanRunner(reloaded, tmp_path)
    assert all(isinstance(m, OnnxGraphModule) for m in runner.modules.values())
    result = run_parity(runner, toy_models.mlp_batches(2), progress=False)
    assert result.passed, result.summary()
    final = result.rows[-1]
    assert final.dtype == "float32" and final.rel_norm < 1e-6


def test_embedding_and_tanh_gelu_convert():
    model = toy_models.embedding_dense()
    results = convert_stages(model, None)
    assert {r.name: r.ok for r in results} == {"embed": True, "pool": True, "proj": True}, \
        format_reasons(results)
    ops = {n.op_type for r in results for n in r.spec.nodes}
    assert {"Gather", "Pow", "Tanh"} <= ops


def test_unconvertible_stages_are_reported_together_with_reasons():
    model = toy_models.with_unconvertible()
    results = {r.name: r for r in convert_stages(model)}
    assert results["dense_ok"].ok and results["ids"].ok
    failed = {name: " ".join(r.reasons) for name, r in results.items() if not r.ok}
    assert set(failed) == {"country_lookup", "user_lookup", "user_hash", "exact_gelu", "bucketize"}
    assert "strings cannot cross" in failed["country_lookup"]
    assert "int64->int64" in failed["user_lookup"]
    assert "hash differently" in failed["user_hash"]
    assert "Erfc" in failed["exact_gelu"] and "approximate=True" in failed["exact_gelu"]
    assert "LowerBound has no ONNX mapping" in failed["bucketize"]
    text = format_reasons(list(results.values()))
    assert text.count("stays in TF") == 5 and "dense_ok" not in text


def test_auto_migrate_moves_only_the_stages_that_convert(tmp_path):
    model = toy_models.with_unconvertible()
    plan, results = auto_migrate(MigrationPlan("toy_models:with_unconvertible"), tmp_path, model,
                                 ["exact_gelu", "dense_ok", "user_hash"])
    assert [s.name for s in plan.torch_stages()] == ["dense_ok"]
    assert sorted(p.name for p in (tmp_path / "converted").iterdir()) == ["dense_ok"]
    batch = {"country": np.array([[b"us"], [b"zz"]]), "user": np.array([[7], [99]]),
             "x": np.random.default_rng(1).normal(size=(2, toy_models.FEATURES)).astype(np.float32)}
    result = run_parity(PlanRunner(plan, tmp_path), [batch], progress=False)
    assert result.passed, result.summary()
    assert {r.dtype for r in result.rows} >= {"int64", "float32"}


def test_graph_inputs_are_put_in_call_order_and_extra_inputs_refused():
    from bridge.migration.convert import _ordered
    from bridge.onnx_torch.graph import GraphSpec, ValueInfo

    def spec(*names):
        return GraphSpec({"": 17}, tuple(ValueInfo(n, "float32", (None,)) for n in names), (), ())
    ordered, reason = _ordered(spec("in_1:0", "in_0:0"), 2)
    assert [v.name for v in ordered.inputs] == ["in_0:0", "in_1:0"] and reason == ""
    refused, reason = _ordered(spec("in_0:0", "stage/table:0"), 1)
    assert refused is None and "['stage/table'] came from captured TF state" in reason
