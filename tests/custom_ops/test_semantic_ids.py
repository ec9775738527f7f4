"""The semantic-ID table (TF resource and Torch twin), its catalog file and the lookup op."""

import numpy as np
import pytest
import tensorflow as tf
import torch
from absl.testing import parameterized

from xgr_common.errors import CatalogError, InvalidInputError

I64 = np.int64
IDS = np.array([30, 10, 20, -5, 2**62], I64)
CODES = np.array([[3, 3, 3], [1, 2, 3], [0, 0, 0], [2, 1, 0], [3, 0, 1]], I64)
CODE_BASE, CODEBOOK = 100, 4


def expected_tokens(codes):
    return CODE_BASE + np.arange(codes.shape[1]) * CODEBOOK + np.asarray(codes)


class SemanticIdLookupTest(parameterized.TestCase):

    @pytest.fixture(autouse=True)
    def _fixtures(self, ops, twins, tmp_path):
        self.ops, self.twins, self.tmp = ops, twins, tmp_path
        self.table = ops.SemanticIdTable.from_arrays(tmp_path / "catalog.bin", IDS, CODES,
                                                     CODEBOOK)
        self.twin_table = twins.TorchSemanticIdTable(IDS, CODES, CODEBOOK)

    def both(self, items, splits):
        tf_out = self.table.lookup(np.asarray(items, I64), np.asarray(splits, I64),
                                   code_base=CODE_BASE)
        th_out = self.twins.semantic_id_lookup(
            self.twin_table, torch.tensor(items, dtype=torch.int64),
            torch.tensor(splits, dtype=torch.int64), code_base=CODE_BASE)
        return tf_out, th_out

    def test_known_items_become_tokens_unknown_are_counted(self):
        items = [10, 99, 30, 2**62, -5, -6, 20]
        splits = [0, 2, 2, 7]
        want = (expected_tokens(CODES[[1, 0, 4, 3, 2]]), [0, 1, 1, 5], [1, 0, 1])
        for out in self.both(items, splits):
            for got, exp in zip(out, want):
                np.testing.assert_array_equal(np.asarray(got), np.asarray(exp, I64))

    def test_size_and_levels(self):
        self.assertEqual(int(self.table.size()), len(IDS))
        self.assertEqual(len(self.twin_table), len(IDS))
        self.assertEqual((self.table.levels, self.table.codebook_size), (3, CODEBOOK))

    def test_table_from_header_only(self):
        table = self.ops.SemanticIdTable(self.tmp / "catalog.bin")
        self.assertEqual((table.levels, table.codebook_size), (3, CODEBOOK))
        twin = self.twins.TorchSemanticIdTable.from_file(self.tmp / "catalog.bin")
        np.testing.assert_array_equal(twin.sorted_ids.numpy(), np.sort(IDS))

    def test_empty_batch_and_empty_catalog(self):
        for out in self.both([], [0]):
            self.assertEqual(tuple(np.asarray(out[0]).shape), (0, 3))
            np.testing.assert_array_equal(np.asarray(out[1]), [0])
        empty = self.twins.TorchSemanticIdTable(np.zeros(0, I64), np.zeros((0, 2), I64), 4)
        out = self.twins.semantic_id_lookup(empty, torch.tensor([1, 2]), torch.tensor([0, 2]),
                                            code_base=0)
        np.testing.assert_array_equal(out.unknown_count.numpy(), [2])

    @parameterized.named_parameters(
        ("duplicate_ids", [1, 2, 1], [[0], [1], [2]], 4, "unique"),
        ("code_too_large", [1, 2], [[0], [4]], 4, r"codes must lie in \[0"),
        ("negative_code", [1, 2], [[0], [-1]], 4, r"codes must lie in \[0"),
    )
    def test_init_rejects_bad_catalog(self, ids, codes, codebook, message):
        ids, codes = np.asarray(ids, I64), np.asarray(codes, I64)
        handle = self.ops.load_library("feature_ops").xgr_semantic_id_table_handle(
            shared_name=f"bad_catalog_{self._testMethodName}")
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, message):
            self.ops.load_library("feature_ops").xgr_semantic_id_table_init_from_arrays(
                table=handle, item_ids=ids, codes=codes, codebook_size=codebook)
        with self.assertRaisesRegex(CatalogError, message):
            self.twins.TorchSemanticIdTable(ids, codes, codebook)
        with self.assertRaisesRegex(CatalogError, message):
            self.ops.write_catalog(self.tmp / "bad.bin", ids, codes, codebook)

    @parameterized.named_parameters(
        ("truncated", lambda good: good[:-3]),
        ("bad_magic", lambda good: b"NOTMAGIC" + good[8:]),
        ("short", lambda good: good[:10]),
    )
    def test_file_init_rejects_corrupt_files(self, corrupt):
        path = self.tmp / "corrupt.bin"
        path.write_bytes(corrupt((self.tmp / "catalog.bin").read_bytes()))
        with self.assertRaises(tf.errors.InvalidArgumentError):
            self.ops.SemanticIdTable(path, levels=3, codebook_size=CODEBOOK)
        with self.assertRaises(CatalogError):
            self.twins.TorchSemanticIdTable.from_file(path)

    def test_file_init_rejects_levels_that_disagree_with_the_file(self):
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, "levels=3"):
            self.ops.SemanticIdTable(self.tmp / "catalog.bin", levels=2, codebook_size=CODEBOOK)

    @parameterized.named_parameters(
        ("splits_end", [1, 2], [0, 1], "row_splits must end"),
        ("splits_start", [1, 2], [1, 2], "row_splits must start at 0"),
        ("splits_decrease", [1, 2], [0, 2, 1, 2], "non-decreasing"),
    )
    def test_lookup_rejects_bad_row_splits(self, items, splits, message):
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, message):
            self.both_tf(items, splits)
        with self.assertRaisesRegex(InvalidInputError, message):
            self.twins.semantic_id_lookup(self.twin_table, torch.tensor(items),
                                          torch.tensor(splits), code_base=CODE_BASE)

    def test_lookup_rejects_bad_attributes_and_items(self):
        lib = self.ops.load_library("feature_ops")
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, "do not match the table"):
            lib.xgr_semantic_id_lookup(table=self.table.resource_handle, items=[1],
                                       row_splits=[0, 1], code_base=0, codebook_size=5, levels=3)
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, "code_base"):
            lib.xgr_semantic_id_lookup(table=self.table.resource_handle, items=[1],
                                       row_splits=[0, 1], code_base=2**63 - 2,
                                       codebook_size=CODEBOOK, levels=3)
        with self.assertRaisesRegex(InvalidInputError, "code_base"):
            self.twins.semantic_id_lookup(self.twin_table, torch.tensor([1]),
                                          torch.tensor([0, 1]), code_base=2**63 - 2)
        with self.assertRaisesRegex(InvalidInputError, "items must be int64"):
            self.twins.semantic_id_lookup(self.twin_table, torch.tensor([1.0]),
                                          torch.tensor([0, 1]), code_base=0)

    def both_tf(self, items, splits):
        return self.table.lookup(np.asarray(items, I64), np.asarray(splits, I64),
                                 code_base=CODE_BASE)

    def test_uninitialised_or_foreign_handle_is_an_error(self):
        lib = self.ops.load_library("feature_ops")
        handle = lib.xgr_semantic_id_table_handle(shared_name="never_initialised")
        with self.assertRaises(tf.errors.NotFoundError):
            lib.xgr_semantic_id_lookup(table=handle, items=[1], row_splits=[0, 1], code_base=0,
                                       codebook_size=CODEBOOK, levels=3)
        variable = tf.Variable([1.0])
        with self.assertRaises(tf.errors.InvalidArgumentError):
            lib.xgr_semantic_id_lookup(table=variable.handle, items=[1], row_splits=[0, 1],
                                       code_base=0, codebook_size=CODEBOOK, levels=3)

    def test_onnx_form_matches(self):
        catalog = self.table.catalog_arrays()  # the TF table's own catalog, sorted by id
        sorted_ids = torch.from_numpy(catalog.item_ids)
        codes = torch.from_numpy(catalog.codes.astype(np.int64))
        np.testing.assert_array_equal(catalog.item_ids, np.sort(IDS))
        got = self.twins.semantic_ids.semantic_id_lookup_onnx(
            sorted_ids, codes, torch.tensor([20, 1]), torch.tensor([0, 2]),
            code_base=CODE_BASE, codebook_size=CODEBOOK, levels=3)
        np.testing.assert_array_equal(got.code_tokens.numpy(), expected_tokens(CODES[[2]]))
        with self.assertRaisesRegex(CatalogError, "strictly increasing"):
            self.twins.semantic_ids.semantic_id_lookup_onnx(
                sorted_ids.flip(0), codes, torch.tensor([20]), torch.tensor([0, 1]),
                code_base=CODE_BASE, codebook_size=CODEBOOK, levels=3)

    def test_graph_mode_shapes(self):
        spec = tf.TensorSpec([None], tf.int64)
        fn = tf.function(lambda items, splits: self.table.lookup(
            items, splits, code_base=CODE_BASE)).get_concrete_function(
                spec, tf.TensorSpec([5], tf.int64))
        self.assertEqual(fn.output_shapes.code_tokens.as_list(), [None, 3])
        self.assertEqual(fn.output_shapes.row_splits.as_list(), [5])
        self.assertEqual(fn.output_shapes.unknown_count.as_list(), [4])

    def test_tf1_graph_mode_with_tables_initializer(self):
        with tf.Graph().as_default():
            table = self.ops.SemanticIdTable(self.tmp / "catalog.bin")
            out = table.lookup(tf.constant([20, 7], tf.int64), tf.constant([0, 2], tf.int64),
                               code_base=CODE_BASE)
            with tf.compat.v1.Session() as session:
                session.run(tf.compat.v1.tables_initializer())
                tokens, unknown = session.run([out.code_tokens, out.unknown_count])
        np.testing.assert_array_equal(tokens, expected_tokens(CODES[[2]]))
        np.testing.assert_array_equal(unknown, [1])
