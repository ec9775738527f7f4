"""The kernels as torch ops (``torch.library.triton_op``): opcheck, the kernels each op names,
and tracing by torch.export with static and dynamic sizes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from torch_engine import reference
from xgr_common.errors import InvalidInputError
from torch_engine.kernels import decode_attention, prefill_attention
from xgr_common.layout import MaskMode

_ROOT = Path(__file__).resolve().parents[2]


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


class _RequestMajorDecode(torch.nn.Module):
    """The engine's static packing: request starts at a fixed stride, ``seq_lens`` tokens."""

    def forward(self, q, shared_k, shared_v, starts, beam_k, beam_v, seq_lens):
        return decode_attention(q, shared_k, shared_v, starts, beam_k, beam_v, 2,
                                seq_lens=seq_lens)


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


@pytest.mark.heavy
def test_decode_op_with_seq_lens_passes_opcheck_and_exports(kt, gen):
    q, k, v, _, bk, bv = _decode_args(kt, gen)[:6]
    starts = torch.tensor([0, 9, 17], dtype=torch.int32, device=gen.device)
    lens = torch.tensor([5, 8], dtype=torch.int32, device=gen.device)
    args = (q, k, v, starts, bk, bv, 2, None, lens)
    torch.library.opcheck(torch.ops.xgr.decode_attention.default, args)
    program = torch.export.export(_RequestMajorDecode(), (q, k, v, starts, bk, bv, lens))
    targets = [node.target for node in program.graph.nodes if node.op == "call_function"]
    assert torch.ops.xgr.decode_attention.default in targets
    expected = reference.decode_attention(q, k, v, starts, bk, bv, 2, seq_lens=lens)
    kt.check(program.module()(q, k, v, starts, bk, bv, lens), expected, torch.float32,
             "exported request-major decode", gen.initial_seed())


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


_KERNELS_OF_OPS = """
import json
import torch
import torch_engine.kernels
from torch._library.triton import get_triton_kernels_for_op
print(json.dumps({op: sorted(k.fn.__name__ if hasattr(k, "fn") else k.__name__
                             for k in get_triton_kernels_for_op(op))
                  for op in ("xgr::decode_attention", "xgr::prefill_attention")}))
"""


@pytest.mark.heavy  # a fresh interpreter
def test_ops_are_triton_ops_that_name_their_kernels():
    # What AOTInductor embeds, and what the export of a TorchCall package checks for. Kernels
    # compiled for a device (not interpreted ones), so a process without TRITON_INTERPRET.
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    done = subprocess.run([sys.executable, "-c", _KERNELS_OF_OPS], capture_output=True,
                          text=True, env=env, timeout=120, cwd=_ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    kernels = json.loads(done.stdout.strip().splitlines()[-1])
    assert kernels == {"xgr::decode_attention": ["_decode_merge_kernel", "_decode_partial_kernel"],
                       "xgr::prefill_attention": ["_prefill_kernel"]}


class _PrefillThenDecode(torch.nn.Module):
    """Offsets from lengths inside the graph, as an exported engine computes them."""

    def forward(self, lengths, segment_ids, q, k, v, dq, beam_k, beam_v):
        cu = torch.nn.functional.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)
        return (prefill_attention(q, k, v, cu, segment_ids, MaskMode.ITEM_CAUSAL),
                decode_attention(dq, k, v, cu, beam_k, beam_v, 2))


def _engine_like_args(kt, gen, lengths):
    total, batch = sum(lengths), len(lengths)
    return (torch.tensor(lengths, dtype=torch.int32, device=gen.device),
            kt.item_segments(lengths, 3, 2, gen.device),
            kt.randn((total, 2, 16), torch.float32, gen),
            kt.randn((total, 1, 16), torch.float32, gen),
            kt.randn((total, 1, 16), torch.float32, gen),
            kt.randn((batch, 2, 2, 16), torch.float32, gen),
            kt.randn((batch, 2, 2, 1, 16), torch.float32, gen),
            kt.randn((batch, 2, 2, 1, 16), torch.float32, gen))


def test_export_with_dynamic_batch_and_tokens_runs_other_sizes(kt, gen):
    # Symbolic sizes: the size checks become runtime assertions, not guards that fix a size.
    batch = torch.export.Dim("batch", min=1, max=64)
    tokens = torch.export.Dim("tokens", min=2, max=1 << 16)
    dynamic = ({0: batch}, {0: tokens}, {0: tokens}, {0: tokens}, {0: tokens}, {0: batch},
               {0: batch}, {0: batch})
    program = torch.export.export(_PrefillThenDecode(), _engine_like_args(kt, gen, [5, 12]),
                                  dynamic_shapes=dynamic, strict=False)
    args = _engine_like_args(kt, gen, [3, 1, 9])
    lengths, segs, q, k, v, dq, bk, bv = args
    cu = kt.cu_seqlens_of([3, 1, 9], gen.device)
    prefill, decode = program.module()(*args)
    kt.check(prefill, reference.prefill_attention(q, k, v, cu, segs, MaskMode.ITEM_CAUSAL),
             torch.float32, "exported prefill, other sizes", gen.initial_seed())
    kt.check(decode, reference.decode_attention(dq, k, v, cu, bk, bv, 2), torch.float32,
             "exported decode, other sizes", gen.initial_seed())
