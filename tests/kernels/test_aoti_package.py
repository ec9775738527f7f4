"""The attention ops ahead of time: torch.export -> AOTInductor package -> a process without
Python kernels runs it.

``xgr::decode_attention`` and ``xgr::prefill_attention`` are ``torch.library.triton_op``s, so
AOTInductor compiles their Triton kernels into the ``.pt2``. The package is run in a fresh
process that never imports ``torch_engine``: the ``xgr`` ops are not registered there, so a
package that fell back to calling them through Python would fail instead of matching.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import zipfile

import pytest
import torch

from torch_engine import reference
from torch_engine.aoti_loading import loader_environment
from torch_engine.kernels import decode_attention, prefill_attention
from xgr_common.layout import MaskMode

HQ, HKV, DIM, WIDTH, SLOTS = 14, 2, 64, 8, 2
KERNELS = ("_decode_partial_kernel", "_prefill_kernel")


class _PrefillThenDecode(torch.nn.Module):
    """What an exported engine does with the ops: offsets from lengths, prefill, decode."""

    def forward(self, lengths, segment_ids, pq, pk, pv, q, beam_k, beam_v):
        cu = torch.nn.functional.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)
        prompt = prefill_attention(pq, pk, pv, cu, segment_ids, MaskMode.ITEM_CAUSAL)
        step = decode_attention(q, pk, pv, cu, beam_k, beam_v, 2)
        # The static engine's form: request starts and their token counts (here equal to the
        # compact offsets, so the same result).
        by_lengths = decode_attention(q, pk, pv, cu, beam_k, beam_v, 2, seq_lens=lengths)
        return prompt, step, by_lengths


def _inputs(kt, gen, lengths):
    batch, total = len(lengths), sum(lengths)
    return (torch.tensor(lengths, dtype=torch.int32, device=gen.device),
            kt.item_segments(lengths, 5, 3, gen.device),
            kt.randn((total, HQ, DIM), torch.bfloat16, gen),
            kt.randn((total, HKV, DIM), torch.bfloat16, gen),
            kt.randn((total, HKV, DIM), torch.bfloat16, gen),
            kt.randn((batch, WIDTH, HQ, DIM), torch.bfloat16, gen),
            kt.randn((batch, WIDTH, SLOTS, HKV, DIM), torch.bfloat16, gen),
            kt.randn((batch, WIDTH, SLOTS, HKV, DIM), torch.bfloat16, gen))


def _references(inputs):
    lengths, segs, pq, pk, pv, q, bk, bv = inputs
    cu = torch.nn.functional.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)
    up = [x.double() for x in (pq, pk, pv, q, bk, bv)]
    return (reference.prefill_attention(up[0], up[1], up[2], cu, segs, MaskMode.ITEM_CAUSAL),
            reference.decode_attention(up[3], up[1], up[2], cu, up[4], up[5], 2))


_RUNNER = textwrap.dedent("""
    import sys
    import torch
    package, inputs_path, outputs_path = sys.argv[1:]
    assert not hasattr(torch.ops.xgr, "decode_attention_interpreted"), "xgr ops registered"
    # As torch_engine.aoti_loading.load_package does (not imported here: this process must
    # stay free of torch_engine): no CPU-ISA probe builds, which took > 40 s on the H200 host.
    with torch._inductor.config.patch({"cpp.vec_isa_ok": False}):
        model = torch._inductor.aoti_load_package(package)
    runs = torch.load(inputs_path)
    with torch.no_grad():
        outputs = [model(*[t.cuda() for t in inputs]) for inputs in runs]
    torch.save([[t.cpu() for t in out] for out in outputs], outputs_path)
""")


@pytest.mark.gpu
def test_aoti_package_embeds_the_kernels_and_matches_the_reference(kt, gen, tmp_path):
    # Prompts long enough that the traced decode config splits them (fused merge included).
    traced = _inputs(kt, gen, [600, 1, 300])
    batch = torch.export.Dim("batch", min=1, max=64)
    tokens = torch.export.Dim("tokens", min=2, max=1 << 16)
    dynamic = ({0: batch}, {0: tokens}, {0: tokens}, {0: tokens}, {0: tokens}, {0: batch},
               {0: batch}, {0: batch})
    program = torch.export.export(_PrefillThenDecode(), traced, dynamic_shapes=dynamic,
                                  strict=False)
    targets = {node.target for node in program.graph.nodes if node.op == "call_function"}
    assert {torch.ops.xgr.decode_attention.default,
            torch.ops.xgr.prefill_attention.default} <= targets
    path = torch._inductor.aoti_compile_and_package(program,
                                                    package_path=str(tmp_path / "attn.pt2"))

    with zipfile.ZipFile(path) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    for kernel in KERNELS:
        holders = [name for name, data in members.items() if kernel.encode() in data]
        assert holders, f"no package member mentions {kernel}: {sorted(members)}"
    assert any(name.endswith((".cubin", ".so")) for name in members), sorted(members)

    # Other batch sizes and lengths than the trace's: the package is dynamic in both.
    runs = [_inputs(kt, gen, [700, 3]), _inputs(kt, gen, [1, 90, 17, 256, 5])]
    torch.save([[t.cpu() for t in run] for run in runs], tmp_path / "inputs.pt")
    # The loader process starts with the compiler's libstdc++ preloaded (without it a
    # wrapper's static C++ runtime crashed on the H200: torch_engine.aoti_loading).
    done = subprocess.run([sys.executable, "-c", _RUNNER, path, str(tmp_path / "inputs.pt"),
                           str(tmp_path / "outputs.pt")], capture_output=True, text=True,
                          timeout=300, env=loader_environment())
    assert done.returncode == 0, done.stderr[-3000:]
    outputs = torch.load(tmp_path / "outputs.pt")
    for run, got in zip(runs, outputs):
        want_prefill, want_decode = _references(run)
        kt.check(got[0].to(gen.device), want_prefill, torch.bfloat16, "packaged prefill",
                 gen.initial_seed())
        kt.check(got[1].to(gen.device), want_decode, torch.bfloat16, "packaged decode",
                 gen.initial_seed())
        kt.check(got[2].to(gen.device), want_decode, torch.bfloat16,
                 "packaged decode with seq_lens", gen.initial_seed())
