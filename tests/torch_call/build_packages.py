"""Builds the TorchCall test packages in a child process:
``python build_packages.py OUT CACHE [cpu|cuda]``.

A child, because torch.export and Inductor import Triton, and Triton aborts a process that
imported TensorFlow first (both bundle LLVM); the test process has TF loaded. Writes
``OUT/manifest.json``: package name -> ``torch_package.Package.to_json()``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from xgr_world.synthetic import WorldConfig

MAX_BATCH, MAX_LEN, TOP_K, ITEMS = 4096, 512, 5, 40
VOCAB = 1024   # the toy recommenders' token embedding rows (TokenLayout().code_end)
WORLD = WorldConfig(num_items=300, num_users=20)


class TwoHeads(torch.nn.Module):
    """An MLP over float features and an int64 head: ``x`` float32 [B, 4], ``ids`` int64
    [B, L] -> (float32 [B, 3], int64 [B, L])."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.SiLU(),
                                       torch.nn.Linear(16, 3))

    def forward(self, x, ids):
        return self.mlp(x), ids * 2 + ids.sum(dim=-1, keepdim=True)


class ToyRecommender(torch.nn.Module):
    """``recommend``-shaped: token_ids int32 [B, L], lengths int32 [B] -> item_ids int64
    [B, TOP_K] and scores float32 [B, TOP_K] (mean token embedding against item embeddings,
    over the first ITEMS items of the synthetic world ``WORLD``)."""

    def __init__(self):
        super().__init__()
        from xgr_common.layout import TokenLayout
        from xgr_world.synthetic import make_world

        torch.manual_seed(1)
        self.tokens = torch.nn.Embedding(TokenLayout().code_end, 8)
        self.items = torch.nn.Parameter(torch.randn(ITEMS, 8))
        ids = make_world(WORLD).item_ids[:ITEMS]
        self.register_buffer("item_ids", torch.from_numpy(ids))

    def forward(self, token_ids, lengths):
        lengths = lengths.to(torch.int64)
        mask = torch.arange(token_ids.shape[1]) < lengths[:, None]
        pooled = (self.tokens(token_ids.to(torch.int64)) * mask[..., None]).sum(1)
        scores, rows = torch.topk(pooled / lengths[:, None] @ self.items.T, TOP_K, dim=-1)
        return self.item_ids[rows], scores


class ToyExcluder(ToyRecommender):
    """``ToyRecommender`` that never returns an item of ``exclude_items`` int64 [B, X] (-1 =
    padding), the way the engine applies the history rule on the device."""

    def forward(self, token_ids, lengths, exclude_items):
        lengths = lengths.to(torch.int64)
        mask = torch.arange(token_ids.shape[1]) < lengths[:, None]
        pooled = (self.tokens(token_ids.to(torch.int64)) * mask[..., None]).sum(1)
        logits = pooled / lengths[:, None] @ self.items.T
        seen = (self.item_ids[None, :, None] == exclude_items[:, None, :]).any(-1)
        scores, rows = torch.topk(logits.masked_fill(seen, float("-inf")), TOP_K, dim=-1)
        return self.item_ids[rows], scores


class DoubleInPlace(torch.nn.Module):
    """x float32 [B] -> x + 0, after doubling x in place: visible in TF only if torch wrote
    into TF's own buffer (a zero-copy input)."""

    def forward(self, x):
        x.mul_(2.0)
        return x + 0.0


class ShapeProbe(torch.nn.Module):
    """ids int64 [B, L] -> (row sums int64 [B], the shape the package ran at int64 [2]): what a
    bucketed contract makes TorchCall pass in."""

    def forward(self, ids):
        return ids.sum(dim=1), torch.tensor(ids.shape, dtype=torch.int64)


class Table(torch.nn.Module):
    """x float32 [B] (ignored) -> the module's own buffer float32 [1024], the same storage on
    every call: TF outputs share it only if adopted without a copy."""

    def __init__(self):
        super().__init__()
        self.register_buffer("table", torch.arange(1024, dtype=torch.float32))

    def forward(self, x):
        return self.table


class Unaligned(torch.nn.Module):
    """x float32 [B] -> a copy of x that starts 4 bytes into its storage (not 64-byte aligned)."""

    def forward(self, x):
        buf = torch.zeros(x.shape[0] + 1, dtype=x.dtype)
        buf[1:] = x
        return buf[1:]


class Weighted(torch.nn.Module):
    """x float32 [B] and a table float32 [8] -> x * the table's sum: a package whose last input
    is a table the runtime holds (loaded from a tables file, never sent by the caller)."""

    def forward(self, x, table):
        return x * table.sum()


class Identity(torch.nn.Module):
    """x float32 [B] -> x itself: the result aliases the TF input buffer."""

    def forward(self, x):
        return x


@torch.library.custom_op("xgr_test::scale", mutates_args=())
def _scale(x: torch.Tensor) -> torch.Tensor:
    return x * 2.0


@_scale.register_fake
def _(x):
    return torch.empty_like(x)


class UsesPythonOp(torch.nn.Module):
    """Calls a custom op that only Python can run."""

    def forward(self, x):
        return _scale(x) + 1.0


def _refusal(torch_package, out: Path) -> str:
    """The message package_aoti refuses a Python-only custom op with (before compiling)."""
    from xgr_common.errors import ExportError

    program = torch_package.export_program(UsesPythonOp(), (torch.randn(4),))
    try:
        torch_package.package_aoti(program, out / "refused.pt2")
    except ExportError as err:
        return str(err)
    return "accepted"


def _with_contract(torch_package, source: Path, path: Path, contract):
    """The TorchScript module at ``source`` saved to ``path`` under ``contract``."""
    from dataclasses import replace

    package = replace(contract, path=path)
    torch.jit.save(torch.jit.load(str(source)), str(path),
                   _extra_files={torch_package.SIGNATURE_FILE: package.signature})
    return package


def _export_aoti(torch_package, module, example, dynamic, out, cache):
    program = torch_package.export_program(module, example, dynamic)
    return torch_package.package_aoti(program, out, cache_dir=cache)


def main(out: Path, cache: Path) -> None:
    from xgr_export import torch_package  # first: it takes Triton before anything else

    out.mkdir(parents=True, exist_ok=True)
    batch = torch.export.Dim("batch", min=1, max=MAX_BATCH)
    length = torch.export.Dim("length", min=1, max=MAX_LEN)
    two_example = (torch.randn(8, 4), torch.arange(24, dtype=torch.int64).reshape(8, 3))
    rec_example = (torch.randint(0, 64, (4, 6), dtype=torch.int32),
                   torch.tensor([6, 3, 1, 5], dtype=torch.int32))
    one_dim = {(0, 0): ("batch", 1, MAX_BATCH)}
    built = {
        "two_heads_aoti": _export_aoti(torch_package, TwoHeads(), two_example,
                                       ({0: batch}, {0: batch, 1: length}),
                                       out / "two_heads.pt2", cache),
        "two_heads_script": torch_package.package_torchscript(
            TwoHeads(), two_example, out / "two_heads.pt",
            {(0, 0): ("batch", 1, MAX_BATCH), (1, 0): ("batch", 1, MAX_BATCH),
             (1, 1): ("length", 1, MAX_LEN)}),
        "recommender": torch_package.package_torchscript(
            ToyRecommender(), rec_example, out / "recommender.pt",
            {(0, 0): ("batch", 1, MAX_BATCH), (0, 1): ("length", 1, MAX_LEN),
             (1, 0): ("batch", 1, MAX_BATCH)}),
    }
    built["excluder"] = torch_package.package_torchscript(
        ToyExcluder(), (*rec_example, torch.tensor([[-1, -1]] * 4, dtype=torch.int64)),
        out / "excluder.pt", {(0, 0): ("batch", 1, MAX_BATCH), (0, 1): ("length", 1, MAX_LEN),
                              (1, 0): ("batch", 1, MAX_BATCH), (2, 0): ("batch", 1, MAX_BATCH),
                              (2, 1): ("exclude", 1, MAX_LEN)})
    # The excluder with the engine's value rules in its contract (no segments, no soft
    # tokens: those two rules do not apply), and one whose token rule lacks its limit.
    from xgr_common.value_rules import contract_lines

    excluder = built["excluder"]
    rules = contract_lines({"tokens": 0, "lengths": 1, "exclude": 2, "vocab": VOCAB},
                           skip=("segment_order", "positions"))
    for name, lines in (("ruled_excluder", rules),
                        ("rule_without_limit", [line.replace(f" vocab={VOCAB}", "")
                                                for line in rules])):
        ruled = torch_package.Package(out / f"{name}.pt", "torchscript", "cpu", excluder.inputs,
                                      excluder.outputs, excluder.ranges, tuple(lines))
        torch.jit.save(torch.jit.load(str(excluder.path)), str(ruled.path),
                       _extra_files={torch_package.SIGNATURE_FILE: ruled.signature})
        built[name] = ruled
    # The ruled excluder run at bucketed shapes (rows to a power of two, the prompt to a
    # multiple of 8, exclusion columns to a power of two; padding rows of length 1, padding
    # exclusions -1), as an engine package on CUDA is: same results as unbucketed.
    ruled = built["ruled_excluder"]
    bucketed = torch_package.Replay(
        buckets=(torch_package.Bucket(0, 0), torch_package.Bucket(0, 1, 8, 0),
                 torch_package.Bucket(2, 1)), pads=((1, 1), (2, -1)))
    outputs = (torch_package.TensorSpec("int64", ("batch", TOP_K)),
               torch_package.TensorSpec("float32", ("batch", TOP_K)))
    built["bucketed_excluder"] = _with_contract(
        torch_package, ruled.path, out / "bucketed_excluder.pt",
        torch_package.Package(Path(), "torchscript", "cpu", ruled.inputs, outputs,
                              ruled.ranges, ruled.rules, bucketed.lines()))
    probe = torch_package.package_torchscript(
        ShapeProbe(), (torch.ones(3, 6, dtype=torch.int64),), out / "shape_probe_raw.pt",
        {(0, 0): ("batch", 1, 6), (0, 1): ("length", 1, MAX_LEN)}, script=True)
    probe_replay = torch_package.Replay(
        buckets=(torch_package.Bucket(0, 0), torch_package.Bucket(0, 1, 8, 3)),
        pads=((0, 7),))
    built["shape_probe"] = _with_contract(
        torch_package, probe.path, out / "shape_probe.pt",
        torch_package.Package(Path(), "torchscript", "cpu", probe.inputs,
                              (torch_package.TensorSpec("int64", ("batch",)),
                               torch_package.TensorSpec("int64", (2,))),
                              probe.ranges, (), probe_replay.lines()))
    for name, module in (("double_in_place", DoubleInPlace()), ("table", Table()),
                         ("unaligned", Unaligned()),
                         ("identity", Identity())):
        built[name] = torch_package.package_torchscript(
            module, (torch.randn(8),), out / f"{name}.pt", one_dim, script=True)
    from dataclasses import replace

    weighted = torch_package.package_torchscript(
        Weighted(), (torch.randn(8), torch.ones(8)), out / "weighted_raw.pt", one_dim,
        script=True)
    built["weighted"] = _with_contract(torch_package, weighted.path, out / "weighted.pt",
                                       replace(weighted, tables=("weights.table",)))
    # A CPU module whose contract names CUDA: what a GPU export looks like on a CPU host.
    cuda = torch_package.Package(out / "cuda.pt", "torchscript", "cuda:0",
                                 built["identity"].inputs, built["identity"].outputs,
                                 built["identity"].ranges)
    torch.jit.save(torch.jit.script(Identity()), str(cuda.path),
                   _extra_files={torch_package.SIGNATURE_FILE: cuda.signature})
    built["cuda"] = cuda
    # A contract with a line the op cannot read.
    torch.jit.save(torch.jit.script(Identity()), str(out / "garbled.pt"),
                   _extra_files={torch_package.SIGNATURE_FILE: "device cpu\nin float32 n\n"
                                                               "sideways float32 n\n"})
    # A contract whose value rule names no reduction the op knows.
    torch.jit.save(torch.jit.script(Identity()), str(out / "bad_rule.pt"),
                   _extra_files={torch_package.SIGNATURE_FILE: "device cpu\nin float32 n\n"
                                                               "out float32 n\n"
                                                               "rule r x some: text\n"})
    # A well-formed rule line naming a rule the op cannot check.
    torch.jit.save(torch.jit.script(Identity()), str(out / "with_rule.pt"),
                   _extra_files={torch_package.SIGNATURE_FILE: "device cpu\nin float32 n\n"
                                                               "out float32 n\n"
                                                               "rule r x any: x must be finite\n"})
    # A contract that buckets a fixed dimension.
    torch.jit.save(torch.jit.script(Identity()), str(out / "bad_bucket.pt"),
                   _extra_files={torch_package.SIGNATURE_FILE: "device cpu\nin float32 4\n"
                                                               "out float32 4\n"
                                                               "bucket 0 0 pow2\n"})
    # A TorchScript file made without torch_package: no contract.
    torch.jit.save(torch.jit.script(Identity()), str(out / "bare.pt"))
    manifest = {name: package.to_json() for name, package in built.items()}
    manifest["refusals"] = {"python_custom_op": _refusal(torch_package, out)}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))


def main_cuda(out: Path, cache: Path) -> None:
    """The GPU set: TwoHeads as AOTInductor and TorchScript packages for cuda:0, and a package
    whose contract names a GPU this host does not have."""
    from xgr_export import torch_package

    out.mkdir(parents=True, exist_ok=True)
    batch = torch.export.Dim("batch", min=1, max=MAX_BATCH)
    length = torch.export.Dim("length", min=1, max=MAX_LEN)
    example = (torch.randn(8, 4), torch.arange(24, dtype=torch.int64).reshape(8, 3))
    program = torch_package.export_program(TwoHeads(), example, ({0: batch}, {0: batch, 1: length}),
                                           "cuda:0")
    # The same program run at bucketed shapes and replayed as CUDA graphs (at most 4 kept).
    graphed = torch_package.Replay(
        buckets=(torch_package.Bucket(0, 0), torch_package.Bucket(1, 1, 8, 0)), graphs=4)
    built = {
        "two_heads_aoti": torch_package.package_aoti(program, out / "two_heads_cuda.pt2",
                                                     "cuda:0", cache),
        "two_heads_graphed": torch_package.package_aoti(program, out / "two_heads_graphed.pt2",
                                                        "cuda:0", cache, replay=graphed),
        "two_heads_script": torch_package.package_torchscript(
            TwoHeads(), example, out / "two_heads_cuda.pt",
            {(0, 0): ("batch", 1, MAX_BATCH), (1, 0): ("batch", 1, MAX_BATCH),
             (1, 1): ("length", 1, MAX_LEN)}, device="cuda:0"),
    }
    missing = torch.cuda.device_count()  # the first GPU index this host does not have
    script = built["two_heads_script"]
    far = torch_package.Package(out / "far_gpu.pt", "torchscript", f"cuda:{missing}",
                                script.inputs, script.outputs, script.ranges)
    torch.jit.save(torch.jit.load(str(script.path)), str(far.path),
                   _extra_files={torch_package.SIGNATURE_FILE: far.signature})
    built["far_gpu"] = far
    (out / "manifest.json").write_text(json.dumps(
        {**{name: package.to_json() for name, package in built.items()}, "refusals": {}},
        indent=1))


if __name__ == "__main__":
    target = sys.argv[3] if len(sys.argv) > 3 else "cpu"
    (main_cuda if target == "cuda" else main)(Path(sys.argv[1]), Path(sys.argv[2]))
