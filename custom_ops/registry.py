"""One registry of the project's custom TF ops: each op's Torch twin and its ONNX node.

tf2onnx emits a custom op as a node of domain ``xgr.custom`` whose op_type is the TF op name,
with the inputs, outputs and attributes listed here; ``bridge.onnx_torch`` runs such a node
through ``torch_twin_for_onnx``; the migration guide's support table is
``support_table_markdown()``. Twins are named as ``module:function`` and imported on demand,
so reading the registry never imports torch.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from typing import Callable

from xgr_common.errors import ConversionError

ONNX_DOMAIN = "xgr.custom"


@dataclass(frozen=True)
class OnnxNode:
    """The ONNX node a TF op becomes: ``domain``/``op_type`` plus ordered input and output
    names and the attribute names (the TF op's attributes, same names and meaning)."""

    op_type: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attributes: tuple[str, ...]
    domain: str = ONNX_DOMAIN


@dataclass(frozen=True)
class CustomOp:
    """A custom TF op and its counterparts.

    ``torch_twin`` takes the TF op's inputs and attributes (as keywords) with the same
    semantics; ``onnx_twin`` takes the ONNX node's inputs positionally and its attributes as
    keywords. ``onnx`` is None for ops that have no node of their own (the table's resource
    ops fold into the lookup node as its catalog inputs).
    """

    tf_op: str
    summary: str
    python_api: str
    torch_twin: str
    onnx: OnnxNode | None
    onnx_twin: str | None = None

    def load_torch_twin(self) -> Callable:
        return _resolve(self.torch_twin)

    def load_onnx_twin(self) -> Callable | None:
        return None if self.onnx_twin is None else _resolve(self.onnx_twin)


def _resolve(target: str) -> Callable:
    """``package.module:Name.attr`` -> the object."""
    module, _, path = target.partition(":")
    return functools.reduce(getattr, path.split("."), importlib.import_module(module))


_TWINS = "custom_ops.torch_twins"
_TABLE_NOTE = "table resource op; folds into the XgrSemanticIdLookup node's catalog inputs"

OPS: tuple[CustomOp, ...] = (
    CustomOp(
        tf_op="XgrCleanSequence",
        summary="window filter, duplicate-run collapse, keep the last N events per row",
        python_api="custom_ops.clean_sequence",
        torch_twin=f"{_TWINS}.clean_sequence:clean_sequence",
        onnx=OnnxNode("XgrCleanSequence",
                      ("values", "timestamps", "row_splits", "request_time"),
                      ("clean_values", "clean_timestamps", "clean_row_splits"),
                      ("window_seconds", "keep_last")),
        onnx_twin=f"{_TWINS}.clean_sequence:clean_sequence"),
    CustomOp(
        tf_op="XgrSplitHistory",
        summary="frozen long-term part (closed time blocks) and recent part per row",
        python_api="custom_ops.split_history",
        torch_twin=f"{_TWINS}.split_history:split_history",
        onnx=OnnxNode("XgrSplitHistory",
                      ("values", "timestamps", "row_splits", "request_time"),
                      ("long_values", "long_row_splits", "recent_values", "recent_row_splits"),
                      ("block_seconds", "long_term_blocks", "long_term_items", "recent_items")),
        onnx_twin=f"{_TWINS}.split_history:split_history"),
    CustomOp(
        tf_op="XgrSemanticIdLookup",
        summary="item ids -> semantic-ID code tokens; unknown items dropped and counted",
        python_api="custom_ops.semantic_id_lookup",
        torch_twin=f"{_TWINS}.semantic_ids:semantic_id_lookup",
        onnx=OnnxNode("XgrSemanticIdLookup",
                      ("catalog_item_ids", "catalog_codes", "items", "row_splits"),
                      ("code_tokens", "code_row_splits", "unknown_count"),
                      ("code_base", "codebook_size", "levels")),
        onnx_twin=f"{_TWINS}.semantic_ids:semantic_id_lookup_onnx"),
    CustomOp(
        tf_op="XgrAssemblePrompt",
        summary="context + item code tokens -> padded token_ids, lengths, segment_ids",
        python_api="custom_ops.assemble_prompt",
        torch_twin=f"{_TWINS}.assemble_prompt:assemble_prompt",
        onnx=OnnxNode("XgrAssemblePrompt",
                      ("context_tokens", "item_tokens", "item_row_splits"),
                      ("token_ids", "lengths", "segment_ids"),
                      ("bos_id", "profile_start_id", "item_start_id", "pad_id", "max_length")),
        onnx_twin=f"{_TWINS}.assemble_prompt:assemble_prompt"),
    CustomOp(
        tf_op="XgrAssemblePromptV2",
        summary="v2 prompt: frozen long-term items first, profile block with SOFT markers, "
                "recent items, text spans; padded token_ids, lengths, segment_ids, "
                "frozen_lengths",
        python_api="custom_ops.assemble_prompt_v2",
        torch_twin=f"{_TWINS}.assemble_prompt_v2:assemble_prompt_v2",
        onnx=OnnxNode("XgrAssemblePromptV2",
                      ("long_item_tokens", "long_row_splits", "context_tokens",
                       "recent_item_tokens", "recent_row_splits"),
                      ("token_ids", "lengths", "segment_ids", "frozen_lengths"),
                      ("bos_id", "profile_start_id", "item_start_id", "soft_id", "pad_id",
                       "soft_tokens", "intro", "before_profile", "before_recent", "question",
                       "max_length")),
        onnx_twin=f"{_TWINS}.assemble_prompt_v2:assemble_prompt_v2"),
    CustomOp("XgrSemanticIdTableHandle", _TABLE_NOTE, "custom_ops.SemanticIdTable",
             f"{_TWINS}.semantic_ids:TorchSemanticIdTable", None),
    CustomOp("XgrSemanticIdTableInitFromFile", _TABLE_NOTE, "custom_ops.SemanticIdTable",
             f"{_TWINS}.semantic_ids:TorchSemanticIdTable.from_file", None),
    CustomOp("XgrSemanticIdTableInitFromArrays", _TABLE_NOTE,
             "custom_ops.SemanticIdTable.from_arrays",
             f"{_TWINS}.semantic_ids:TorchSemanticIdTable", None),
    CustomOp("XgrSemanticIdTableSize", "number of items in a semantic-ID table",
             "custom_ops.SemanticIdTable.size",
             f"{_TWINS}.semantic_ids:TorchSemanticIdTable.__len__", None),
)


def lookup(tf_op: str) -> CustomOp:
    """The entry of TF op ``tf_op``; ``ConversionError`` listing the known ops otherwise."""
    for op in OPS:
        if op.tf_op == tf_op:
            return op
    raise ConversionError(f"{tf_op!r} is not a registered custom op; registered ops: "
                          f"{', '.join(op.tf_op for op in OPS)}")


def torch_twin_for_onnx(op_type: str, domain: str = ONNX_DOMAIN) -> Callable | None:
    """The callable for an ONNX node of ``domain``/``op_type``, or None when none exists."""
    for op in OPS:
        if op.onnx is not None and (op.onnx.domain, op.onnx.op_type) == (domain, op_type):
            return op.load_onnx_twin()
    return None


def support_table_markdown() -> str:
    """The support table (one row per op) as GitHub Markdown."""
    rows = ["| TF op | Python API | Torch twin | ONNX node (xgr.custom) | notes |",
            "| --- | --- | --- | --- | --- |"]
    for op in OPS:
        if op.onnx is None:
            node = "none"
        else:
            node = (f"`{op.onnx.op_type}`({', '.join(op.onnx.inputs)}) -> "
                    f"({', '.join(op.onnx.outputs)}); attrs: {', '.join(op.onnx.attributes)}")
        rows.append(f"| `{op.tf_op}` | `{op.python_api}` | `{op.torch_twin}` | {node} | "
                    f"{op.summary} |")
    return "\n".join(rows) + "\n"
