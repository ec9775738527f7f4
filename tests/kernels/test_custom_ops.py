"""The kernels as torch custom ops: schema/fake checks (opcheck) and tracing by torch.export."""

from __future__ import annotations

import pytest
import torch

from torch_engine import reference
from torch_engine.errors import InvalidInputError
from torch_engine.kernels import decode_attention, prefill_attention
from torch_engine.layout import MaskMode


def _decode_args(kt, gen):
    cu = kt.cu_seqlens_of([5, 12], gen.device)
    return (kt.randn((2, 2, 2, 16), torch.float32, gen), kt.randn((17, 1, 16), torch.float32, gen),
            kt.randn((17, 1, 16), torch.float32, gen), cu,
            kt.randn((2, 2, 2, 1, 16), torch.float32, gen),
            kt.randn((2, 2, 2, 1, 16), torch.float32, gen), 2, None)


def _prefill_args(kt, gen):
    lengths = [5, 12]
    return (kt.randn((17, 2, 16), torch.float32, gen), kt.randn((17, 1, 16), torch.float32, gen),
            kt.randn((17, 1, 16), torch.float32, gen), kt.cu_seqlens_of(lengths, gen.device),
            kt.item_segments(lengths, 3, 2, gen.device), MaskMode.ITEM_CAUSAL.value, None)


def test_decode_op_passes_opcheck(kt, gen):
    torch.library.opcheck(torch.ops.xgr.decode_attention.default, _decode_args(kt, gen))


def test_prefill_op_passes_opcheck(kt, gen):
    torch.library.opcheck(torch.ops.xgr.prefill_attention.default, _prefill_args(kt, gen))


class _DecodeStep(torch.nn.Module):
    """What the engine's decode step does with the op: attention then a projection."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(16, 16)

    def forward(self, q, shared_k, shared_v, cu_seqlens, beam_k, beam_v):
        return self.proj(decode_attention(q, shared_k, shared_v, cu_seqlens, beam_k, beam_v, 2))


class _Prefill(torch.nn.Module):
    def forward(self, q, k, v, cu_seqlens, segment_ids):
        return prefill_attention(q, k, v, cu_seqlens, segment_ids, MaskMode.ITEM_CAUSAL) * 2.0


def test_export_traces_decode_op_and_runs_it(kt, gen):
    args = _decode_args(kt, gen)[:6]
    module = _DecodeStep().to(gen.device)
    program = torch.export.export(module, args)
    targets = [node.target for node in program.graph.nodes if node.op == "call_function"]
    assert torch.ops.xgr.decode_attention.default in targets
    expected = module.proj(reference.decode_attention(*args, 2))
    kt.check(program.module()(*args), expected, torch.float32, "exported decode",
             gen.initial_seed())


def test_export_traces_prefill_op_and_runs_it(kt, gen):
    args = _prefill_args(kt, gen)[:5]
    program = torch.export.export(_Prefill(), args)
    targets = [node.target for node in program.graph.nodes if node.op == "call_function"]
    assert torch.ops.xgr.prefill_attention.default in targets
    expected = reference.prefill_attention(*args, MaskMode.ITEM_CAUSAL) * 2.0
    kt.check(program.module()(*args), expected, torch.float32, "exported prefill",
             gen.initial_seed())


def test_export_rejects_bad_shapes_while_tracing(kt, gen):
    args = list(_prefill_args(kt, gen)[:5])
    args[1] = args[1][:16]  # k shorter than q
    with pytest.raises(InvalidInputError, match=r"k.shape\[0\]"):
        torch.export.export(_Prefill(), tuple(args))
