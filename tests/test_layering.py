"""The allowed import directions between our packages, and the README table that states them.

``LAYERS`` is the one statement of the rules: every ``.py`` file under each top-level package is
parsed with ``ast`` and each import of one of our packages, or of a heavy library
(TensorFlow, torch, Triton, NumPy), is checked against its layer's row. The README's package
table is rendered from ``LAYERS`` (``python tests/test_layering.py`` prints it), and a test
checks that the README holds exactly that rendering, so the two cannot drift.

Imports made by name at run time (``importlib.import_module``: the ``xgr`` dispatcher, the lazy
names of ``xgr_export``) are not seen here.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
TABLE_START = "<!-- package table: rendered by `python tests/test_layering.py` -->"
TABLE_END = "<!-- end of package table -->"
MAX_E402 = 30
E402_MARK = "# noqa" + ": E402"   # split, so this file does not count itself

# Third-party top-level modules -> the heavy library they stand for.
HEAVY = {"tensorflow": "tensorflow", "keras": "tensorflow", "tf_keras": "tensorflow",
         "tf2onnx": "tensorflow", "tensorflow_serving": "tensorflow", "torch": "torch",
         "triton": "triton", "numpy": "numpy"}


@dataclass(frozen=True)
class Layer:
    """One row of the table: a package (or a subpackage with its own rule), its job, which of
    our packages and which heavy libraries it may import."""

    path: str
    job: str
    ours: tuple[str, ...]
    heavy: tuple[str, ...]
    note: str = ""


LAYERS = (
    Layer("xgr_common", "the shared leaves: error hierarchy, TF/Triton import order, tolerance "
          "table, token layout, prompt contract, buckets, value rules, serving names, the "
          "multi-GPU environment (NVLink multicast off)",
          (), (), "standard library only (`import_order` loads triton lazily)"),
    Layer("custom_ops", "C++ TF ops (history cleaning, semantic-ID table and lookup, prompt "
          "assembly, `TorchCall` in `custom_ops/torch_call.py` + `custom_ops/cc/torch_call/`), "
          "one registry TF op <-> ONNX node <-> Torch twin",
          ("xgr_common",), ("tensorflow", "numpy"), "never `torch_engine`"),
    Layer("custom_ops/torch_twins", "the Torch twins of the feature ops",
          ("xgr_common",), ("torch", "numpy")),
    Layer("tf_frontend", "the reference feature graph (Keras, named stages), the business "
          "rules, the TF halves every pipeline shares (`pipeline_spec`)",
          ("xgr_common", "custom_ops"), ("tensorflow", "numpy"), "never torch"),
    Layer("tf_frontend/serving", "the TF-Serving-compatible server: REST, gRPC, version "
          "folders, batching, metrics, warm-up",
          ("xgr_common", "custom_ops"), ("tensorflow", "numpy"), "never torch"),
    Layer("torch_engine", "Qwen2/Qwen3 model and HF checkpoint loading, catalog constraint "
          "tables, KV cache, the prompt-KV cache (`prompt_cache`: paged pool, host tier, "
          "content digests; its search: `cached_search`), Triton kernels beside plain-torch "
          "references, the search as plain functions (`search`), its runner (buffers, "
          "buckets, CUDA graphs: `runner`), the engine (argument checks + one runner call)",
          ("xgr_common",), ("torch", "triton", "numpy"), "never TensorFlow"),
    Layer("bridge", "DLPack hand-off (`from bridge import to_torch, to_tf`), the in-process "
          "pipeline, Torch layers in TF, migration plans, ONNX-to-Torch conversion, parity "
          "reports",
          ("xgr_common", "custom_ops", "tf_frontend", "torch_engine"),
          ("tensorflow", "torch", "numpy")),
    Layer("xgr_checkpoint", "a team's model files made ready for export: the catalog file "
          "(Parquet, `.npz`) and its checks, the layout's tokens added after a checkpoint's "
          "text vocabulary (transformers), the model card beside it",
          ("xgr_common", "torch_engine"), ("torch", "numpy"), "never TensorFlow"),
    Layer("xgr_catalog", "a catalog built from item embeddings (`xgr catalog build`): the "
          "embedding file read and checked (Parquet, `.npy`, texts through a "
          "sentence-transformers model), residual k-means in torch on any device, collision "
          "capping, the quality report and its plot, faiss's residual quantiser beside it, "
          "behind `build_catalog(CatalogBuildConfig) -> CatalogBuildReport`",
          ("xgr_common", "xgr_checkpoint"), ("torch", "numpy"),
          "pyarrow; faiss and sentence-transformers lazily; never TensorFlow"),
    Layer("xgr_world", "the demo world: synthetic catalog and users, training, residual "
          "k-means (`xgr_catalog`'s), the embedded default model, offline evaluation",
          ("xgr_common", "custom_ops", "tf_frontend", "torch_engine", "bridge",
           "xgr_checkpoint", "xgr_catalog"), ("tensorflow", "torch", "numpy")),
    Layer("xgr_export", "SavedModel export of the whole pipeline and its fresh-process "
          "verification, behind `export_saved_model(ExportConfig) -> ExportReport`",
          ("xgr_common", "custom_ops", "tf_frontend", "torch_engine", "bridge", "xgr_checkpoint",
           "xgr_world"), ("tensorflow", "torch", "numpy"),
          "`run_saved_model` (the reload child) needs only TF + `custom_ops`"),
    Layer("xgr_train", "a team's behaviour logs (Parquet) to a trained generative retriever: "
          "the logs cut into requests, fine-tuning (`xgr train`), offline evaluation against "
          "popularity and co-occurrence (`xgr evaluate`: a team's files read as export reads "
          "them)",
          ("xgr_common", "custom_ops", "tf_frontend", "torch_engine", "bridge",
           "xgr_checkpoint", "xgr_world", "xgr_export"), ("tensorflow", "torch", "numpy")),
    Layer("xgr_batch", "offline recommendation for every user of a Parquet file through an "
          "exported SavedModel (`xgr batch`): Ray Data actors, one model load each, part files "
          "written as they finish so a stopped job resumes",
          ("xgr_common", "custom_ops", "tf_frontend"), ("tensorflow", "numpy"),
          "ray and pyarrow; never torch"),
    Layer("xgr_cli", "the `xgr` command: flags -> configs -> one library call per subcommand",
          ("xgr_common", "custom_ops", "tf_frontend", "torch_engine", "bridge",
           "xgr_checkpoint", "xgr_catalog", "xgr_world", "xgr_export", "xgr_train",
           "xgr_batch"),
          ("tensorflow", "torch", "numpy"), "imported by nobody"),
)
NON_PACKAGES = (
    ("benchmarks", "benchmarks run as modules (`python -m benchmarks.bench_engine`) that time "
                   "our code beside its anchors; one current result each in "
                   "`benchmarks/results/`"),
    ("experiments", "probes and variants not adopted, outside `make test`"),
)
OURS = tuple(dict.fromkeys(layer.path.split("/")[0] for layer in LAYERS))


def layer_of(path: Path) -> Layer:
    """The most specific layer holding ``path`` (relative to the repository root)."""
    text = path.as_posix()
    matches = [layer for layer in LAYERS if text.startswith(layer.path + "/")]
    return max(matches, key=lambda layer: len(layer.path))


def _imports(tree: ast.AST, package: str) -> list[tuple[int, str]]:
    """(line, module) of every import in ``tree``; relative imports resolve to ``package``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append((node.lineno, package if node.level else node.module or ""))
    return found


def _source_files(packages: tuple[str, ...]) -> list[Path]:
    return sorted(path.relative_to(ROOT) for package in packages
                  for path in (ROOT / package).rglob("*.py") if "__pycache__" not in path.parts)


def violations(packages: tuple[str, ...] = OURS) -> list[str]:
    """One message per import in ``packages`` that breaks its layer's rule: file:line, the
    import, the rule."""
    problems = []
    for path in _source_files(packages):
        layer = layer_of(path)
        own = path.parts[0]
        for line, module in _imports(ast.parse((ROOT / path).read_text(), str(path)), own):
            top = module.split(".")[0]
            where = f"{path}:{line}: import {module}"
            if top == "xgr_cli" and own != "xgr_cli":
                problems.append(f"{where}: xgr_cli is imported by nobody")
            elif top in OURS and top != own and top not in layer.ours:
                problems.append(f"{where}: {layer.path} may import only "
                                f"{', '.join(layer.ours) or 'none of our packages'}")
            elif top in HEAVY and HEAVY[top] not in layer.heavy:
                problems.append(f"{where}: {layer.path} may not import {HEAVY[top]} "
                                f"(allowed: {', '.join(layer.heavy) or 'none'})")
    return problems


def render_table() -> str:
    """The README's package table, from ``LAYERS`` and ``NON_PACKAGES``."""
    rows = ["| package | job | may import |", "| --- | --- | --- |"]
    for layer in LAYERS:
        allowed = ", ".join([f"`{name}`" for name in layer.ours] + list(layer.heavy))
        allowed = "; ".join(filter(None, [allowed, layer.note])) or "-"
        rows.append(f"| `{layer.path}/` | {layer.job} | {allowed} |")
    rows += [f"| `{name}/` (outside the product) | {job} | anything |"
             for name, job in NON_PACKAGES]
    return "\n".join(rows)


def readme_table() -> str:
    text = README.read_text()
    assert TABLE_START in text and TABLE_END in text, \
        f"README.md lacks the package table markers {TABLE_START!r} ... {TABLE_END!r}"
    return text.split(TABLE_START, 1)[1].split(TABLE_END, 1)[0].strip()


def test_every_package_has_a_row():
    top_level = {path.parent.name for path in ROOT.glob("*/__init__.py")}
    missing = sorted(top_level - set(OURS) - {name for name, _ in NON_PACKAGES})
    assert not missing, f"top-level packages without a row in LAYERS (and the README): {missing}"


def test_imports_follow_the_layers():
    problems = violations()
    assert not problems, "imports against the package table:\n" + "\n".join(problems)


def test_the_checker_catches_a_forbidden_import(tmp_path, monkeypatch):
    """The control: a custom_ops module importing torch_engine, and one importing torch."""
    fake = tmp_path / "custom_ops"
    fake.mkdir()
    (fake / "bad.py").write_text("import torch\n\ndef f():\n    from torch_engine import engine\n")
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    problems = violations(("custom_ops",))
    assert problems == [
        "custom_ops/bad.py:1: import torch: custom_ops may not import torch "
        "(allowed: tensorflow, numpy)",
        "custom_ops/bad.py:4: import torch_engine: custom_ops may import only xgr_common"]


@pytest.mark.parametrize("path, layer", [("custom_ops/torch_twins/semantic_ids.py",
                                          "custom_ops/torch_twins"),
                                         ("custom_ops/torch_call.py", "custom_ops"),
                                         ("tf_frontend/serving/rest.py", "tf_frontend/serving")])
def test_a_file_takes_its_most_specific_layer(path, layer):
    assert layer_of(Path(path)).path == layer


def test_the_readme_table_is_the_layers():
    assert readme_table() == render_table(), (
        "README.md's package table differs from tests/test_layering.py's LAYERS: paste the "
        "output of `python tests/test_layering.py` between the table markers")


def _e402_counts() -> dict[str, int]:
    counts = {}
    for path in ROOT.rglob("*.py"):
        relative = path.relative_to(ROOT)
        if any(part.startswith(".") or part in ("build", "__pycache__") for part in relative.parts):
            continue
        count = path.read_text(errors="replace").count(E402_MARK)
        if count:
            counts[relative.as_posix()] = count
    return counts


def test_few_imports_need_an_e402_exemption():
    """The import-order preload lives in the package ``__init__``s, so a module that imports one
    of our packages first needs no exemption; at most ``MAX_E402`` remain."""
    counts = _e402_counts()
    total = sum(counts.values())
    top = sorted(counts.items(), key=lambda item: -item[1])[:10]
    assert total <= MAX_E402, f"{total} '{E402_MARK}' in the repository (at most {MAX_E402}); " \
                              f"most in: {top}"


if __name__ == "__main__":
    print(render_table())
