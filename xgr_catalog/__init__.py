"""A catalog built from item embeddings: ``xgr catalog build``.

``build_catalog(CatalogBuildConfig) -> CatalogBuildReport`` reads item embeddings (Parquet or
``.npy``, from any encoder, or texts through a sentence-transformers model on disk), codes them
with residual k-means in torch on any device, caps the items one code path holds so every item
stays reachable, writes the catalog file ``xgr_checkpoint.catalog_file`` defines and reports
the catalog's quality (``docs/catalog_build.md``). One job a module:

- ``embeddings``: the source file read and checked row by row (``EmbeddingFileError``);
- ``text``: texts encoded by a sentence-transformers model (optional package);
- ``kmeans``: residual k-means (fit on all rows or a sample, encode every row, chunked);
- ``collisions``: at most ``max_items_per_path`` items a path;
- ``faiss_baseline``: faiss's residual quantiser on the same rows (optional package);
- ``report``: code use, items per path, reconstruction error, the plot;
- ``build``: the config and the entry point.

Needs torch, NumPy and pyarrow; never TensorFlow.
"""

from xgr_catalog.build import CatalogBuildConfig, build_catalog
from xgr_catalog.report import CatalogBuildReport

__all__ = ["CatalogBuildConfig", "CatalogBuildReport", "build_catalog"]
