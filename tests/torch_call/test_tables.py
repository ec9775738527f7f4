"""Tables a package reads on every run (an engine's catalog), loaded once by TorchCall from a
tables file: each file serves its own values through one loaded package; a file that does not
match the contract, or a call without one, is the deploy's fault (FAILED_PRECONDITION /
NOT_FOUND naming the file and the table), never the caller's, and never an abort."""

from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf
import torch

from custom_ops.torch_call import package_stats, torch_call

X = np.arange(4, dtype=np.float32)


def _tables(path, **tables):
    torch.save(tables, path)
    return str(path)


def _call(package, tables):
    return torch_call(str(package), [X], [tf.float32], tables=tables)[0].numpy()


@pytest.fixture
def weighted(packages):
    return packages["weighted"].path


def test_each_tables_file_serves_its_own_values(weighted, tmp_path):
    first = _tables(tmp_path / "first.pt", **{"weights.table": torch.arange(8.0)})
    second = _tables(tmp_path / "second.pt", **{"weights.table": torch.ones(8),
                                                "capacity": "{}"})   # non-tensors are ignored
    np.testing.assert_allclose(_call(weighted, first), X * 28)
    np.testing.assert_allclose(_call(weighted, second), X * 8)
    np.testing.assert_allclose(_call(weighted, first), X * 28)


def test_a_hard_linked_package_loads_once(weighted, tmp_path):
    linked = tmp_path / "version_2" / "weighted.pt"
    linked.parent.mkdir()
    os.link(weighted, linked)
    tables = _tables(tmp_path / "t.pt", **{"weights.table": torch.ones(8)})
    np.testing.assert_allclose(_call(weighted, tables), X * 8)
    np.testing.assert_allclose(_call(linked, tables), X * 8)
    assert str(linked) not in package_stats()   # known by its file, first loaded from weighted


@pytest.mark.parametrize("tables,message", [
    ({"weights.table": torch.ones(8, dtype=torch.float64)},
     r"table 'weights.table' is Double\[8\], the package reads float32\[8\]"),
    ({"weights.table": torch.ones(9)}, r"is Float\[9\], the package reads float32\[8\]"),
    ({"other": torch.ones(8)}, "lacks the table 'weights.table'"),
], ids=["dtype", "size", "missing"])
def test_a_tables_file_that_breaks_the_contract_is_a_deploy_fault(weighted, tmp_path, tables,
                                                                  message):
    path = _tables(tmp_path / "bad.pt", **tables)
    with pytest.raises(tf.errors.FailedPreconditionError, match=message):
        _call(weighted, path)


def test_unreadable_missing_or_absent_tables_are_named(weighted, packages, tmp_path):
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a torch.save file")
    with pytest.raises(tf.errors.FailedPreconditionError, match="is not a torch.save file"):
        _call(weighted, str(garbage))
    with pytest.raises(tf.errors.NotFoundError, match="tables file not found"):
        _call(weighted, str(tmp_path / "absent.pt"))
    with pytest.raises(tf.errors.FailedPreconditionError, match="names no tables file"):
        _call(weighted, None)
    plain = _tables(tmp_path / "plain.pt", **{"weights.table": torch.ones(8)})
    with pytest.raises(tf.errors.FailedPreconditionError, match="reads no tables"):
        torch_call(str(packages["identity"].path), [X], [tf.float32], tables=plain)
    # The caller's own mistakes stay INVALID_ARGUMENT with tables in play.
    with pytest.raises(tf.errors.InvalidArgumentError, match="expected float32"):
        torch_call(str(weighted), [X.astype(np.float64)], [tf.float32], tables=plain)
    np.testing.assert_allclose(_call(weighted, plain), X * 8)   # and nothing is left broken
