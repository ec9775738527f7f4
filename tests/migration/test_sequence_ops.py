"""Segment sums, ragged pooling, sparse lookups, masked attention, top-k and unique convert
through the new ONNX converters and keep parity on batches of other sizes; an op without a
converter is reported once, with its node count."""

from __future__ import annotations

import pytest
import sequence_ops_models as models

from bridge.migration.auto import auto_migrate
from bridge.migration.convert import format_reasons
from bridge.migration.plan import MigrationPlan
from bridge.parity.pytest_helper import check_parity

# Heavy (tf2onnx conversions): left out of `make test-quick`.
pytestmark = pytest.mark.heavy

CONVERTIBLE = ["ragged_sum", "segment_mean", "sparse_lookup", "masked_attention", "top_items",
               "distinct_ids", "row_splits_from_lengths"]


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    plan_dir = tmp_path_factory.mktemp("pooling")
    plan, results = auto_migrate(MigrationPlan("sequence_ops_models:pooling_ops"), plan_dir,
                                 models.pooling_ops(), CONVERTIBLE + ["two_cosines"],
                                 models.pooling_batch())
    return plan, plan_dir, {r.name: r for r in results}


@pytest.mark.parametrize("stage, ops", [
    ("ragged_sum", {"ScatterND", "Range"}), ("row_splits_from_lengths", {"CumSum", "Pad"}), ("segment_mean", {"ScatterND"}),
    ("sparse_lookup", {"Unique", "GatherND", "NonZero"}), ("masked_attention", {"Softmax"}),
    ("top_items", {"TopK"}), ("distinct_ids", {"Unique"}),
])
def test_stage_converts_with_its_ops(converted, stage, ops):
    _, _, results = converted
    result = results[stage]
    assert result.ok, format_reasons([result])
    assert ops <= {n.op_type for n in result.spec.nodes}


def test_missing_ops_are_grouped_with_counts(converted):
    _, _, results = converted
    assert results["two_cosines"].reasons == (
        "ONNX op ai.onnx::Cos has no Torch converter (2 nodes)",)


@pytest.mark.parametrize("seed, rows, length", [(1, 3, 4), (2, 6, 7)])
def test_converted_stages_keep_parity_on_other_batches(converted, seed, rows, length):
    plan, plan_dir, _ = converted
    result = check_parity(plan, [models.pooling_batch(rows, length, seed)], plan_dir=plan_dir)
    assert result.passed, result.summary()
    assert set(result.runtimes.values()) == {"torch", "tf"}
