"""The decode step's shared stage through library attention kernels, beside the xAttention op.

    python -m experiments.probe_library_decode --out=experiments/results

The shared stage of one decode step is a dense (unmasked) attention of W x G query rows per
(request, KV head) over that request's prompt. SDPA's backends can run it when every prompt
has the same length, so their times bound what a library kernel (cuDNN's Hopper kernels, or
FlashAttention-2) would give for the same work. Per shape (the decode targets: W 256, prompt
1024, batch 1 and 16, both head shapes) it times, each in a CUDA graph over input sets rotated
past the L2 as ``bench_attention.py`` does:

* ``xattention``: ``torch_engine.kernels.decode_attention`` with the 2 own tokens (the op);
* ``xattention_shared``: the same op with ``num_own = 0`` (the shared stage alone);
* ``cudnn_gqa`` / ``flash_gqa`` / ``efficient_gqa``: SDPA on ``[B, Hq, W, D]`` query views of
  the op's ``q`` and ``[B, Hkv, L, D]`` views of the packed prompt KV, ``enable_gqa``;
* ``cudnn_rows`` / ``flash_rows``: SDPA on the query rows of one KV head gathered as
  ``[B, Hkv, W * G, D]`` (the op's tile; gathered outside the timed region), no grouping;
* ``cudnn_rows_lse``: ``aten._scaled_dot_product_cudnn_attention`` on the same rows, also
  returning the log-sum-exp that a merge with the own tokens would need;
* ``rows_gather``: the gather of the query rows alone.

Writes ``library_decode_<date>.json`` and prints a table. Each backend that cannot run a shape
records why.
"""

from __future__ import annotations


import torch
import torch.nn.functional as F
from absl import app
from torch.nn.attention import SDPBackend, sdpa_kernel

from benchmarks import bench_attention as ba
from benchmarks import results_file as rf
from torch_engine.kernels import decode_attention

FLAGS = ba.FLAGS
SHAPES = [(name, batch, 256, length) for name in ba.HEADS for batch in (1, 16)
          for length in (1024, 4096)]


def library_calls(sets, batch, width, hq, hkv, dim, length) -> dict:
    """name -> list of calls (one per input set) for the graph timer."""
    group = hq // hkv

    def kv_view(t):                                       # [B*L, Hkv, D] -> [B, Hkv, L, D]
        return t.view(batch, length, hkv, dim).transpose(1, 2)

    def rows(q):                                          # [B, W, Hq, D] -> [B, Hkv, W*G, D]
        return (q.view(batch, width, hkv, group, dim).permute(0, 2, 1, 3, 4)
                .reshape(batch, hkv, width * group, dim))

    gathered = [rows(s["q"]).contiguous() for s in sets]

    def sdpa(backend, q, k, v, gqa):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)

    calls = {
        "xattention": [lambda s=s: decode_attention(**s, num_own=ba.OWN) for s in sets],
        "xattention_shared": [lambda s=s: decode_attention(**s, num_own=0) for s in sets],
        "rows_gather": [lambda s=s: rows(s["q"]).contiguous() for s in sets],
    }
    for label, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION),
                           ("flash", SDPBackend.FLASH_ATTENTION),
                           ("efficient", SDPBackend.EFFICIENT_ATTENTION)):
        calls[f"{label}_gqa"] = [
            lambda s=s, b=backend: sdpa(b, s["q"].transpose(1, 2), kv_view(s["shared_k"]),
                                        kv_view(s["shared_v"]), True) for s in sets]
    for label, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION),
                           ("flash", SDPBackend.FLASH_ATTENTION)):
        calls[f"{label}_rows"] = [
            lambda s=s, g=g, b=backend: sdpa(b, g, kv_view(s["shared_k"]),
                                             kv_view(s["shared_v"]), False)
            for s, g in zip(sets, gathered)]
    calls["cudnn_rows_lse"] = [
        lambda s=s, g=g: torch.ops.aten._scaled_dot_product_cudnn_attention(
            g, kv_view(s["shared_k"]), kv_view(s["shared_v"]), None, True, 0.0, False,
            False)[:2] for s, g in zip(sets, gathered)]
    return calls


def shared_error(calls: dict, batch, width, hq, hkv, dim) -> dict:
    """Relative error of each library result against the op's shared stage in float32 (a
    backend that cannot run records why)."""
    group = hq // hkv
    want = calls["xattention_shared"][0]().float()        # [B, W, Hq, D]
    errors = {}
    for name, fns in calls.items():
        if name in ("xattention", "xattention_shared", "rows_gather"):
            continue
        try:
            got = fns[0]()
        except Exception as error:  # noqa: BLE001 - the timing records the same failure
            errors[name] = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
            continue
        got = got[0] if isinstance(got, (tuple, list)) else got
        if "_rows" in name:                               # [B, Hkv, W*G, D] -> [B, W, Hq, D]
            got = (got.view(batch, hkv, width, group, dim).permute(0, 2, 1, 3, 4)
                   .reshape(batch, width, hq, dim))
        else:                                             # [B, Hq, W, D]
            got = got.transpose(1, 2)
        errors[name] = float((got.float() - want).norm() / want.norm())
    return errors


def measure(name, batch, width, length) -> dict:
    hq, hkv, dim = ba.HEADS[name]
    shape = (batch, width, hq, hkv, dim, length)
    sets = ba.decode_sets(*shape, ba.rotations(ba.decode_bytes(*shape)))
    calls = library_calls(sets, *shape)
    flops = 4 * batch * width * hq * length * dim
    row = {"heads": name, "batch": batch, "width": width, "prompt": length,
           "shared_GFLOP": round(flops / 1e9, 2)}
    errors = shared_error(calls, batch, width, hq, hkv, dim)
    for variant, fns in calls.items():
        got = ba.safe(lambda f=fns: {"us": ba.graph_time_us(f)})
        if "us" in got:
            got = {"median_us": round(got["us"], 2),
                   "shared_TFLOPs": round(flops / got["us"] / 1e6, 1)}
        if isinstance(errors.get(variant), float):
            got["rel_err_vs_shared"] = errors[variant]
        row[variant] = got
    return row


def main(argv) -> None:
    del argv
    torch.manual_seed(0)
    rows = [measure(*shape) for shape in SHAPES]
    names = [k for k in rows[0] if isinstance(rows[0][k], dict)]
    print("\n| heads | batch | prompt | " + " | ".join(names) + " |")
    print("|" + " --- |" * (3 + len(names)))
    for row in rows:
        cells = [f"{row[n]['median_us']:.1f}" if "median_us" in row[n] else "x" for n in names]
        print(f"| {row['heads']} | {row['batch']} | {row['prompt']} | " + " | ".join(cells)
              + " |")
    for row in rows:
        fails = {n: row[n]["error"] for n in names if "error" in row[n]}
        if fails:
            print(row["heads"], row["batch"], row["prompt"], fails)
    result = {"date": rf.utc_now(), "device": torch.cuda.get_device_name(0),
              "versions": {"torch": torch.__version__, "cuda": torch.version.cuda,
                           "cudnn": torch.backends.cudnn.version()},
              "dtype": "bfloat16", "own_tokens": ba.OWN, "timing": "median of 25 CUDA-graph "
              "replays over input sets rotated past 3x L2, per call", "rows": rows}
    print("wrote", rf.write_result(FLAGS.out, "library_decode", result, indent=1))


if __name__ == "__main__":
    app.run(main)
