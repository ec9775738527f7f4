"""The embedding file ``xgr catalog build`` reads: each bad input (NaN, repeated ids, no rows,
rows of another width, wrong types, nulls) is refused with a message naming the file, the row
or column and the rule; good files of each shape read alike; texts go through a
sentence-transformers model on disk, and its absence names the flag."""

from __future__ import annotations

import sys
import types

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.catalog_build.items import write_parquet
from xgr_catalog.embeddings import read_embeddings
from xgr_common.errors import ConfigError, EmbeddingFileError

COUNT, DIM = 12, 16
IDS = np.arange(COUNT, dtype=np.int64) * 3 + 1
VECTORS = np.random.default_rng(0).normal(size=(COUNT, DIM)).astype(np.float32)


def with_value(row: int, dimension: int, value: float) -> np.ndarray:
    vectors = VECTORS.copy()
    vectors[row, dimension] = value
    return vectors


def ragged_column(short_row: int) -> pa.Array:
    rows = [list(map(float, vector)) for vector in VECTORS]
    rows[short_row] = rows[short_row][:-1]
    return pa.array(rows, type=pa.list_(pa.float32()))


# -- good files --------------------------------------------------------------------------------

@pytest.mark.parametrize("fixed", [True, False], ids=["fixed_size_list", "list"])
def test_parquet_rows_read_in_file_order_and_other_columns_are_reported(tmp_path, fixed):
    path = write_parquet(tmp_path / "items.parquet", IDS, VECTORS, fixed=fixed,
                         title=[f"t{i}" for i in IDS])
    items = read_embeddings(path, dim=DIM)
    np.testing.assert_array_equal(items.item_ids, IDS)
    np.testing.assert_array_equal(items.embeddings, VECTORS)
    assert items.embeddings.dtype == np.float32 and items.embeddings.flags.c_contiguous
    assert items.ignored_columns == ("title",) and items.dim == DIM


def test_float64_vectors_and_other_column_names_read_as_float32(tmp_path):
    column = pa.FixedSizeListArray.from_arrays(pa.array(VECTORS.astype(np.float64).ravel()),
                                               DIM)
    pq.write_table(pa.table({"sku": pa.array(IDS.astype(np.uint32)), "vec": column},
                            ), tmp_path / "items.parquet", row_group_size=5)
    items = read_embeddings(tmp_path / "items.parquet", id_column="sku", embedding_column="vec")
    np.testing.assert_allclose(items.embeddings, VECTORS)
    np.testing.assert_array_equal(items.item_ids, IDS)


def test_an_npy_takes_row_numbers_or_an_ids_file(tmp_path):
    np.save(tmp_path / "items.npy", VECTORS.astype(np.float16))
    items = read_embeddings(tmp_path / "items.npy")
    np.testing.assert_array_equal(items.item_ids, np.arange(COUNT))
    assert items.embeddings.dtype == np.float32 and items.embeddings.flags.writeable
    np.save(tmp_path / "ids.npy", IDS)
    np.testing.assert_array_equal(
        read_embeddings(tmp_path / "items.npy", ids_path=tmp_path / "ids.npy").item_ids, IDS)


# -- bad files: the row or column, and the rule ------------------------------------------------

def bad_parquet(tmp_path, case: str):
    path = tmp_path / "items.parquet"
    if case == "nan":
        write_parquet(path, IDS, with_value(7, 3, np.nan))
    elif case == "inf":
        write_parquet(path, IDS, with_value(11, 0, -np.inf), fixed=False)
    elif case == "duplicate ids":
        ids = IDS.copy()
        ids[9] = ids[2]
        write_parquet(path, ids, VECTORS)
    elif case == "negative id":
        ids = IDS.copy()
        ids[4] = -1
        write_parquet(path, ids, VECTORS)
    elif case == "no rows":
        write_parquet(path, IDS[:0], VECTORS[:0])
    elif case == "empty file":
        path.write_bytes(b"")
    elif case == "ragged":
        pq.write_table(pa.table({"item_id": IDS, "embedding": ragged_column(3)}), path)
    elif case == "null vector":
        column = pa.array([list(map(float, v)) if i != 2 else None for i, v in enumerate(VECTORS)],
                          type=pa.list_(pa.float32()))
        pq.write_table(pa.table({"item_id": IDS, "embedding": column}), path)
    elif case == "null value":
        values = pa.array([None if i == 5 * DIM + 6 else float(v)
                           for i, v in enumerate(VECTORS.ravel())], type=pa.float32())
        column = pa.FixedSizeListArray.from_arrays(values, DIM)
        pq.write_table(pa.table({"item_id": IDS, "embedding": column}), path)
    elif case == "integer vectors":
        pq.write_table(pa.table({"item_id": IDS, "embedding": pa.array(
            VECTORS.astype(np.int64).tolist())}), path)
    elif case == "float ids":
        write_parquet(path, IDS.astype(np.float64), VECTORS)
    elif case == "no column":
        pq.write_table(pa.table({"item_id": IDS, "vector": pa.array(VECTORS.tolist())}), path)
    return path


@pytest.mark.parametrize("case, row, column, pieces", [
    ("nan", 7, "embedding", ["row 7, column 'embedding': value nan at dimension 3",
                             "1 row with NaN or inf", "every value is finite"]),
    ("inf", 11, "embedding", ["row 11, column 'embedding': value -inf at dimension 0"]),
    ("duplicate ids", 9, "item_id", ["column 'item_id': item id 7 appears in rows 2 and 9",
                                     "item ids are unique"]),
    ("negative id", 4, "item_id", ["row 4, column 'item_id': item id -1 is negative"]),
    ("no rows", None, None, ["0 rows; a catalog needs at least one item"]),
    ("empty file", None, None, ["not a readable Parquet file"]),
    ("ragged", 3, "embedding", ["row 3, column 'embedding': 15 values, row 0 has 16",
                                "every embedding has the same number of values"]),
    ("null vector", 2, "embedding", ["row 2, column 'embedding': null"]),
    ("null value", 5, "embedding", ["row 5, column 'embedding': null at dimension 6"]),
    ("integer vectors", None, "embedding", ["column 'embedding' has type list<element: int64>",
                                            "a list of floats per row"]),
    ("float ids", None, "item_id", ["column 'item_id' has type double", "integers"]),
    ("no column", None, None, ["no column 'embedding'; found columns ['item_id', 'vector']",
                               "--embedding_column"]),
], ids=lambda value: value if isinstance(value, str) else None)
def test_a_bad_parquet_file_names_its_row_or_column_and_the_rule(tmp_path, case, row, column,
                                                                 pieces):
    path = bad_parquet(tmp_path, case)
    with pytest.raises(EmbeddingFileError) as caught:
        read_embeddings(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: "), message
    for piece in pieces:
        assert piece in message, message
    assert (caught.value.path, caught.value.row, caught.value.column) == (str(path), row, column)


def test_the_width_the_model_needs_is_checked(tmp_path):
    path = write_parquet(tmp_path / "items.parquet", IDS, VECTORS)
    with pytest.raises(EmbeddingFileError,
                       match=r"column 'embedding': rows have 16 values .*\(--dim\) is 32"):
        read_embeddings(path, dim=32)
    np.save(tmp_path / "items.npy", VECTORS)
    with pytest.raises(EmbeddingFileError, match=r"rows have 16 values \(shape \(12, 16\)\)"):
        read_embeddings(tmp_path / "items.npy", dim=8)


@pytest.mark.parametrize("array, ids, piece", [
    (with_value(4, 2, np.nan), None, "row 4: value nan at dimension 2 (1 row with NaN or inf)"),
    (VECTORS[0], None, "holds an array of shape (16,); rule: an .npy of embeddings is 2-D"),
    (VECTORS[:0], None, "0 rows; a catalog needs at least one item"),
    (VECTORS.astype(np.int32), None, "holds dtype int32; rule: embeddings are floats"),
    (VECTORS, np.r_[IDS[:5], IDS[3], IDS[6:]], "item id 10 appears in rows 3 and 5"),
    (VECTORS, IDS[:5], "item ids of shape (5,); rule: one id per row"),
], ids=["nan", "1-D", "no rows", "ints", "duplicate ids", "ids length"])
def test_a_bad_npy_names_its_row_and_the_rule(tmp_path, array, ids, piece):
    np.save(tmp_path / "items.npy", array)
    ids_path = None
    if ids is not None:
        ids_path = tmp_path / "ids.npy"
        np.save(ids_path, ids)
    with pytest.raises(EmbeddingFileError) as caught:
        read_embeddings(tmp_path / "items.npy", ids_path=ids_path)
    assert piece in str(caught.value), str(caught.value)


@pytest.mark.parametrize("name, piece", [("items.csv", "unknown suffix '.csv'"),
                                         ("absent.npy", "no such file")])
def test_a_file_of_no_known_kind_is_refused(tmp_path, name, piece):
    if name.endswith(".csv"):
        (tmp_path / name).write_text("item_id,embedding\n")
    with pytest.raises(EmbeddingFileError, match=piece):
        read_embeddings(tmp_path / name)


# -- texts -------------------------------------------------------------------------------------

class FakeSentenceTransformer:
    """Stands in for sentence_transformers.SentenceTransformer: a text's vector is its
    length, its vowel count and a constant."""

    loaded: list = []

    def __init__(self, path, device=None, local_files_only=False):
        FakeSentenceTransformer.loaded.append((path, device, local_files_only))

    def encode(self, texts, batch_size, show_progress_bar, convert_to_numpy):
        return np.array([[len(t), sum(c in "aeiou" for c in t), 1.0] for t in texts])


def text_file(tmp_path, texts):
    path = tmp_path / "items.parquet"
    pq.write_table(pa.table({"item_id": IDS[:len(texts)], "text": pa.array(texts)}), path)
    return path


def test_texts_go_through_the_model_on_disk(tmp_path, monkeypatch):
    fake = types.ModuleType("sentence_transformers")
    fake.SentenceTransformer = FakeSentenceTransformer
    monkeypatch.setitem(sys.modules, "sentence_transformers", fake)
    (tmp_path / "model").mkdir()
    items = read_embeddings(text_file(tmp_path, ["red shoe", "blue hat", "sofa"]),
                            text_model=str(tmp_path / "model"), device="cpu")
    np.testing.assert_array_equal(items.embeddings, [[8, 3, 1], [8, 3, 1], [4, 2, 1]])
    assert FakeSentenceTransformer.loaded[-1] == (str(tmp_path / "model"), "cpu", True)
    assert "Parquet column 'text' encoded by" in items.source


def test_a_null_text_names_its_row(tmp_path, monkeypatch):
    fake = types.ModuleType("sentence_transformers")
    fake.SentenceTransformer = FakeSentenceTransformer
    monkeypatch.setitem(sys.modules, "sentence_transformers", fake)
    (tmp_path / "model").mkdir()
    with pytest.raises(EmbeddingFileError, match=r"row 1, column 'text': null"):
        read_embeddings(text_file(tmp_path, ["a", None, "c"]), text_model=str(tmp_path / "model"))


def test_without_sentence_transformers_the_error_names_the_flag(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "sentence_transformers", None)
    with pytest.raises(ConfigError, match=r"--text_model .* needs the sentence-transformers "
                                          r"package"):
        read_embeddings(text_file(tmp_path, ["a", "b"]), text_model=str(tmp_path))


def test_a_model_folder_that_is_not_there_names_the_flag(tmp_path, monkeypatch):
    fake = types.ModuleType("sentence_transformers")
    fake.SentenceTransformer = FakeSentenceTransformer
    monkeypatch.setitem(sys.modules, "sentence_transformers", fake)
    with pytest.raises(ConfigError, match=r"--text_model .*'/no/such/model' is not a folder"):
        read_embeddings(text_file(tmp_path, ["a", "b"]), text_model="/no/such/model")
