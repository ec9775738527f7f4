"""The catalog file a team exports its model with: item ids and their semantic-ID code paths.

Two formats, chosen by the file's suffix:

``.parquet``
    one row per item; columns ``item_id`` and ``code_0`` ... ``code_{L-1}`` (L = the model's
    code levels). Other columns (titles, categories, timestamps) are ignored and reported. Only
    the needed columns are read.
``.npz``
    NumPy arrays ``item_id`` [N] and ``codes`` [N, L]; other arrays are ignored and reported.
    Read with ``allow_pickle=False``: object arrays are refused.

The rules, checked in this order (``docs/catalog_file.md`` has the table):

1. the path is an existing file whose suffix is ``.parquet`` or ``.npz`` and whose bytes are
   that format;
2. the ``item_id`` and ``code_l`` columns (arrays) are all there and no ``code_l`` column
   names a level beyond the model's (a catalog of another model);
3. each is of an integer type (signed or unsigned, any width). Floats are refused even when
   every value is integral: a float64 id is exact only below 2**53, so a float column means
   the writer already lost, or may lose, an id. Cast to an integer type when writing;
4. at least one row; ``codes`` is 2-D [N, L] with N = len(item_id);
5. no nulls (Parquet);
6. item ids fit int64 and are >= 0 (-1 means "no item" in the engine's results);
7. codes lie in [0, codebook_size);
8. item ids are unique (items may share a code path).

Every value check is one vectorised pass over a column. A broken rule raises
``xgr_common.errors.CatalogFileError`` whose message names the file, then the row (counted
from 0, in file order), the column and the value, and the rule; for a rule broken by many
rows, the first row and how many break it.
"""

from __future__ import annotations

import functools
import os
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from xgr_common.errors import CatalogFileError, ConfigError, require

PARQUET_SUFFIX = ".parquet"
NPZ_SUFFIX = ".npz"
SUFFIXES = (PARQUET_SUFFIX, NPZ_SUFFIX)
ID_COLUMN = "item_id"
NPZ_CODES = "codes"
_CODE_COLUMN = re.compile(r"code_(\d+)")
_INT64_MAX = np.iinfo(np.int64).max
_INT32_MAX = np.iinfo(np.int32).max
_DENSE_IDS_PER_ROW = 16   # ids below 16 * N are checked for repeats without a sort


def code_column(level: int) -> str:
    """The Parquet column of code level ``level`` (0-based): ``code_0``, ``code_1``, ..."""
    return f"code_{level}"


@dataclass(frozen=True)
class CatalogArrays:
    """A checked catalog file, rows in file order.

    ``item_ids`` int64 [N] (unique, >= 0); ``item_codes`` int32 [N, levels] C-contiguous, each
    in [0, codebook_size); row i is item ``item_ids[i]``'s code path. ``ignored_columns``: the
    file's other columns (Parquet) or arrays (``.npz``), in file order.
    """

    path: str
    format: str                       # "parquet" or "npz"
    item_ids: np.ndarray
    item_codes: np.ndarray
    codebook_size: int
    ignored_columns: tuple[str, ...] = field(default=())

    @property
    def num_items(self) -> int:
        return int(self.item_ids.shape[0])

    @property
    def levels(self) -> int:
        return int(self.item_codes.shape[1])

    @property
    def num_paths(self) -> int:
        """Distinct code paths (several items may share one)."""
        return self._path_counts[0]

    @property
    def max_items_per_path(self) -> int:
        """Most items on one code path."""
        return self._path_counts[1]

    @functools.cached_property
    def _path_counts(self) -> tuple[int, int]:
        # cached_property writes the instance __dict__ directly, which a frozen dataclass allows.
        return _path_counts(self.item_codes, self.codebook_size)


def read_catalog(path: str | os.PathLike, levels: int, codebook_size: int) -> CatalogArrays:
    """Reads and checks a catalog file (``.parquet`` or ``.npz``) for a model whose code paths
    have ``levels`` codes in ``[0, codebook_size)``.

    Returns ``CatalogArrays`` (int64 ids [N], int32 codes [N, levels], file order). Raises
    ``CatalogFileError`` naming the file, the row, column and value, and the rule broken;
    ``ConfigError`` when ``levels`` or ``codebook_size`` themselves are out of range.
    """
    require(isinstance(levels, int) and levels >= 1, ConfigError,
            f"read_catalog: levels must be an integer >= 1, got {levels!r}")
    require(isinstance(codebook_size, int) and 1 <= codebook_size <= _INT32_MAX + 1, ConfigError,
            f"read_catalog: codebook_size must be an integer in [1, 2**31], got {codebook_size!r}")
    where = os.fspath(path)
    suffix = _suffix_of(where)
    if suffix == PARQUET_SUFFIX:
        ids, code_columns, ignored = _read_parquet(where, levels)
    else:
        ids, code_columns, ignored = _read_npz(where, levels)
    item_ids = _checked_ids(where, ids)
    item_codes = _checked_codes(where, code_columns, codebook_size)
    _check_unique(where, item_ids)
    return CatalogArrays(where, suffix[1:], item_ids, item_codes, codebook_size, ignored)


def write_catalog(path: str | os.PathLike, item_ids, item_codes) -> Path:
    """Writes ``item_ids`` integer [N] and ``item_codes`` integer [N, L] as a catalog file, in
    the format of ``path``'s suffix (``.parquet``: columns ``item_id`` int64 and ``code_l``
    int32; ``.npz``: arrays ``item_id`` int64 and ``codes`` int32).

    The arrays are checked with the file's rules first (ids unique and >= 0, codes >= 0; the
    upper bound of the codes is the reader's, who knows the model), so a file written here
    reads back unless its codes exceed the model's codebook. The file appears whole or not at
    all (written beside it, then renamed). Returns the path.
    """
    where = os.fspath(path)
    suffix = _suffix_of(where, must_exist=False)
    ids, codes = np.asarray(item_ids), np.asarray(item_codes)
    _require(ids.ndim == 1, where, f"item_ids must be 1-D [N], got shape {ids.shape}")
    _require(codes.ndim == 2 and codes.shape[1] >= 1, where,
             f"item_codes must be 2-D [N, levels >= 1], got shape {codes.shape}")
    _require(codes.shape[0] == ids.shape[0], where,
             f"item_codes has {codes.shape[0]} rows, item_ids {ids.shape[0]}: one code path "
             f"per item")
    _require_integer_dtype(where, "item_ids", ids.dtype)
    _require_integer_dtype(where, "item_codes", codes.dtype)
    _require(ids.shape[0] >= 1, where, "the catalog has 0 rows; it needs at least one item")
    item_ids = _checked_ids(where, ids)
    item_codes = _checked_codes(where, [(f"item_codes[:, {level}]", codes[:, level])
                                        for level in range(codes.shape[1])], _INT32_MAX + 1)
    _check_unique(where, item_ids)
    target = Path(where)
    partial = target.with_name(f".{target.name}.partial")
    try:
        if suffix == PARQUET_SUFFIX:
            import pyarrow as pa
            import pyarrow.parquet as pq

            columns = {ID_COLUMN: pa.array(item_ids)}
            columns.update({code_column(level): pa.array(item_codes[:, level])
                            for level in range(item_codes.shape[1])})
            pq.write_table(pa.table(columns), partial)
        else:
            with open(partial, "wb") as handle:
                np.savez(handle, **{ID_COLUMN: item_ids, NPZ_CODES: item_codes})
        os.replace(partial, target)
    except OSError as error:
        raise CatalogFileError(f"{where}: cannot be written ({error.strerror or error})",
                               path=where) from None
    finally:
        partial.unlink(missing_ok=True)
    return target


# -- reading -----------------------------------------------------------------------------------

def _suffix_of(where: str, must_exist: bool = True) -> str:
    """The file's format suffix; refuses a missing path, a folder or an unknown suffix."""
    if must_exist:
        _require(os.path.exists(where), where, "no such file")
        _require(not os.path.isdir(where), where,
                 "is a folder; give one catalog file (a folder of Parquet parts can be merged "
                 "into one file with pyarrow.dataset)")
    suffix = Path(where).suffix.lower()
    _require(suffix in SUFFIXES, where,
             f"unknown suffix {Path(where).suffix!r}; a catalog file is {' or '.join(SUFFIXES)}")
    return suffix


def _read_parquet(where: str, levels: int):
    """-> (ids, [(column, codes of that level)], ignored columns) of a Parquet file; the schema
    is checked from the footer before any data is read, then only the needed columns are."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        schema = pq.read_schema(where)
    except (pa.ArrowException, OSError) as error:
        raise CatalogFileError(f"{where}: not a readable Parquet file ({error})",
                               path=where) from None
    names = list(schema.names)
    wanted = [ID_COLUMN] + [code_column(level) for level in range(levels)]
    _check_columns(where, names, wanted, levels)
    for name in wanted:
        kind = schema.field(name).type
        if pa.types.is_dictionary(kind):
            kind = kind.value_type
        _require(pa.types.is_integer(kind), where,
                 f"column {name!r} has type {schema.field(name).type}; rule: {name} must be an "
                 f"integer type{_float_note(pa.types.is_floating(kind))}", column=name)
    try:
        table = pq.read_table(where, columns=wanted, use_threads=True)
    except (pa.ArrowException, OSError) as error:
        raise CatalogFileError(f"{where}: its data cannot be read ({error})", path=where) from None
    _require(table.num_rows >= 1, where, "0 rows; a catalog needs at least one item")
    arrays = {}
    for name in wanted:
        column = table.column(name)
        if pa.types.is_dictionary(column.type):
            column = column.cast(column.type.value_type)
        if column.null_count:
            import pyarrow.compute as pc

            nulls = np.flatnonzero(pc.is_null(column).to_numpy(zero_copy_only=False))
            raise CatalogFileError(
                f"{where}: row {nulls[0]}, column {name!r}: null ({_count(nulls, 'null row')} "
                f"in that column); rule: {name} has a value in every row",
                path=where, row=int(nulls[0]), column=name)
        arrays[name] = column.to_numpy()
    ignored = tuple(name for name in names if name not in wanted)
    return arrays[ID_COLUMN], [(name, arrays[name]) for name in wanted[1:]], ignored


def _read_npz(where: str, levels: int):
    """-> (ids, [(column, codes of that level)], ignored arrays) of an ``.npz`` archive."""
    try:
        archive = np.load(where, allow_pickle=False)
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as error:
        raise CatalogFileError(f"{where}: not a readable .npz archive ({error})",
                               path=where) from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise CatalogFileError(f"{where}: holds one .npy array, not an .npz archive of arrays "
                               f"{ID_COLUMN!r} and {NPZ_CODES!r}", path=where)
    with archive:
        names = list(archive.files)
        missing = [name for name in (ID_COLUMN, NPZ_CODES) if name not in names]
        _require(not missing, where, f"no array {' or '.join(map(repr, missing))}; found "
                 f"arrays {names}; rule: an .npz catalog holds {ID_COLUMN!r} [N] and "
                 f"{NPZ_CODES!r} [N, levels={levels}]")
        ids, codes = (_npz_array(where, archive, name) for name in (ID_COLUMN, NPZ_CODES))
    _require(ids.ndim == 1, where, f"array {ID_COLUMN!r} has shape {ids.shape}; rule: it is "
             f"1-D [N]", column=ID_COLUMN)
    _require(codes.ndim == 2, where, f"array {NPZ_CODES!r} has shape {codes.shape}; rule: it "
             f"is 2-D [N, levels={levels}], one row of codes per item", column=NPZ_CODES)
    _require(codes.shape[1] == levels, where,
             f"array {NPZ_CODES!r} has {codes.shape[1]} code levels (shape {codes.shape}); "
             f"the model has {levels}", column=NPZ_CODES)
    _require(codes.shape[0] == ids.shape[0], where,
             f"array {NPZ_CODES!r} has {codes.shape[0]} rows, {ID_COLUMN!r} {ids.shape[0]}; "
             f"rule: one code path per item")
    _require_integer_dtype(where, f"array {ID_COLUMN!r}", ids.dtype, column=ID_COLUMN)
    _require_integer_dtype(where, f"array {NPZ_CODES!r}", codes.dtype, column=NPZ_CODES)
    _require(ids.shape[0] >= 1, where, "0 rows; a catalog needs at least one item")
    ignored = tuple(name for name in names if name not in (ID_COLUMN, NPZ_CODES))
    return ids, [(f"{NPZ_CODES}[:, {level}]", codes[:, level]) for level in range(levels)], ignored


def _check_columns(where: str, names: list[str], wanted: list[str], levels: int) -> None:
    """Every wanted Parquet column once; no code column beyond the model's levels."""
    repeated = sorted({name for name in names if names.count(name) > 1 and name in wanted})
    _require(not repeated, where, f"columns {repeated} appear more than once")
    missing = [name for name in wanted if name not in names]
    _require(not missing, where,
             f"no column {', '.join(map(repr, missing))}; found columns {names}; rule: a "
             f"Parquet catalog has {ID_COLUMN!r} and {code_column(0)!r} .. "
             f"{code_column(levels - 1)!r} (levels={levels})")
    extra = [name for name in names
             if _CODE_COLUMN.fullmatch(name) and name not in wanted]
    _require(not extra, where,
             f"code columns {extra} beyond the model's {levels} levels "
             f"({code_column(0)!r} .. {code_column(levels - 1)!r}): the file was made for "
             f"another number of levels", column=extra[0] if extra else None)


# -- value checks, shared by the reader and the writer -----------------------------------------

def _checked_ids(where: str, ids: np.ndarray) -> np.ndarray:
    """``ids`` (any integer dtype) as int64, after the range rules: fits int64, >= 0."""
    if ids.dtype == np.uint64:
        beyond = np.flatnonzero(ids > np.uint64(_INT64_MAX))
        if beyond.shape[0]:
            row = int(beyond[0])
            raise CatalogFileError(
                f"{where}: row {row}, column {ID_COLUMN!r}: value {int(ids[row])} does not fit "
                f"int64 ({_count(beyond, 'row')}); rule: item ids lie in [0, 2**63)",
                path=where, row=row, column=ID_COLUMN)
    ids64 = np.ascontiguousarray(ids, dtype=np.int64)
    if not ids64.flags.writeable:   # a zero-copy view of Arrow's buffer: hand out our own
        ids64 = ids64.copy()
    if int(ids64.min()) < 0:
        negative = np.flatnonzero(ids64 < 0)
        row = int(negative[0])
        raise CatalogFileError(
            f"{where}: row {row}, column {ID_COLUMN!r}: value {int(ids64[row])} is negative "
            f"({_count(negative, 'row')}); rule: item ids are >= 0 (-1 means 'no item' in the "
            f"engine's results)", path=where, row=row, column=ID_COLUMN)
    return ids64


def _checked_codes(where: str, columns: list[tuple[str, np.ndarray]],
                   codebook_size: int) -> np.ndarray:
    """The code columns (any integer dtype) as int32 [N, levels] C-contiguous, after the rule
    0 <= code < codebook_size. Each column is checked in its own dtype, before the cast, so a
    value beyond int32 cannot wrap into range."""
    count = columns[0][1].shape[0]
    codes = np.empty((count, len(columns)), dtype=np.int32)
    for level, (name, values) in enumerate(columns):
        low, high = int(values.min()), int(values.max())
        if low < 0 or high >= codebook_size:
            bad = np.flatnonzero((values < 0) | (values >= codebook_size))
            row = int(bad[0])
            raise CatalogFileError(
                f"{where}: row {row}, column {name!r}: value {int(values[row])} is outside "
                f"[0, {codebook_size}) ({_count(bad, 'row')} in that column); rule: codes lie "
                f"in [0, codebook_size={codebook_size})", path=where, row=row, column=name)
        codes[:, level] = values
    return codes


def _check_unique(where: str, ids: np.ndarray) -> None:
    """Item ids (int64 >= 0) are unique; names the first repeated id and two of its rows."""
    largest = int(ids.max())
    if largest < max(_DENSE_IDS_PER_ROW * ids.shape[0], 2**20):
        # Dense ids (the usual 0..N-1 and near it): one scatter into a mark per id value
        # (at most 16 bytes a row) instead of a sort, several times faster at 10M rows.
        seen = np.zeros(largest + 1, dtype=np.bool_)
        seen[ids] = True
        if int(np.count_nonzero(seen)) == ids.shape[0]:
            return
    ordered = np.sort(ids)
    repeats = np.flatnonzero(ordered[1:] == ordered[:-1])
    if repeats.shape[0]:
        value = int(ordered[repeats[0]])
        rows = np.flatnonzero(ids == value)
        distinct = np.unique(ordered[repeats])
        raise CatalogFileError(
            f"{where}: column {ID_COLUMN!r}: item id {value} appears in rows {int(rows[0])} and "
            f"{int(rows[1])} ({_count(distinct, 'repeated id')} in all); rule: item ids are "
            f"unique",
            path=where, row=int(rows[1]), column=ID_COLUMN)


def _require_integer_dtype(where: str, what: str, dtype: np.dtype, column: str | None = None):
    _require(np.issubdtype(dtype, np.integer), where,
             f"{what} has dtype {dtype}; rule: it must be an integer type"
             f"{_float_note(np.issubdtype(dtype, np.floating))}", column=column)


def _float_note(floating: bool) -> str:
    return (" (floats are refused even when every value is integral: cast to int64 when "
            "writing)") if floating else ""


def _count(rows: np.ndarray, noun: str) -> str:
    """``"1 row"``, ``"3 rows"``: how many entries ``rows`` holds."""
    return f"{rows.shape[0]} {noun}{'' if rows.shape[0] == 1 else 's'}"


def _npz_array(where: str, archive, name: str) -> np.ndarray:
    """One array of an open ``.npz``; a pickled (object) or damaged member names itself."""
    try:
        return archive[name]
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as error:
        raise CatalogFileError(f"{where}: array {name!r} cannot be read ({error})",
                               path=where, column=name) from None


def _require(condition: bool, where: str, message: str, column: str | None = None) -> None:
    if not condition:
        raise CatalogFileError(f"{where}: {message}", path=where, column=column)


def _path_counts(codes: np.ndarray, codebook_size: int) -> tuple[int, int]:
    """(distinct code paths, most items on one path) of int32 codes [N, levels]."""
    count, levels = codes.shape
    space = float(codebook_size) ** levels
    if space < 2.0 ** 63:
        # One int64 key per path: the codes as digits in base codebook_size.
        key = np.zeros(count, dtype=np.int64)
        for level in range(levels):
            key = key * codebook_size + codes[:, level]
        if space <= max(4 * count, 2**20):
            # Few possible paths (256**3 against 10M rows): count them, no sort.
            per_path = np.bincount(key)
            return int(np.count_nonzero(per_path)), int(per_path.max())
        key.sort()
        starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    else:
        ordered = codes[np.lexsort(codes.T[::-1])]
        starts = np.flatnonzero(np.r_[True, np.any(ordered[1:] != ordered[:-1], axis=1)])
    sizes = np.diff(np.r_[starts, codes.shape[0]])
    return int(starts.shape[0]), int(sizes.max())
