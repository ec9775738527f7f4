"""The catalog file: both formats round trip, every rule refuses its bad file with a message
naming the file, row, column and value, the arrays read build the engine's Catalog, and
``xgr catalog`` checks and converts files as a user runs it."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from tests.child_env import child_env
from torch_engine.catalog import Catalog
from xgr_checkpoint.catalog_file import CatalogArrays, read_catalog, write_catalog
from xgr_common.errors import CatalogError, CatalogFileError, ConfigError
from xgr_common.layout import TokenLayout

ROOT = Path(__file__).resolve().parents[2]
LEVELS, SIZE = 3, 256
FORMATS = ("parquet", "npz")


def small_catalog(count: int = 40, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Unique shuffled ids and code paths with collisions (several items share a path)."""
    rng = np.random.default_rng(seed)
    ids = rng.permutation(np.arange(count, dtype=np.int64) * 5 + 3)
    paths = rng.integers(0, SIZE, (max(1, count // 4), LEVELS), dtype=np.int32)
    return ids, paths[rng.integers(0, paths.shape[0], count)]


IDS, CODES = small_catalog()


def parquet_columns(ids=IDS, codes=CODES, levels=LEVELS, **extra) -> dict:
    columns = {"item_id": pa.array(ids)}
    columns.update({f"code_{level}": pa.array(np.ascontiguousarray(codes[:, level]))
                    for level in range(levels)})
    columns.update(extra)
    return columns


def write_parquet(path: Path, columns: dict, **options) -> Path:
    pq.write_table(pa.table(columns), path, **options)
    return path


# -- round trips -------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", FORMATS)
def test_round_trip_keeps_rows_in_file_order(tmp_path, fmt):
    path = write_catalog(tmp_path / f"catalog.{fmt}", IDS, CODES)
    catalog = read_catalog(path, LEVELS, SIZE)
    assert isinstance(catalog, CatalogArrays) and catalog.format == fmt
    assert catalog.path == str(path) and catalog.ignored_columns == ()
    assert catalog.item_ids.dtype == np.int64 and catalog.item_ids.shape == (40,)
    assert catalog.item_codes.dtype == np.int32 and catalog.item_codes.shape == (40, LEVELS)
    assert catalog.item_codes.flags.c_contiguous
    np.testing.assert_array_equal(catalog.item_ids, IDS)
    np.testing.assert_array_equal(catalog.item_codes, CODES)


@pytest.mark.parametrize("fmt", FORMATS)
def test_arrays_read_build_the_same_engine_catalog(tmp_path, fmt):
    layout = TokenLayout(levels=LEVELS, codebook_size=SIZE)
    read = read_catalog(write_catalog(tmp_path / f"catalog.{fmt}", IDS, CODES), LEVELS, SIZE)
    built, expected = (Catalog.from_arrays(read.item_ids, read.item_codes, layout),
                       Catalog.from_arrays(IDS, CODES, layout))
    assert built.num_prefixes == expected.num_prefixes
    for name in ("path_indptr", "path_items", "item_lookup_ids", "item_lookup_rows"):
        assert torch.equal(getattr(built, name), getattr(expected, name)), name
    # The file's summary agrees with the engine's tables.
    assert read.num_paths == built.num_prefixes[-1] == len({tuple(row) for row in CODES})
    assert read.max_items_per_path == built.max_items_per_path


@pytest.mark.parametrize("scale, levels, codebook_size", [
    (1, LEVELS, SIZE),            # dense ids, paths counted in a table of 256**3
    (10**15, LEVELS, SIZE),       # sparse ids: the repeat check sorts
    (1, 4, 2**20),                # 2**80 possible paths: counted by sorting rows
    (1, 2, 2**31),                # the widest codebook int32 codes hold
])
def test_summary_counts_paths_and_ids_check_at_any_scale(tmp_path, scale, levels,
                                                         codebook_size):
    rng = np.random.default_rng(2)
    codes = rng.integers(0, min(codebook_size, 3), (60, levels), dtype=np.int32)
    codes[:, -1] += codebook_size - 3  # the top of the codebook is used too
    ids = rng.permutation(60).astype(np.int64) * scale
    read = read_catalog(write_catalog(tmp_path / "c.npz", ids, codes), levels, codebook_size)
    assert read.num_paths == len({tuple(row) for row in codes})
    assert read.max_items_per_path == max(np.unique(codes, axis=0, return_counts=True)[1])
    np.testing.assert_array_equal(read.item_ids, ids)


@pytest.mark.parametrize("fmt", FORMATS)
def test_conversion_between_formats_keeps_the_arrays(tmp_path, fmt):
    other = "npz" if fmt == "parquet" else "parquet"
    first = read_catalog(write_catalog(tmp_path / f"a.{fmt}", IDS, CODES), LEVELS, SIZE)
    second = read_catalog(write_catalog(tmp_path / f"b.{other}", first.item_ids,
                                        first.item_codes), LEVELS, SIZE)
    np.testing.assert_array_equal(second.item_ids, first.item_ids)
    np.testing.assert_array_equal(second.item_codes, first.item_codes)


@pytest.mark.parametrize("id_type, code_type", [
    (pa.int32(), pa.int8()), (pa.uint64(), pa.uint8()), (pa.int64(), pa.uint16()),
    (pa.uint32(), pa.int64())])
def test_any_integer_type_that_fits_is_read(tmp_path, id_type, code_type):
    columns = {"item_id": pa.array(IDS).cast(id_type)}
    # int8 holds codes only below 128: this catalog's codes are brought under it for int8.
    codes = CODES % 128 if code_type == pa.int8() else CODES
    columns.update({f"code_{l}": pa.array(codes[:, l]).cast(code_type) for l in range(LEVELS)})
    catalog = read_catalog(write_parquet(tmp_path / "typed.parquet", columns), LEVELS, SIZE)
    np.testing.assert_array_equal(catalog.item_ids, IDS)
    np.testing.assert_array_equal(catalog.item_codes, codes)
    assert catalog.item_ids.dtype == np.int64 and catalog.item_codes.dtype == np.int32


def test_dictionary_encoded_columns_and_other_columns_are_read_and_reported(tmp_path):
    columns = parquet_columns(title=pa.array([f"item {i}" for i in IDS]),
                              score=pa.array(np.linspace(0, 1, IDS.shape[0])))
    columns["code_0"] = columns["code_0"].dictionary_encode()
    order = ["title", "item_id", "code_0", "score", "code_1", "code_2"]
    path = write_parquet(tmp_path / "meta.parquet", {name: columns[name] for name in order})
    catalog = read_catalog(path, LEVELS, SIZE)
    assert catalog.ignored_columns == ("title", "score")
    np.testing.assert_array_equal(catalog.item_codes, CODES)


def test_a_compressed_npz_reads_like_a_plain_one(tmp_path):
    np.savez_compressed(tmp_path / "packed.npz", item_id=IDS, codes=CODES)
    catalog = read_catalog(tmp_path / "packed.npz", LEVELS, SIZE)
    np.testing.assert_array_equal(catalog.item_codes, CODES)


def test_npz_extra_arrays_are_reported(tmp_path):
    path = tmp_path / "extra.npz"
    np.savez(path, item_id=IDS, codes=CODES, embeddings=np.zeros((40, 4), np.float32))
    assert read_catalog(path, LEVELS, SIZE).ignored_columns == ("embeddings",)


def test_rows_are_counted_across_row_groups(tmp_path):
    ids = IDS.astype(object)
    ids[33] = None
    path = write_parquet(tmp_path / "groups.parquet",
                         parquet_columns(ids=pa.array(list(ids), pa.int64())), row_group_size=8)
    assert pq.ParquetFile(path).metadata.num_row_groups == 5
    with pytest.raises(CatalogFileError, match="row 33, column 'item_id': null") as caught:
        read_catalog(path, LEVELS, SIZE)
    assert caught.value.row == 33


# -- bad files: each rule ----------------------------------------------------------------------

def _bytes(name: str, data: bytes):
    def build(tmp_path):
        (tmp_path / name).write_bytes(data)
        return tmp_path / name
    return build


def _parquet(**changes):
    """A Parquet file whose columns are the good ones with ``changes`` (None drops one)."""
    def build(tmp_path):
        columns = {**parquet_columns(), **changes}
        return write_parquet(tmp_path / "bad.parquet",
                             {k: v for k, v in columns.items() if v is not None})
    return build


def _npz(**arrays):
    def build(tmp_path):
        chosen = {"item_id": IDS, "codes": CODES, **arrays}
        np.savez(tmp_path / "bad.npz", **{k: v for k, v in chosen.items() if v is not None})
        return tmp_path / "bad.npz"
    return build


def _npy_as_npz(tmp_path):
    with open(tmp_path / "single.npz", "wb") as handle:
        np.save(handle, CODES)
    return tmp_path / "single.npz"


def _duplicate_names(tmp_path):
    arrays = [pa.array(IDS), pa.array(IDS)] + [pa.array(CODES[:, l]) for l in range(LEVELS)]
    table = pa.Table.from_arrays(arrays, names=["item_id", "item_id", "code_0", "code_1",
                                                "code_2"])
    pq.write_table(table, tmp_path / "twice.parquet")
    return tmp_path / "twice.parquet"


def _with(column: int, row: int, value, dtype=np.int64):
    """CODES with one value changed (in a dtype wide enough to hold it)."""
    codes = CODES.astype(dtype)
    codes[row, column] = value
    return codes


def _ids_with(row: int, value, dtype=np.int64):
    """IDS with one value changed."""
    ids = IDS.astype(dtype)
    ids[row] = value
    return ids


def _column(values, level):
    return pa.array(np.ascontiguousarray(values[:, level]))


def _nulls(values, row):
    listed = [int(v) for v in values]
    listed[row] = None
    return pa.array(listed, pa.int64())


BIG = np.uint64(2**63 + 5)
# name -> (build(tmp_path) -> path, expected pieces of the message, row, column)
BAD_FILES = {
    "missing file": (lambda tmp_path: tmp_path / "absent.parquet", ["no such file"], None, None),
    "folder": (lambda tmp_path: tmp_path, ["is a folder"], None, None),
    "unknown suffix": (_bytes("catalog.csv", b"item_id,code_0\n1,2\n"),
                       ["unknown suffix '.csv'", ".parquet or .npz"], None, None),
    "corrupt parquet": (_bytes("junk.parquet", b"PAR1 this is not a footer" * 3),
                        ["not a readable Parquet file"], None, None),
    "zero-byte parquet": (_bytes("zero.parquet", b""), ["not a readable Parquet file"],
                          None, None),
    "corrupt npz": (_bytes("junk.npz", b"PK\x03\x04 truncated zip"),
                    ["not a readable .npz archive"], None, None),
    "npy named npz": (_npy_as_npz, ["one .npy array, not an .npz archive"], None, None),
    "empty parquet": (_parquet(item_id=pa.array([], pa.int64()),
                               **{f"code_{l}": pa.array([], pa.int32()) for l in range(3)}),
                      ["0 rows"], None, None),
    "empty npz": (_npz(item_id=np.zeros(0, np.int64), codes=np.zeros((0, 3), np.int32)),
                  ["0 rows"], None, None),
    "no item_id": (_parquet(item_id=None, title=pa.array(["t"] * 40)),
                   ["no column 'item_id'", "found columns ['code_0', 'code_1', 'code_2', "
                    "'title']"], None, None),
    "fewer levels": (_parquet(code_2=None), ["no column 'code_2'",
                                             "found columns ['item_id', 'code_0', 'code_1']"],
                     None, None),
    "more levels": (_parquet(code_3=_column(CODES, 0)),
                    ["code columns ['code_3'] beyond the model's 3 levels"], None, "code_3"),
    "repeated column": (_duplicate_names, ["['item_id'] appear more than once"], None, None),
    "float ids": (_parquet(item_id=pa.array(IDS.astype(np.float64))),
                  ["column 'item_id' has type double", "must be an integer type",
                   "even when every value is integral"], None, "item_id"),
    "float codes": (_parquet(code_1=pa.array(CODES[:, 1].astype(np.float32))),
                    ["column 'code_1' has type float"], None, "code_1"),
    "string ids": (_parquet(item_id=pa.array([str(i) for i in IDS])),
                   ["column 'item_id' has type string; rule: item_id must be an integer "
                    "type"], None, "item_id"),
    "bool codes": (_parquet(code_0=pa.array(CODES[:, 0] > 9)),
                   ["column 'code_0' has type bool"], None, "code_0"),
    "null id": (_parquet(item_id=_nulls(IDS, 7)), ["row 7, column 'item_id': null"], 7,
                "item_id"),
    "null code": (_parquet(code_1=_nulls(CODES[:, 1], 12)),
                  ["row 12, column 'code_1': null (1 null row in that column)"], 12,
                  "code_1"),
    "negative id": (_parquet(item_id=pa.array(_ids_with(5, -1))),
                    ["row 5, column 'item_id': value -1 is negative", "'no item'"], 5,
                    "item_id"),
    "id beyond int64": (_parquet(item_id=pa.array(_ids_with(9, BIG, np.uint64))),
                        [f"row 9, column 'item_id': value {int(BIG)} does not fit int64"], 9,
                        "item_id"),
    "duplicate id": (_parquet(item_id=pa.array(_ids_with(30, IDS[4]))),
                     [f"item id {IDS[4]} appears in rows 4 and 30", "(1 repeated id in all)",
                      "unique"], 30, "item_id"),
    "code too large": (_parquet(code_2=_column(_with(2, 17, 300), 2)),
                       ["row 17, column 'code_2': value 300 is outside [0, 256)"], 17,
                       "code_2"),
    "negative code": (_parquet(code_0=_column(_with(0, 3, -2), 0)),
                      ["row 3, column 'code_0': value -2 is outside [0, 256)"], 3, "code_0"),
    # 2**32 + 5 would wrap to 5 in int32: it is checked before the cast.
    "code beyond int32": (_parquet(code_1=_column(_with(1, 2, 2**32 + 5), 1)),
                          [f"row 2, column 'code_1': value {2**32 + 5} is outside"], 2,
                          "code_1"),
    "npz without codes": (_npz(codes=None, code=CODES),
                          ["no array 'codes'", "found arrays ['item_id', 'code']"], None, None),
    "npz 1-D codes": (_npz(codes=CODES[:, 0]), ["array 'codes' has shape (40,)", "2-D"],
                      None, "codes"),
    "npz levels": (_npz(codes=np.zeros((40, 4), np.int32)),
                   ["array 'codes' has 4 code levels", "the model has 3"], None, "codes"),
    "npz lengths": (_npz(codes=CODES[:39]), ["'codes' has 39 rows, 'item_id' 40"], None, None),
    "npz 2-D ids": (_npz(item_id=IDS[:, None]), ["array 'item_id' has shape (40, 1)"], None,
                    "item_id"),
    "npz float codes": (_npz(codes=CODES.astype(np.float64)),
                        ["array 'codes' has dtype float64"], None, "codes"),
    "npz string ids": (_npz(item_id=IDS.astype(str)), ["array 'item_id' has dtype <U"], None,
                       "item_id"),
    "npz object ids": (_npz(item_id=np.array([int(i) for i in IDS], dtype=object)),
                       ["array 'item_id' cannot be read", "allow_pickle=False"], None,
                       "item_id"),
    "npz code too large": (_npz(codes=_with(1, 6, 256)),
                           ["row 6, column 'codes[:, 1]': value 256 is outside [0, 256)"], 6,
                           "codes[:, 1]"),
    # Ids far above the row count take the sorting check instead of the dense marks.
    "duplicate sparse id": (_parquet(item_id=pa.array(_ids_with(21, IDS[8]) * 10**12)),
                            [f"item id {IDS[8] * 10**12} appears in rows 8 and 21"], 21,
                            "item_id"),
    "npz duplicate id": (_npz(item_id=_ids_with(0, IDS[39])),
                         [f"item id {IDS[39]} appears in rows 0 and 39"], 39, "item_id"),
}


@pytest.mark.parametrize("case", BAD_FILES, ids=list(BAD_FILES))
def test_a_bad_file_names_the_file_row_column_and_rule(tmp_path, case):
    build, pieces, row, column = BAD_FILES[case]
    path = build(tmp_path)
    with pytest.raises(CatalogFileError) as caught:
        read_catalog(path, LEVELS, SIZE)
    message = str(caught.value)
    assert message.startswith(f"{path}: "), message
    for piece in pieces:
        assert piece in message, message
    assert (caught.value.path, caught.value.row, caught.value.column) == (str(path), row, column)
    assert isinstance(caught.value, CatalogError)
    again = pickle.loads(pickle.dumps(caught.value))   # crosses process pools intact
    assert (str(again), again.row, again.column) == (message, row, column)


@pytest.mark.parametrize("levels, codebook_size", [(0, 256), (3, 0), (3, 2**31 + 1), (2.0, 8)])
def test_a_bad_model_shape_is_a_config_error(tmp_path, levels, codebook_size):
    path = write_catalog(tmp_path / "catalog.npz", IDS, CODES)
    with pytest.raises(ConfigError, match="read_catalog: (levels|codebook_size)"):
        read_catalog(path, levels, codebook_size)


def test_the_codebook_size_is_the_readers(tmp_path):
    """A file is valid for one model and not another: codes up to 255 fit 256, not 128."""
    path = write_catalog(tmp_path / "catalog.parquet", IDS, CODES)
    read_catalog(path, LEVELS, 256)
    with pytest.raises(CatalogFileError, match=r"is outside \[0, 128\)"):
        read_catalog(path, LEVELS, 128)


@pytest.mark.parametrize("item_ids, item_codes, suffix, piece", [
    (IDS, CODES[:, 0], ".npz", "item_codes must be 2-D"),
    (IDS[:, None], CODES, ".npz", "item_ids must be 1-D"),
    (IDS, CODES[:5], ".parquet", "item_codes has 5 rows, item_ids 40"),
    (IDS.astype(np.float64), CODES, ".parquet", "item_ids has dtype float64"),
    (_ids_with(2, IDS[1]), CODES, ".npz", f"item id {IDS[1]} appears in rows 1 and 2"),
    (_ids_with(2, -4), CODES, ".parquet", "value -4 is negative"),
    (IDS, _with(0, 1, -1), ".npz", "value -1 is outside"),
    (IDS[:0], CODES[:0], ".npz", "0 rows"),
    (IDS, CODES, ".csv", "unknown suffix '.csv'"),
])
def test_write_refuses_arrays_the_reader_would_refuse(tmp_path, item_ids, item_codes, suffix,
                                                      piece):
    path = tmp_path / f"catalog{suffix}"
    with pytest.raises(CatalogFileError) as caught:
        write_catalog(path, item_ids, item_codes)
    assert piece in str(caught.value) and str(caught.value).startswith(str(path))
    assert list(tmp_path.iterdir()) == []   # nothing half-written is left behind


def test_write_into_a_missing_folder_names_the_file(tmp_path):
    path = tmp_path / "absent" / "catalog.parquet"
    with pytest.raises(CatalogFileError, match="catalog.parquet: cannot be written"):
        write_catalog(path, IDS, CODES)


# -- the command -------------------------------------------------------------------------------

def xgr_catalog(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "xgr_cli.main", "catalog", *map(str, args)],
                          cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=120)


def test_command_prints_a_summary_and_converts(tmp_path):
    source = write_parquet(tmp_path / "team.parquet",
                           parquet_columns(title=pa.array([f"t{i}" for i in IDS])))
    target = tmp_path / "team.npz"
    done = xgr_catalog(source, "--levels", "3", "--codebook_size", "256", "--to", target)
    assert done.returncode == 0, done.stderr
    paths = len({tuple(row) for row in CODES})
    most = max(np.unique(CODES, axis=0, return_counts=True)[1])
    for line in ("a valid parquet catalog for 3 levels x 256 codes", "rows (items):            40",
                 f"distinct code paths:     {paths}", f"most items on one path:  {most}",
                 f"item ids:                {IDS.min()} .. {IDS.max()}",
                 "ignored columns:         title", f"wrote {target} (40 rows)"):
        assert line in done.stdout, done.stdout
    converted = read_catalog(target, LEVELS, SIZE)
    np.testing.assert_array_equal(converted.item_ids, IDS)
    np.testing.assert_array_equal(converted.item_codes, CODES)


@pytest.mark.parametrize("args, status, piece", [
    (["{bad}", "--levels", "3"], 1, "row 17, column 'code_2': value 300 is outside [0, 256)"),
    (["{good}", "--levels", "2"], 1, "code columns ['code_2'] beyond the model's 2 levels"),
    (["{good}", "--codebook_size", "0"], 2, "must be >= 1"),
    ([], 2, "expected one catalog file"),
], ids=["bad code", "other levels", "bad flag", "no file"])
def test_command_refuses_bad_files_and_usage_without_a_traceback(tmp_path, args, status, piece):
    good = write_catalog(tmp_path / "good.parquet", IDS, CODES)
    bad = write_parquet(tmp_path / "bad.parquet", parquet_columns(codes=_with(2, 17, 300)))
    done = xgr_catalog(*[arg.format(good=good, bad=bad) for arg in args])
    assert done.returncode == status, (done.stdout, done.stderr)
    assert piece in done.stderr and "Traceback" not in done.stderr, done.stderr


# -- scale -------------------------------------------------------------------------------------

@pytest.mark.heavy
@pytest.mark.parametrize("fmt", FORMATS)
def test_ten_million_rows_round_trip(tmp_path, fmt):
    count = 10_000_000
    rng = np.random.default_rng(1)
    ids = rng.permutation(count).astype(np.int64) * 3
    codes = rng.integers(0, SIZE, (count, LEVELS), dtype=np.int32)
    catalog = read_catalog(write_catalog(tmp_path / f"big.{fmt}", ids, codes), LEVELS, SIZE)
    np.testing.assert_array_equal(catalog.item_ids, ids)
    np.testing.assert_array_equal(catalog.item_codes, codes)
    assert catalog.num_items == count and 0 < catalog.num_paths <= SIZE ** LEVELS
