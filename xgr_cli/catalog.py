"""``xgr catalog FILE --levels 3 --codebook_size 256 [--to OUT]``: check a catalog file;
``xgr catalog build EMBEDDINGS --out CATALOG [...]``: build one from item embeddings.

Check: reads FILE (``.parquet`` or ``.npz``, see ``docs/catalog_file.md``) with every rule
``xgr export`` applies, then prints a summary: rows, distinct code paths, most items on one
path, ignored columns. ``--to OUT`` then writes the checked catalog in OUT's format (npz <->
Parquet; ignored columns are not copied).

Build: ``xgr_catalog.build_catalog`` (``docs/catalog_build.md``): item embeddings (Parquet or
``.npy``, or texts through a sentence-transformers model on disk) -> residual k-means on
``--device`` -> at most ``--max_items_per_path`` items a path -> the catalog file, its report
(JSON and a plot) beside it; ``--faiss`` adds faiss's residual quantiser on the same rows.

Exit status 1 with the rule broken on a bad file (or the row and column of a bad embedding
file), 2 on bad usage.
"""

from __future__ import annotations

import sys

from absl import flags

from xgr_common.layout import TokenLayout

FLAGS = flags.FLAGS
flags.DEFINE_integer("levels", TokenLayout.levels, "Code levels of the model's semantic IDs.")
flags.DEFINE_integer("codebook_size", TokenLayout.codebook_size,
                     "Codes per level: each code lies in [0, codebook_size).")
flags.DEFINE_string("to", None, "Also write the checked catalog here (.parquet or .npz).")
# `xgr catalog build` (each flag is the CatalogBuildConfig field of its name)
flags.DEFINE_string("out", None, "build: the catalog file to write (.parquet or .npz); its "
                    "report goes beside it (<stem>.report.json, <stem>.report.png).")
flags.DEFINE_string("ids", None, "build: an .npy of item ids, one per row of an .npy of "
                    "embeddings (default: the row numbers).")
flags.DEFINE_string("id_column", "item_id", "build: the Parquet column of item ids.")
flags.DEFINE_string("embedding_column", "embedding", "build: the Parquet column of "
                    "embeddings (a list of floats per row).")
flags.DEFINE_string("text_model", None, "build: a sentence-transformers model folder on disk "
                    "that encodes --text_column instead (needs sentence-transformers).")
flags.DEFINE_string("text_column", None, "build: the Parquet column of item texts "
                    "(with --text_model; default 'text').")
flags.DEFINE_integer("text_batch_size", 256, "build: texts encoded per batch.")
flags.DEFINE_integer("dim", None, "build: the width every embedding must have (default: "
                     "whatever the file holds).")
flags.DEFINE_integer("iterations", 20, "build: Lloyd iterations per level.")
flags.DEFINE_integer("train_sample", None, "build: fit the codebooks on this many rows drawn "
                     "with --seed (default: all); every row is encoded.")
flags.DEFINE_integer("seed", 0, "build: the seed of the sample and of the k-means seeds.")
flags.DEFINE_string("device", "cpu", "build: where the k-means runs: cpu, cuda, cuda:N.")
flags.DEFINE_integer("chunk", 65_536, "build: rows per pass chunk (bounds the memory).")
flags.DEFINE_integer("max_items_per_path", 16, "build: the cap on items sharing one code "
                     "path; the others move to their next-nearest code with room (the last level first; a "
                     "prefix too crowded for its subtree spills at a higher level). Between "
                     "ceil(top_k / beam_width) and top_k.")
flags.DEFINE_integer("candidates", 64, "build: next-nearest codes computed at a time for the "
                     "items over a cap (bounds the memory; every code is tried in the end).")
flags.DEFINE_integer("beam_width", 256, "build: the beam the catalog is served with.")
flags.DEFINE_integer("top_k", 300, "build: the items a request asks for; the build fails when "
                     "the beam could not reach them.")
flags.DEFINE_bool("report", True, "build: write the report (JSON and plot) beside the catalog.")
flags.DEFINE_bool("faiss", False, "build: also fit faiss's residual quantiser (faiss-cpu) on "
                  "the same rows and report its time and error beside ours.")
flags.DEFINE_integer("faiss_beam", 1, "build: faiss's encoding beam (1: greedy, as ours).")
flags.DEFINE_bool("progress", True, "build: progress bars on stderr.")

BUILD_USAGE = ("usage: xgr catalog build EMBEDDINGS --out CATALOG [--levels L] "
               "[--codebook_size C] [--device cuda] [--max_items_per_path N] [--faiss] ...")
BUILD_FLAGS = ("out", "ids", "id_column", "embedding_column", "text_model", "text_column",
               "text_batch_size", "dim", "levels", "codebook_size", "iterations",
               "train_sample", "seed", "device", "chunk", "max_items_per_path", "candidates",
               "beam_width", "top_k", "report", "faiss", "faiss_beam", "progress")


def summary(catalog) -> str:
    """The lines ``xgr catalog`` prints for a checked ``CatalogArrays``."""
    ignored = ", ".join(catalog.ignored_columns) or "none"
    return "\n".join([
        f"{catalog.path}: a valid {catalog.format} catalog for {catalog.levels} levels x "
        f"{catalog.codebook_size} codes",
        f"  rows (items):            {catalog.num_items}",
        f"  distinct code paths:     {catalog.num_paths}",
        f"  most items on one path:  {catalog.max_items_per_path}",
        f"  item ids:                {int(catalog.item_ids.min())} .. "
        f"{int(catalog.item_ids.max())}",
        f"  ignored columns:         {ignored}",
    ])


def build(argv: list[str]) -> int:
    """``xgr catalog build EMBEDDINGS --out CATALOG``: flags -> ``CatalogBuildConfig`` ->
    ``build_catalog``; prints the report's summary."""
    from xgr_catalog import CatalogBuildConfig, build_catalog
    from xgr_common.errors import XgrError

    if len(argv) != 1 or not FLAGS.out:
        problem = "--out is required" if len(argv) == 1 else \
            f"expected one embedding file, got {argv}"
        print(f"{BUILD_USAGE}\nxgr catalog build: {problem}", file=sys.stderr)
        return 2
    try:
        config = CatalogBuildConfig(embeddings=argv[0], **{name: getattr(FLAGS, name)
                                                           for name in BUILD_FLAGS})
    except XgrError as error:
        print(f"{BUILD_USAGE}\nxgr catalog build: {error}", file=sys.stderr)
        return 2
    try:
        report = build_catalog(config)
    except XgrError as error:
        print(f"xgr catalog build: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    print(report.summary())
    return 0


def main(argv: list[str]) -> int:
    from xgr_checkpoint.catalog_file import read_catalog, write_catalog
    from xgr_common.errors import XgrError

    if len(argv) >= 2 and argv[1] == "build":
        return build(argv[2:])
    if len(argv) != 2:
        print("usage: xgr catalog FILE --levels L --codebook_size C [--to OUT]\n"
              f"       {BUILD_USAGE[7:]}\n"
              f"xgr catalog: expected one catalog file, got {argv[1:]}", file=sys.stderr)
        return 2
    if FLAGS.levels < 1 or FLAGS.codebook_size < 1:
        print(f"xgr catalog: --levels and --codebook_size must be >= 1, got "
              f"{FLAGS.levels} and {FLAGS.codebook_size}", file=sys.stderr)
        return 2
    try:
        catalog = read_catalog(argv[1], FLAGS.levels, FLAGS.codebook_size)
        print(summary(catalog))
        if FLAGS.to:
            written = write_catalog(FLAGS.to, catalog.item_ids, catalog.item_codes)
            print(f"wrote {written} ({catalog.num_items} rows)")
    except XgrError as error:
        print(f"xgr catalog: {error}", file=sys.stderr)
        return 1
    return 0
