"""The quality report of a built catalog: code use per level, items per path, reconstruction
error, collisions, reachability, times, faiss beside ours; as text, JSON and a plot.

The plot needs matplotlib (imported here, only for the plot); where it is not installed the
report says so and the rest is written.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from xgr_catalog.collisions import path_keys


@dataclass(frozen=True)
class CatalogBuildReport:
    """What ``build_catalog`` did and how good the catalog is.

    ``errors``: mean squared residual norm after each level of residual k-means (before the
    cap); ``error_after_cap``: after the last level with the capped paths; ``variance``: the
    mean squared distance of the embeddings from their mean (the error of one centroid).
    ``code_use``: per level, the codes used, their perplexity (exp of the entropy of code use:
    ``codebook_size`` when all are used evenly), the largest code's share of the items and the
    distinct prefixes up to that level. ``paths``: distinct paths, most and mean items on one,
    the share of items on a shared path, and ``histogram`` {items on a path: paths}.
    ``collisions``: the cap and what moved (``xgr_catalog.collisions.CapResult``).
    ``reachability``: the beam width and top_k the catalog was built for and the items that
    beam reaches (``Catalog.reachable_items``'s bound). ``timings`` in seconds per stage.
    ``faiss``: faiss's residual quantiser on the same rows, when asked for.
    """

    catalog: str
    report_json: str | None
    plot: str | None
    plot_note: str | None
    items: int
    dim: int
    source: str
    levels: int
    codebook_size: int
    device: str
    seed: int
    iterations: int
    train_rows: int
    variance: float
    errors: tuple[float, ...]
    error_after_cap: float
    code_use: tuple[dict, ...]
    paths: dict
    collisions: dict
    reachability: dict
    timings: dict
    faiss: dict | None = None

    def to_json(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        """The lines ``xgr catalog build`` prints."""
        use = self.code_use
        paths, moved, reach = self.paths, self.collisions, self.reachability
        total = sum(self.timings.values())
        lines = [
            f"wrote {self.catalog}: {self.items} items ({self.source}, {self.dim} dims) -> "
            f"{self.levels} levels x {self.codebook_size} codes, on {self.device}",
            f"  codes used per level:   {', '.join(str(u['used']) for u in use)} of "
            f"{self.codebook_size} (perplexity {_floats(u['perplexity'] for u in use)})",
            f"  distinct paths:         {paths['paths']} (most items on one path "
            f"{paths['max_items_per_path']}, mean {paths['mean_items_per_path']:.2f}; "
            f"{100 * paths['items_on_shared_paths']:.1f}% of items share a path)",
            f"  reconstruction error:   {_floats(self.errors)} after each level "
            f"({100 * self.errors[-1] / self.variance:.1f}% of the variance "
            f"{self.variance:.4g}); {self.error_after_cap:.4g} after the cap",
            f"  {'collisions (cap ' + str(moved['cap']) + '):':<24}{moved['items_over_cap']} items "
            f"over the cap on "
            f"{moved['paths_over_cap']} paths (most {moved['max_items_per_path_before']}): "
            f"moved per level {', '.join(str(n) for n in moved['moved_per_level'])} (to the "
            f"nearest code with room)",
            f"  reachability:           beam {reach['beam_width']} reaches "
            f"{reach['reachable_items']} items (top_k {reach['top_k']}); every item on a path "
            f"of at most {paths['max_items_per_path']} items",
            "  time:                   " + ", ".join(f"{name} {seconds:.1f} s" for name, seconds
                                                     in self.timings.items())
            + f" (total {total:.1f} s)",
        ]
        if self.faiss is not None:
            faiss = self.faiss
            lines.append(
                f"  faiss ({faiss['settings']['library']}, same rows): fit "
                f"{faiss['train_s']:.1f} s, encode {faiss['encode_s']:.1f} s; error "
                f"{_floats(faiss['errors'])}; {faiss['num_paths']} paths, most "
                f"{faiss['max_items_per_path']} on one (ours: fit {self.timings['fit']:.1f} s, "
                f"encode {self.timings['encode']:.1f} s)")
        written = [path for path in (self.report_json, self.plot) if path]
        if written or self.plot_note:
            lines.append("  report:                 " + ", ".join(written)
                         + (f" ({self.plot_note})" if self.plot_note else ""))
        return "\n".join(lines)


def _floats(values) -> str:
    return ", ".join(f"{value:.4g}" for value in values)


def code_use(codes: torch.Tensor, codebook_size: int) -> tuple[dict, ...]:
    """Per level: codes used, perplexity of code use, the largest code's share, distinct
    prefixes up to that level."""
    count = codes.shape[0]
    found = []
    for level in range(codes.shape[1]):
        per_code = torch.bincount(codes[:, level], minlength=codebook_size).double()
        share = per_code / count
        entropy = float(-(share[share > 0] * share[share > 0].log()).sum())
        prefixes = int(torch.unique(path_keys(codes, codebook_size, level + 1)).shape[0])
        found.append({"level": level, "used": int((per_code > 0).sum()),
                      "perplexity": math.exp(entropy), "largest_share": float(share.max()),
                      "prefixes": prefixes, "counts": per_code.long().tolist()})
    return tuple(found)


def path_stats(codes: torch.Tensor, codebook_size: int) -> dict:
    """Distinct paths, most and mean items on one, share of items on a shared path, and the
    histogram {items on a path: paths}."""
    _, per_path = torch.unique(path_keys(codes, codebook_size), return_counts=True)
    histogram = torch.bincount(per_path)
    sizes = torch.nonzero(histogram).flatten().tolist()
    return {"paths": int(per_path.shape[0]), "max_items_per_path": int(per_path.max()),
            "mean_items_per_path": codes.shape[0] / per_path.shape[0],
            "items_on_shared_paths": float(per_path[per_path > 1].sum()) / codes.shape[0],
            "histogram": {int(size): int(histogram[size]) for size in sizes}}


def write_json(report: CatalogBuildReport, path: str | os.PathLike) -> str:
    Path(path).write_text(json.dumps(report.to_json(), indent=1) + "\n")
    return os.fspath(path)


def plot(report: CatalogBuildReport, path: str | os.PathLike) -> tuple[str | None, str | None]:
    """Writes the report's three panels as a PNG: (path, None), or (None, why not)."""
    try:
        import matplotlib

        matplotlib.use("Agg", force=True)
        import matplotlib.pyplot as plt
    except ImportError:
        return None, "no plot: matplotlib is not installed"
    figure, (use_axis, path_axis, error_axis) = plt.subplots(1, 3, figsize=(16, 4.5))
    for use in report.code_use:
        counts = sorted(use["counts"], reverse=True)
        use_axis.plot(range(1, len(counts) + 1), counts,
                      label=f"level {use['level']} ({use['used']} used, "
                            f"perplexity {use['perplexity']:.0f})")
    use_axis.set(title="code use per level", xlabel="code (by items, descending)",
                 ylabel="items", yscale="log")
    use_axis.legend(fontsize=8)
    histogram = report.paths["histogram"]
    path_axis.bar(list(histogram), list(histogram.values()), width=0.8)
    path_axis.axvline(report.collisions["cap"] + 0.5, color="red", linestyle="--",
                      label=f"cap {report.collisions['cap']}")
    path_axis.set(title=f"items per path ({report.paths['paths']} paths)",
                  xlabel="items on the path", ylabel="paths", yscale="log")
    path_axis.legend(fontsize=8)
    levels = range(1, report.levels + 1)
    relative = [error / report.variance for error in report.errors]
    error_axis.plot(levels, relative, marker="o", label="ours (residual k-means)")
    error_axis.plot([report.levels], [report.error_after_cap / report.variance], marker="x",
                    linestyle="none", color="red", label="ours after the cap")
    if report.faiss is not None:
        error_axis.plot(levels, [error / report.variance for error in report.faiss["errors"]],
                        marker="s", linestyle="--", label="faiss ResidualQuantizer")
    error_axis.set(title="reconstruction error", xlabel="levels", xticks=list(levels),
                   ylabel="mean squared residual / variance", ylim=(0, None))
    error_axis.legend(fontsize=8)
    figure.suptitle(f"{Path(report.catalog).name}: {report.items} items, {report.levels} x "
                    f"{report.codebook_size} codes")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return os.fspath(path), None
