"""Item embeddings read from a file, with their item ids, checked row by row.

Two formats, chosen by the suffix:

``.parquet``
    one row per item: an integer id column (``item_id``) and either an embedding column
    (``embedding``: a list of floats per row, ``list<float>`` or ``fixed_size_list<float, d>``,
    any float width) or a text column that a sentence-transformers model on disk encodes
    (``xgr_catalog.text``). Other columns are ignored and reported; only the needed ones are
    read.
``.npy``
    one float array ``[N, d]``; the item ids are the row numbers, or come from a second
    ``.npy`` of ``N`` integers (``ids_path``).

The rules: the file reads as its format; the columns are there with their types; at least one
row; no nulls; every row has the same number of values (``dim`` when given); every value is
finite; ids fit int64, are ``>= 0`` and unique (the catalog file's own rules). A broken rule
raises ``xgr_common.errors.EmbeddingFileError`` naming the file, then the row (from 0, in file
order), the column and the value, and the rule; for a rule many rows break, the first row and
how many.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from xgr_common.errors import EmbeddingFileError

PARQUET_SUFFIX, NPY_SUFFIX = ".parquet", ".npy"
SUFFIXES = (PARQUET_SUFFIX, NPY_SUFFIX)
CHECK_ROWS = 1 << 18          # rows per vectorised check (bounded temporaries)


@dataclass(frozen=True)
class ItemEmbeddings:
    """Checked items, rows in file order: ``item_ids`` int64 [N] (unique, >= 0),
    ``embeddings`` float32 [N, d] C-contiguous; ``source`` says where the vectors came from;
    ``ignored_columns``: the file's other columns (Parquet)."""

    path: str
    item_ids: np.ndarray
    embeddings: np.ndarray
    source: str
    ignored_columns: tuple[str, ...] = field(default=())

    @property
    def num_items(self) -> int:
        return int(self.item_ids.shape[0])

    @property
    def dim(self) -> int:
        return int(self.embeddings.shape[1])


def read_embeddings(path: str | os.PathLike, *, ids_path: str | os.PathLike | None = None,
                    id_column: str = "item_id", embedding_column: str = "embedding",
                    text_column: str | None = None, text_model: str | None = None,
                    dim: int | None = None, device: str = "cpu", text_batch_size: int = 256,
                    progress: bool = True) -> ItemEmbeddings:
    """Reads and checks the items of ``path`` (see the module docstring). With ``text_model``
    (a sentence-transformers model folder) the Parquet column ``text_column`` is encoded on
    ``device`` instead of reading ``embedding_column``. Raises ``EmbeddingFileError`` naming
    the file, row, column and rule; ``ConfigError`` for a missing model or package."""
    where = os.fspath(path)
    suffix = _suffix_of(where)
    if suffix == NPY_SUFFIX:
        _require(text_model is None, where, "text needs a Parquet file with a text column; an "
                 ".npy holds vectors")
        vectors, label = _read_npy(where), None
        ids, id_label, ignored = _npy_ids(where, ids_path, vectors.shape[0]), "ids", ()
        source = ".npy array"
    elif text_model is not None:
        text_column = text_column or "text"
        id_values, texts, ignored = _read_parquet_text(where, id_column, text_column)
        from xgr_catalog.text import encode_texts

        vectors = encode_texts(texts, text_model, device, text_batch_size, progress)
        label, ids, id_label = text_column, id_values, id_column
        source = f"Parquet column {text_column!r} encoded by {text_model}"
    else:
        _require(ids_path is None, where, "ids_path goes with an .npy file; a Parquet file "
                 f"holds its ids in column {id_column!r}")
        ids, vectors, ignored = _read_parquet(where, id_column, embedding_column)
        label, id_label = embedding_column, id_column
        source = f"Parquet column {embedding_column!r}"
    if dim is not None:
        _require(vectors.shape[1] == dim, where,
                 f"{_where_in(label)}rows have {vectors.shape[1]} values (shape "
                 f"{vectors.shape}); the model's embedding dim (--dim) is {dim}", column=label)
    _check_finite(where, vectors, label)
    item_ids = _checked_ids(where, ids, id_label)
    embeddings = np.ascontiguousarray(vectors, dtype=np.float32)
    if isinstance(embeddings, np.memmap) or not embeddings.flags.writeable:
        embeddings = np.array(embeddings)   # in memory, ours (an .npy is read memory-mapped)
    return ItemEmbeddings(where, item_ids, embeddings, source, ignored)


# -- the formats -------------------------------------------------------------------------------

def _suffix_of(where: str) -> str:
    _require(os.path.exists(where), where, "no such file")
    _require(not os.path.isdir(where), where, "is a folder; give one embedding file")
    suffix = Path(where).suffix.lower()
    _require(suffix in SUFFIXES, where, f"unknown suffix {Path(where).suffix!r}; an embedding "
             f"file is {' or '.join(SUFFIXES)}")
    return suffix


def _read_npy(where: str) -> np.ndarray:
    """The ``[N, d]`` float array of an ``.npy``, memory-mapped (read when checked)."""
    try:
        array = np.load(where, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as error:
        raise EmbeddingFileError(f"{where}: not a readable .npy array ({error})",
                                 path=where) from None
    _require(array.ndim == 2, where, f"holds an array of shape {array.shape}; rule: an .npy of "
             f"embeddings is 2-D [N items, d values]")
    _require(array.shape[0] >= 1, where, "0 rows; a catalog needs at least one item")
    _require(array.shape[1] >= 1, where, f"rows have 0 values (shape {array.shape})")
    _require(np.issubdtype(array.dtype, np.floating), where,
             f"holds dtype {array.dtype}; rule: embeddings are floats")
    return array


def _npy_ids(where: str, ids_path, count: int) -> np.ndarray:
    """The ids of an ``.npy``'s rows: its row numbers, or the 1-D integer ``.npy`` at
    ``ids_path``."""
    if ids_path is None:
        return np.arange(count, dtype=np.int64)
    source = os.fspath(ids_path)
    try:
        ids = np.load(source, allow_pickle=False)
    except (ValueError, OSError, EOFError) as error:
        raise EmbeddingFileError(f"{source}: not a readable .npy of item ids ({error})",
                                 path=source) from None
    _require(ids.ndim == 1 and ids.shape[0] == count, source,
             f"item ids of shape {ids.shape}; rule: one id per row of {where} ({count},)")
    _require(np.issubdtype(ids.dtype, np.integer), source,
             f"item ids of dtype {ids.dtype}; rule: an integer type")
    return ids


def _parquet_schema(where: str):
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.read_schema(where)
    except (pa.ArrowException, OSError) as error:
        raise EmbeddingFileError(f"{where}: not a readable Parquet file ({error})",
                                 path=where) from None


def _read_table(where: str, columns: list[str]):
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(where, columns=columns, use_threads=True)
    except (pa.ArrowException, OSError) as error:
        raise EmbeddingFileError(f"{where}: its data cannot be read ({error})",
                                 path=where) from None
    _require(table.num_rows >= 1, where, "0 rows; a catalog needs at least one item")
    return table


def _check_columns(where: str, schema, wanted: list[str]) -> tuple[str, ...]:
    names = list(schema.names)
    missing = [name for name in wanted if name not in names]
    _require(not missing, where, f"no column {', '.join(map(repr, missing))}; found columns "
             f"{names} (--id_column, --embedding_column, --text_column name them)")
    repeated = sorted({name for name in wanted if names.count(name) > 1})
    _require(not repeated, where, f"columns {repeated} appear more than once")
    return tuple(name for name in names if name not in wanted)


def _id_values(where: str, table, id_column: str) -> np.ndarray:
    import pyarrow as pa

    column = table.column(id_column)
    kind = column.type.value_type if pa.types.is_dictionary(column.type) else column.type
    _require(pa.types.is_integer(kind), where, f"column {id_column!r} has type {column.type}; "
             f"rule: item ids are integers", column=id_column)
    if pa.types.is_dictionary(column.type):
        column = column.cast(kind)
    _no_nulls(where, column, id_column)
    return column.to_numpy()


def _read_parquet(where: str, id_column: str, embedding_column: str):
    """-> (ids, vectors float [N, d], ignored columns) of a Parquet file with a list column."""
    import pyarrow as pa

    schema = _parquet_schema(where)
    ignored = _check_columns(where, schema, [id_column, embedding_column])
    kind = schema.field(embedding_column).type
    is_list = (pa.types.is_list(kind) or pa.types.is_large_list(kind)
               or pa.types.is_fixed_size_list(kind))
    _require(is_list and pa.types.is_floating(kind.value_type), where,
             f"column {embedding_column!r} has type {kind}; rule: a list of floats per row "
             f"(list<float> or fixed_size_list<float, d>)", column=embedding_column)
    table = _read_table(where, [id_column, embedding_column])
    ids = _id_values(where, table, id_column)
    column = table.column(embedding_column)
    _no_nulls(where, column, embedding_column)
    widths = _list_widths(column)
    width = int(widths[0])
    ragged = np.flatnonzero(widths != width)
    if ragged.shape[0]:
        row = int(ragged[0])
        raise EmbeddingFileError(
            f"{where}: row {row}, column {embedding_column!r}: {int(widths[row])} values, row 0 "
            f"has {width} ({_count(ragged, 'row')} of another width); rule: every embedding has "
            f"the same number of values", path=where, row=row, column=embedding_column)
    _require(width >= 1, where, f"column {embedding_column!r}: rows have 0 values",
             column=embedding_column)
    vectors = np.empty((table.num_rows, width), dtype=np.float32)
    start = 0
    for chunk in column.chunks:
        values = chunk.flatten()
        if values.null_count:
            import pyarrow.compute as pc

            at = int(np.flatnonzero(pc.is_null(values).to_numpy(zero_copy_only=False))[0])
            row = start + at // width
            raise EmbeddingFileError(
                f"{where}: row {row}, column {embedding_column!r}: null at dimension "
                f"{at % width}; rule: every value is a number", path=where, row=row,
                column=embedding_column)
        rows = len(chunk)
        vectors[start:start + rows] = values.to_numpy(zero_copy_only=False).reshape(rows, width)
        start += rows
    return ids, vectors, ignored


def _read_parquet_text(where: str, id_column: str, text_column: str):
    """-> (ids, texts as a list of str, ignored columns) of a Parquet file with a text column."""
    import pyarrow as pa

    schema = _parquet_schema(where)
    ignored = _check_columns(where, schema, [id_column, text_column])
    kind = schema.field(text_column).type
    _require(pa.types.is_string(kind) or pa.types.is_large_string(kind), where,
             f"column {text_column!r} has type {kind}; rule: text to encode is a string column "
             f"(--text_column)", column=text_column)
    table = _read_table(where, [id_column, text_column])
    ids = _id_values(where, table, id_column)
    column = table.column(text_column)
    _no_nulls(where, column, text_column)
    return ids, column.to_pylist(), ignored


def _list_widths(column) -> np.ndarray:
    """Values in each row of a (chunked) list column, int64 [N]."""
    import pyarrow.compute as pc

    return pc.list_value_length(column).to_numpy(zero_copy_only=False).astype(np.int64)


# -- the rules ---------------------------------------------------------------------------------

def _no_nulls(where: str, column, name: str) -> None:
    if column.null_count:
        import pyarrow.compute as pc

        nulls = np.flatnonzero(pc.is_null(column).to_numpy(zero_copy_only=False))
        raise EmbeddingFileError(
            f"{where}: row {int(nulls[0])}, column {name!r}: null ({_count(nulls, 'null row')} "
            f"in that column); rule: {name} has a value in every row", path=where,
            row=int(nulls[0]), column=name)


def _where_in(label: str | None) -> str:
    """``"column 'embedding': "``, or nothing for an ``.npy`` (one array, no columns)."""
    return "" if label is None else f"column {label!r}: "


def _check_finite(where: str, vectors: np.ndarray, label: str | None) -> None:
    """Every value finite; names the first row with a NaN or inf, its dimension and value."""
    for start in range(0, vectors.shape[0], CHECK_ROWS):
        block = np.asarray(vectors[start:start + CHECK_ROWS])
        finite = np.isfinite(block)
        if finite.all():
            continue
        bad_rows = np.flatnonzero(~finite.all(axis=1))
        row = start + int(bad_rows[0])
        dimension = int(np.flatnonzero(~finite[bad_rows[0]])[0])
        rest = sum(int((~np.isfinite(np.asarray(vectors[at:at + CHECK_ROWS]))).any(axis=1).sum())
                   for at in range(start + CHECK_ROWS, vectors.shape[0], CHECK_ROWS))
        count = bad_rows.shape[0] + rest
        raise EmbeddingFileError(
            f"{where}: row {row}{'' if label is None else f', column {label!r}'}: value "
            f"{block[bad_rows[0], dimension]} at "
            f"dimension {dimension} ({count} row{'' if count == 1 else 's'} with NaN or inf); "
            f"rule: every value is finite", path=where, row=row, column=label)


def _checked_ids(where: str, ids: np.ndarray, label: str) -> np.ndarray:
    """``ids`` as int64 after the catalog's rules: fit int64, ``>= 0``, unique."""
    if ids.dtype == np.uint64:
        beyond = np.flatnonzero(ids > np.uint64(np.iinfo(np.int64).max))
        if beyond.shape[0]:
            row = int(beyond[0])
            raise EmbeddingFileError(
                f"{where}: row {row}, column {label!r}: item id {int(ids[row])} does not fit "
                f"int64 ({_count(beyond, 'row')}); rule: item ids lie in [0, 2**63)",
                path=where, row=row, column=label)
    ids = np.array(ids, dtype=np.int64)
    negative = np.flatnonzero(ids < 0)
    if negative.shape[0]:
        row = int(negative[0])
        raise EmbeddingFileError(
            f"{where}: row {row}, column {label!r}: item id {int(ids[row])} is negative "
            f"({_count(negative, 'row')}); rule: item ids are >= 0 (-1 means 'no item' in the "
            f"engine's results)", path=where, row=row, column=label)
    ordered = np.sort(ids)
    repeats = np.flatnonzero(ordered[1:] == ordered[:-1])
    if repeats.shape[0]:
        value = int(ordered[repeats[0]])
        rows = np.flatnonzero(ids == value)
        distinct = np.unique(ordered[repeats])
        raise EmbeddingFileError(
            f"{where}: column {label!r}: item id {value} appears in rows {int(rows[0])} and "
            f"{int(rows[1])} ({_count(distinct, 'repeated id')} in all); rule: item ids are "
            f"unique", path=where, row=int(rows[1]), column=label)
    return ids


def _count(rows: np.ndarray, noun: str) -> str:
    return f"{rows.shape[0]} {noun}{'' if rows.shape[0] == 1 else 's'}"


def _require(condition: bool, where: str, message: str, column: str | None = None) -> None:
    if not condition:
        raise EmbeddingFileError(f"{where}: {message}", path=where, column=column)
