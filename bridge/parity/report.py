"""Write a parity result as Markdown and HTML, with error histograms (matplotlib).

``<dir>/parity_report.md`` and ``<dir>/parity_report.html`` hold the same table (one row per
stage output, execution order, the first failure marked); ``<dir>/histograms/*.png`` show
log10 |migrated - TF| per floating-point output, with the dtype's ``atol`` drawn as a line.
"""

from __future__ import annotations

import html
import re
from pathlib import Path

import numpy as np
# A bare Figure, not pyplot: saving it picks the Agg renderer, so no display backend is chosen
# or needed (CI machines and servers have none).
from matplotlib.figure import Figure

from bridge.parity.compare import Comparison
from bridge.parity.harness import ParityResult
from xgr_common.tolerances import tolerance_for

# New columns go last, so tables read by scripts keep their first columns.
HEADERS = ("", "stage", "output", "dtype", "shape", "max abs err", "max rel err", "rel norm",
           "tolerance", "result", "runtime", "input shapes", "reads")


def _tolerance_text(row: Comparison) -> str:
    tol = tolerance_for(row.dtype)
    return "exact" if tol.exact else f"rel_norm {tol.rel_norm:g}, atol {tol.atol:g}, rtol {tol.rtol:g}"


def _cells(row: Comparison, first_failure: Comparison | None, result: ParityResult
           ) -> list[str]:
    mark = "first failure" if row is first_failure else ""
    verdict = "pass" if row.passed else f"FAIL: {row.problem}"
    tolerance = "-" if row.dtype == "-" else _tolerance_text(row)
    return [mark, row.stage, row.output, row.dtype, "x".join(map(str, row.shape)) or "scalar",
            f"{row.max_abs:.3g}", f"{row.max_rel:.3g}", f"{row.rel_norm:.3g}",
            tolerance, verdict, result.runtimes.get(row.stage, "-"),
            "; ".join(result.input_shapes.get(row.stage, ())) or "-",
            result.sources.get(row.stage) or "-"]


def _slug(row: Comparison) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{row.stage}__{row.output}").strip("_")


def plot_histogram(row: Comparison, path: Path) -> None:
    """log10 of the absolute errors of one float output; exact zeros counted in the title."""
    errors = row.abs_errors
    zeros = int(np.count_nonzero(errors == 0))
    nonzero = errors[errors > 0]
    fig = Figure(figsize=(5, 3))
    ax = fig.subplots()
    if nonzero.size:
        logs = np.log10(nonzero)
        # Explicit edges: errors that are all (nearly) equal still get a visible bar.
        edges = np.linspace(logs.min() - 0.5, logs.max() + 0.5, 41)
        ax.hist(logs, bins=edges, color="#d62728" if not row.passed else "#1f77b4")
    ax.axvline(np.log10(tolerance_for(row.dtype).atol), color="black", linestyle="--",
               label="atol")
    ax.set_xlabel("log10 |migrated - TF|")
    ax.set_ylabel("elements")
    ax.set_title(f"{row.stage} / {row.output} ({zeros} of {errors.size} exact)", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=80)


def write_report(result: ParityResult, directory: str | Path, title: str) -> Path:
    """Write the Markdown and HTML reports and the histograms; returns the Markdown path."""
    directory = Path(directory)
    (directory / "histograms").mkdir(parents=True, exist_ok=True)
    first = result.first_failure
    images = []
    for row in result.rows:
        if row.abs_errors is not None and row.abs_errors.size:
            path = directory / "histograms" / f"{_slug(row)}.png"
            plot_histogram(row, path)
            images.append((row, path.relative_to(directory).as_posix()))
    rows = [_cells(row, first, result) for row in result.rows]

    md = [f"# {title}", "", *result.summary().splitlines(), "",
          "| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    md += ["| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |"
           for cells in rows]
    md += ["", "## Error histograms", ""]
    md += [f"![{row.stage} / {row.output}]({src})" for row, src in images]
    md_path = directory / "parity_report.md"
    md_path.write_text("\n".join(md) + "\n")

    def tr(cells: list[str], failing: bool) -> str:
        style = ' style="background:#fde0e0"' if failing else ""
        return f"<tr{style}>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>"

    body = "\n".join(tr(cells, not row.passed) for cells, row in zip(rows, result.rows))
    figures = "\n".join(f'<figure><img src="{html.escape(src)}"><figcaption>'
                        f"{html.escape(row.stage)} / {html.escape(row.output)}</figcaption></figure>"
                        for row, src in images)
    summary = "<br>".join(html.escape(line) for line in result.summary().splitlines())
    (directory / "parity_report.html").write_text(
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        "<style>body{font-family:sans-serif}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 6px;font-size:13px}"
        "figure{display:inline-block;margin:4px}</style></head><body>"
        f"<h1>{html.escape(title)}</h1><p>{summary}</p><table><tr>"
        + "".join(f"<th>{html.escape(h)}</th>" for h in HEADERS) + f"</tr>\n{body}</table>"
        f"<h2>Error histograms</h2>{figures}</body></html>\n")
    return md_path
