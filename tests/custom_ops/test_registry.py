"""The custom-op registry: complete against the op library, twins runnable, table rendered."""

import re

import numpy as np
import pytest
import torch

from custom_ops import registry
from xgr_common.errors import ConversionError


def _snake(name):
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def test_registry_covers_exactly_the_library_ops(ops):
    lib = ops.load_library("feature_ops")
    exported = {name for name in dir(lib)
                if name.startswith("xgr_") and not name.endswith("_eager_fallback")}
    assert exported == {_snake(op.tf_op) for op in registry.OPS}


OP_IDS = [op.tf_op for op in registry.OPS]


@pytest.mark.parametrize("op", registry.OPS, ids=OP_IDS)
def test_every_twin_and_onnx_twin_resolves(op):
    assert callable(op.load_torch_twin()), op.tf_op
    if op.onnx is not None:
        assert op.onnx.domain == "xgr.custom" and op.onnx.op_type == op.tf_op
        assert registry.torch_twin_for_onnx(op.tf_op) is op.load_onnx_twin()


def test_lookup_and_unknown_op():
    assert registry.lookup("XgrAssemblePrompt").python_api == "custom_ops.assemble_prompt"
    with pytest.raises(ConversionError, match="XgrNope.*registered ops: XgrCleanSequence"):
        registry.lookup("XgrNope")
    assert registry.torch_twin_for_onnx("XgrNope") is None
    assert registry.torch_twin_for_onnx("XgrCleanSequence", domain="ai.onnx") is None


def test_entries_are_frozen():
    with pytest.raises(AttributeError):
        registry.OPS[0].tf_op = "Other"


def test_onnx_twin_follows_the_node_signature(ops):
    """Calling an ONNX twin the way bridge.onnx_torch does: inputs in node order, attributes
    as keywords, outputs in node order; the results equal the TF op's."""
    entry = registry.lookup("XgrCleanSequence")
    inputs = dict(values=[3, 3, 4], timestamps=[1, 2, 3], row_splits=[0, 3], request_time=[3])
    attrs = dict(window_seconds=5, keep_last=2)
    twin = registry.torch_twin_for_onnx(entry.onnx.op_type)
    got = twin(*(torch.tensor(inputs[name]) for name in entry.onnx.inputs), **attrs)
    want = ops.clean_sequence(**{k: np.asarray(v, np.int64) for k, v in inputs.items()}, **attrs)
    assert len(got) == len(entry.onnx.outputs)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g.numpy(), w.numpy())


def _table_lines():
    return registry.support_table_markdown().strip().splitlines()


def test_markdown_table_has_a_header_and_one_row_per_op():
    lines = _table_lines()
    assert lines[0].startswith("| TF op |") and len(lines) == 2 + len(registry.OPS)


@pytest.mark.parametrize("row", range(len(registry.OPS)), ids=OP_IDS)
def test_markdown_table_lists_every_op(row):
    """Row ``row`` of the table (in registry order) is that op's, with its ONNX node's inputs
    and attributes."""
    op, line = registry.OPS[row], _table_lines()[2 + row]
    assert line.startswith(f"| `{op.tf_op}` |") and line.count("|") == 6
    if op.onnx is not None:
        assert all(name in line for name in op.onnx.inputs + op.onnx.attributes)
