"""``SemanticIdTable``: the semantic-ID catalog as a TF resource that SavedModels carry.

The catalog file (``custom_ops.catalog_file``) is a ``tf.saved_model.Asset``: saving copies it
into the SavedModel's ``assets/`` folder and loading re-initialises the table from the copy, in
a fresh process with only TensorFlow and ``custom_ops`` imported. The catalog never becomes a
graph constant, so a 10M-item catalog costs no graph size.

Use it like ``tf.lookup.StaticHashTable``: create it outside ``tf.function``, keep it as an
attribute of a ``tf.Module`` or Keras layer, call ``lookup`` inside the traced function.
"""

from __future__ import annotations

import os
import uuid

import numpy as np
import tensorflow as tf

from custom_ops._loader import load_library
from custom_ops.catalog_file import CatalogArrays, read_catalog, read_header, write_catalog
from custom_ops.feature_ops import CodeTokens, semantic_id_lookup


class SemanticIdTable(tf.saved_model.experimental.TrackableResource):
    """Item id -> code path of ``levels`` codes in ``[0, codebook_size)``.

    Args:
      catalog_path: a catalog file (``custom_ops.catalog_file.write_catalog``).
      levels, codebook_size: None reads them from the file's header; when given they must
        match it (the op checks again when the table is initialised).
    """

    def __init__(self, catalog_path: str | os.PathLike, levels: int | None = None,
                 codebook_size: int | None = None):
        if levels is None or codebook_size is None:
            header = read_header(catalog_path)  # the op validates the rest at init
            levels = header.levels if levels is None else levels
            codebook_size = header.codebook_size if codebook_size is None else codebook_size
        self._levels = int(levels)
        self._codebook_size = int(codebook_size)
        # A unique name per table, so two tables never share a resource (tf.saved_model.load
        # also suffixes shared names per load, so two loads of one SavedModel stay apart).
        self._shared_name = f"xgr_semantic_id_table_{uuid.uuid4().hex}"
        super().__init__()
        # TrackableResource does not track attributes by itself: without this the saved init
        # function would keep the original absolute path instead of the SavedModel's asset.
        self._asset = self._track_trackable(tf.saved_model.Asset(os.fspath(catalog_path)),
                                            name="catalog")
        with tf.init_scope():
            init_op = self._initialize()
        if not tf.executing_eagerly():
            # TF1-style graphs run table initialisers through tf.compat.v1.tables_initializer.
            tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.TABLE_INITIALIZERS, init_op)

    @classmethod
    def from_arrays(cls, catalog_path: str | os.PathLike, item_ids: np.ndarray,
                    codes: np.ndarray, codebook_size: int) -> "SemanticIdTable":
        """Writes ``item_ids`` int64 [N] and ``codes`` int [N, levels] to ``catalog_path``
        (validated: unique ids, codes in range) and builds the table on that file."""
        cat = write_catalog(catalog_path, item_ids, codes, codebook_size)
        return cls(catalog_path, cat.levels, cat.codebook_size)

    @property
    def levels(self) -> int:
        return self._levels

    @property
    def codebook_size(self) -> int:
        return self._codebook_size

    @property
    def catalog_path(self) -> tf.Tensor:
        """The asset's path (a string tensor; inside a loaded SavedModel, its assets copy)."""
        return self._asset.asset_path

    def catalog_arrays(self) -> CatalogArrays:
        """The catalog behind the table, sorted by id (eager only): what the ONNX node
        ``XgrSemanticIdLookup`` takes as its ``catalog_item_ids``/``catalog_codes`` inputs and
        what ``TorchSemanticIdTable`` is built from."""
        return read_catalog(self.catalog_path.numpy().decode())

    def _create_resource(self):
        return load_library("feature_ops").xgr_semantic_id_table_handle(
            shared_name=self._shared_name)

    def _initialize(self):
        return load_library("feature_ops").xgr_semantic_id_table_init_from_file(
            table=self.resource_handle, filename=self._asset.asset_path,
            levels=self._levels, codebook_size=self._codebook_size)

    def _destroy_resource(self):
        # Frees the catalog when this object (or its restored copy) is collected.
        tf.raw_ops.DestroyResourceOp(resource=self.resource_handle, ignore_lookup_error=True)

    def size(self) -> tf.Tensor:
        """Number of items (int64 scalar)."""
        return load_library("feature_ops").xgr_semantic_id_table_size(table=self.resource_handle)

    def lookup(self, items, row_splits, *, code_base: int) -> CodeTokens:
        """``custom_ops.semantic_id_lookup`` on this table: ragged items int64 [E] with
        row_splits [B+1] -> code tokens int64 [E', levels], row_splits, unknown_count [B]."""
        return semantic_id_lookup(self, items, row_splits, code_base=code_base)
