"""``xgr catalog FILE --levels 3 --codebook_size 256 [--to OUT]``: check a catalog file.

Reads FILE (``.parquet`` or ``.npz``, see ``docs/catalog_file.md``) with every rule
``xgr export`` applies, then prints a summary: rows, distinct code paths, most items on one
path, ignored columns. ``--to OUT`` then writes the checked catalog in OUT's format (npz <->
Parquet; ignored columns are not copied). Exit status 1 with the rule broken on a bad file,
2 on bad usage.
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


def main(argv: list[str]) -> int:
    from xgr_checkpoint.catalog_file import read_catalog, write_catalog
    from xgr_common.errors import XgrError

    if len(argv) != 2:
        print("usage: xgr catalog FILE --levels L --codebook_size C [--to OUT]\n"
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
