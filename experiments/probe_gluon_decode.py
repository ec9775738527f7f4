"""The decode step's shared stage written in Gluon (Triton's explicit-layout dialect), with the
score product of key tile j issued together with the P V product of tile j - 1, so that tile j's
softmax runs while P V does (asynchronous warpgroup products), against the xAttention op's
shared stage.

    python -m experiments.probe_gluon_decode --out=experiments/results     # on a Hopper GPU
    python -m experiments.probe_gluon_decode --compile_only                # sm_90 compile, no GPU

``triton.language``'s ``tl.dot`` waits for each product before the next instruction, so the
xAttention kernel's softmax never runs beside a product of the same program
(``docs/notes/attention.md`` v8, v13). Gluon exposes ``warpgroup_mma(..., is_async=True)`` and
``warpgroup_mma_wait(num_outstanding)``, so one warpgroup can keep the tensor cores busy with
the next tile's scores and the last tile's P V while it computes the current softmax (the
intra-warpgroup overlap of FlashAttention-3). This probe asks whether that pays at the decode
shapes, on the shared stage alone (``num_own = 0``), equal-length prompts that are whole key
tiles: one 64-row tile of (beam x group) rows per program, keys and values through TMA into a
ring of ``STAGES`` shared-memory slots, ``OVERLAP`` choosing the asynchronous order or the
plain one (each product waited for at once). Each variant is checked against the float64
reference before it is timed. A probe: nothing in ``torch_engine`` uses it; Gluon kernels do not
run under ``TRITON_INTERPRET``.
"""

from __future__ import annotations

import math

import torch
import triton
from absl import app, flags
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier,
                                                              tma, warpgroup_mma,
                                                              warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from benchmarks import bench_attention as ba
from benchmarks import results_file as rf
from torch_engine import reference

FLAGS = flags.FLAGS
flags.DEFINE_bool("compile_only", False, "compile the variants for sm_90 and print their "
                  "resource usage (no GPU needed)")
flags.DEFINE_list("variants", [], "variant labels to run (e.g. overlap_s3_n64); empty: all")

# Names that moved between Triton releases: 3.6 (the GPU machine) calls the TMA load
# async_copy_global_to_shared and the CTA barrier thread_barrier, 3.9 (CI) async_load and barrier.
_TMA_LOAD = tma.async_load if hasattr(tma, "async_load") else tma.async_copy_global_to_shared
_CTA_BARRIER = gl.thread_barrier if hasattr(gl, "thread_barrier") else gl.barrier
_LOG2E = 1.4426950408889634
# One warpgroup (4 warps, the layouts' warps_per_cta) over one 64-row tile, the smallest that
# Hopper's warpgroup products take.
_BLOCK_M = 64
_NUM_WARPS = 4
VARIANTS = [dict(OVERLAP=overlap, STAGES=stages, BLOCK_N=block_n)
            for overlap in (True, False) for stages in (2, 3) for block_n in (64, 128)]


def label(variant: dict) -> str:
    """``overlap_s3_n64``: the product order, ring slots and keys per step of a variant."""
    order = "overlap" if variant["OVERLAP"] else "plain"
    return f"{order}_s{variant['STAGES']}_n{variant['BLOCK_N']}"


def chosen_variants() -> list[dict]:
    """The variants that --variants names (all when empty); an unknown label is an error."""
    known = {label(v): v for v in VARIANTS}
    unknown = [name for name in FLAGS.variants if name not in known]
    if unknown:
        raise app.UsageError(f"--variants: unknown {unknown}; known: {sorted(known)}")
    return [known[name] for name in FLAGS.variants] or VARIANTS


@gluon.jit
def _issue_kv(k_desc, v_desc, k_smem, v_smem, bars, tile, start, col,
              BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    """TMA loads of key tile ``tile`` (keys and values) into ring slot ``tile % STAGES``."""
    slot = tile % STAGES
    bar = bars.index(slot)
    mbarrier.expect(bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
    _TMA_LOAD(k_desc, [start + tile * BLOCK_N, col], bar, k_smem.index(slot))
    _TMA_LOAD(v_desc, [start + tile * BLOCK_N, col], bar, v_smem.index(slot))


@gluon.jit
def _softmax_step(s, m_i, l_i, qk_scale):
    """Online softmax (base 2) of the unscaled scores s: probabilities, the rescale of the
    earlier state, and the new running max and sum."""
    m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
    alpha = gl.exp2(m_i - m_new)
    p = gl.exp2(s * qk_scale - m_new[:, None])
    return p, alpha, m_new, l_i * alpha + gl.sum(p, 1)


@gluon.jit
def _shared_stage_kernel(q_ptr, k_desc, v_desc, cu_ptr, out_ptr, qk_scale, width,
                         num_kv_heads, s_qb, s_qw, s_qh, s_ob, s_ow, s_oh,
                         GROUP: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                         BLOCK_N: gl.constexpr, STAGES: gl.constexpr, OVERLAP: gl.constexpr):
    pid_m = gl.program_id(0)
    pid_bh = gl.program_id(1)
    b = pid_bh // num_kv_heads
    h = pid_bh % num_kv_heads
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    q_load: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])

    # The (beam x group) rows of this tile: row r is beam r // GROUP, head h * GROUP + r % GROUP.
    rows = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, q_load))
    d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, q_load))
    row_ok = rows < width * GROUP
    q_rows = q_ptr + b * s_qb + (rows // GROUP) * s_qw + (h * GROUP + rows % GROUP) * s_qh
    q = gl.load(q_rows[:, None] + d[None, :], mask=row_ok[:, None], other=0.0)
    q_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, HEAD_DIM], gl.bfloat16)
    q_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_M, HEAD_DIM], q_sl, q)

    k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(bars.index(i), count=1)
    # The query tile and the barriers, written by every thread, are read by the async proxy
    # (the products, the copies) next.
    fence_async_shared()
    _CTA_BARRIER()

    start = gl.load(cu_ptr + b)
    n_tiles = (gl.load(cu_ptr + b + 1) - start) // BLOCK_N
    col = h * HEAD_DIM
    for i in gl.static_range(STAGES - 1):
        if i < n_tiles:
            _issue_kv(k_desc, v_desc, k_smem, v_smem, bars, i, start, col, BLOCK_N, STAGES)

    zero_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=o_layout)
    m_i = gl.full([BLOCK_M], -1.0e30, gl.float32, layout=gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([BLOCK_M], gl.float32, layout=gl.SliceLayout(1, s_layout))

    if OVERLAP:
        # Tile 0's scores and softmax; then each step issues the scores of tile j and the
        # P V of tile j - 1, and computes tile j's softmax while P V runs.
        mbarrier.wait(bars.index(0), 0)
        if STAGES - 1 < n_tiles:
            _issue_kv(k_desc, v_desc, k_smem, v_smem, bars, STAGES - 1, start, col, BLOCK_N,
                      STAGES)
        s = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), zero_s, use_acc=False,
                          is_async=True)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
        p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, qk_scale)
        p_prev = gl.convert_layout(p.to(gl.bfloat16), p_layout)
        for j in range(1, n_tiles):
            slot = j % STAGES
            mbarrier.wait(bars.index(slot), (j // STAGES) & 1)
            s = warpgroup_mma(q_smem, k_smem.index(slot).permute((1, 0)), zero_s,
                              use_acc=False, is_async=True)
            acc = warpgroup_mma(p_prev, v_smem.index((j - 1) % STAGES), acc, is_async=True)
            s = warpgroup_mma_wait(num_outstanding=1, deps=(s,))
            p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, qk_scale)
            p_prev = gl.convert_layout(p.to(gl.bfloat16), p_layout)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
            # Tile j - 1's slot is free now that its P V is done.
            if j + STAGES - 1 < n_tiles:
                _issue_kv(k_desc, v_desc, k_smem, v_smem, bars, j + STAGES - 1, start, col,
                          BLOCK_N, STAGES)
        acc = warpgroup_mma(p_prev, v_smem.index((n_tiles - 1) % STAGES), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    else:
        for j in range(0, n_tiles):
            slot = j % STAGES
            mbarrier.wait(bars.index(slot), (j // STAGES) & 1)
            s = warpgroup_mma(q_smem, k_smem.index(slot).permute((1, 0)), zero_s,
                              use_acc=False, is_async=True)
            s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
            p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, qk_scale)
            acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
            acc = warpgroup_mma(gl.convert_layout(p.to(gl.bfloat16), p_layout),
                                v_smem.index(slot), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            if j + STAGES - 1 < n_tiles:
                _issue_kv(k_desc, v_desc, k_smem, v_smem, bars, j + STAGES - 1, start, col,
                          BLOCK_N, STAGES)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(bars.index(i))

    out = acc / gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))[:, None]
    o_rows_i = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, o_layout))
    o_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
    o_rows = (out_ptr + b * s_ob + (o_rows_i // GROUP) * s_ow
              + (h * GROUP + o_rows_i % GROUP) * s_oh)
    gl.store(o_rows[:, None] + o_d[None, :], out.to(gl.bfloat16),
             mask=(o_rows_i < width * GROUP)[:, None])


def descriptors(shared_k, shared_v, block_n: int):
    """TMA descriptors of ``[T, Hkv, D]`` keys and values as ``[T, Hkv * D]``, ``[block_n, D]``
    boxes."""
    dim = shared_k.shape[2]
    layout = gl.NVMMASharedLayout.get_default_for([block_n, dim], gl.bfloat16)
    out = []
    for t in (shared_k, shared_v):
        flat = t.view(t.shape[0], t.shape[1] * dim)
        out.append(TensorDescriptor(flat, list(flat.shape), list(flat.stride()), [block_n, dim],
                                    layout))
    return out


def shared_stage(q, shared_k, shared_v, cu_seqlens, variant: dict, out=None):
    """The shared stage of ``decode_attention`` (``num_own = 0``) for equal-length prompts whose
    length is a multiple of ``BLOCK_N``; q ``[B, W, Hq, D]`` bf16."""
    batch, width, hq, dim = q.shape
    hkv = shared_k.shape[1]
    out = torch.empty_like(q) if out is None else out
    k_desc, v_desc = descriptors(shared_k, shared_v, variant["BLOCK_N"])
    grid = (triton.cdiv(width * hq // hkv, _BLOCK_M), batch * hkv)
    _shared_stage_kernel[grid](
        q, k_desc, v_desc, cu_seqlens, out, _LOG2E / math.sqrt(dim), width, hkv,
        q.stride(0), q.stride(1), q.stride(2), out.stride(0), out.stride(1), out.stride(2),
        GROUP=hq // hkv, HEAD_DIM=dim, BLOCK_M=_BLOCK_M, num_warps=_NUM_WARPS, **variant)
    return out


def resource_usage(kernel) -> str:
    """The cubin's resource line (registers, stack, local memory) from Triton's cuobjdump."""
    import pathlib
    import subprocess
    import tempfile
    tool = pathlib.Path(triton.__file__).parent / "backends/nvidia/bin/cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(kernel.asm["cubin"])
        cubin.flush()
        dump = subprocess.run([str(tool), "--dump-resource-usage", cubin.name],
                              capture_output=True, text=True).stdout
    return next((line.strip() for line in dump.splitlines() if "REG:" in line), "no usage")


def compile_only() -> None:
    """Every variant compiled for sm_90 here (no driver): registers, spills, shared memory."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    target = GPUTarget("cuda", 90, 32)
    failed = 0
    for dim in (64, 128):
        k = torch.empty(1024, 2, dim, dtype=torch.bfloat16)
        for variant in chosen_variants():
            k_desc, _ = descriptors(k, k, variant["BLOCK_N"])
            sig = {"q_ptr": "*bf16", "k_desc": k_desc.__mangle__(),
                   "v_desc": k_desc.__mangle__(), "cu_ptr": "*i32", "out_ptr": "*bf16",
                   "qk_scale": "fp32", "width": "i32", "num_kv_heads": "i32",
                   **{name: "i32" for name in ("s_qb", "s_qw", "s_qh", "s_ob", "s_ow",
                                               "s_oh")}}
            constexprs = {"GROUP": 7, "HEAD_DIM": dim, "BLOCK_M": _BLOCK_M, **variant}
            for name, value in constexprs.items():
                sig[name] = "constexpr"
            src = GluonASTSource(_shared_stage_kernel, sig, constexprs)
            try:
                kernel = triton.compile(src, target=target, options={"num_warps": _NUM_WARPS})
                print(f"COMPILED d{dim} {label(variant)}: {resource_usage(kernel)}, shared "
                      f"{kernel.metadata.shared} B")
            except Exception as error:  # noqa: BLE001 - report every variant
                failed += 1
                print(f"FAILED d{dim} {label(variant)}: {type(error).__name__}: "
                      f"{str(error)[:600]}")
    if failed:
        raise SystemExit(f"{failed} variant(s) did not compile")


def main(argv) -> None:
    del argv
    if FLAGS.compile_only:
        compile_only()
        return
    torch.manual_seed(0)
    rows = []
    for name in ba.HEADS:
        hq, hkv, dim = ba.HEADS[name]
        for batch in (1, 16):
            shape = (batch, 256, hq, hkv, dim, 1024)
            sets = ba.decode_sets(*shape, ba.rotations(ba.decode_bytes(*shape)))
            row = {"heads": name, "batch": batch, "width": 256, "prompt": 1024,
                   "xattention_shared": round(ba.graph_time_us(
                       [lambda s=s: ba.decode_attention(**s, num_own=0) for s in sets]), 2)}
            first = sets[0]
            ref = reference.decode_attention(
                **{k: (v.double() if v.is_floating_point() else v) for k, v in first.items()},
                num_own=0)
            for variant in chosen_variants():
                try:
                    poisoned = torch.full_like(first["q"], float("nan"))
                    got = shared_stage(first["q"], first["shared_k"], first["shared_v"],
                                       first["cu_seqlens"], variant, out=poisoned).double()
                    err = float((got - ref).norm() / ref.norm())
                    entry = {"rel_err": err}
                    if err < 1e-2:
                        entry["us"] = round(ba.graph_time_us(
                            [lambda s=s, v=variant: shared_stage(
                                s["q"], s["shared_k"], s["shared_v"], s["cu_seqlens"], v)
                             for s in sets]), 2)
                except Exception as error:  # noqa: BLE001 - one variant failing is a finding
                    entry = {"error": f"{type(error).__name__}: {str(error)[:300]}"}
                row[f"gluon_{label(variant)}"] = entry
            rows.append(row)
            print(row, flush=True)
    result = {"date": rf.utc_now(), "device": torch.cuda.get_device_name(0),
              "versions": {"torch": torch.__version__, "triton": triton.__version__},
              "dtype": "bfloat16", "num_own": 0, "rows": rows,
              "timing": "median of 25 CUDA-graph replays over input sets rotated past 3x L2"}
    print("wrote", rf.write_result(FLAGS.out, "gluon_decode", result))


if __name__ == "__main__":
    app.run(main)
