"""Every bad call is a TF error with a message, never an abort of the process."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import tensorflow as tf

from custom_ops.torch_call import torch_call

OUT = [tf.float32, tf.int64]


def _good(batch=3, length=2):
    return [np.ones((batch, 4), np.float32), np.ones((batch, length), np.int64)]


@pytest.mark.parametrize("inputs,message", [
    ([np.ones((3, 4), np.float64), np.ones((3, 2), np.int64)], "input 0: expected float32, got float64"),
    ([np.ones((3, 4), np.float32), np.ones((3, 2), np.int32)], "input 1: expected int64, got int32"),
    ([np.ones((3,), np.float32), np.ones((3, 2), np.int64)], "input 0: expected rank 2"),
    ([np.ones((3, 5), np.float32), np.ones((3, 2), np.int64)], "input 0 dim 1 .*expected size 4"),
    ([np.ones((3, 4), np.float32), np.ones((2, 2), np.int64)], "must match"),
    ([np.ones((3, 4), np.float32)], "got 1 inputs but the package takes 2"),
    ([np.ones((5000, 4), np.float32), np.ones((5000, 2), np.int64)], "must lie in \\[1, 4096\\]"),
    ([np.ones((0, 4), np.float32), np.ones((0, 2), np.int64)], "must lie in \\[1, 4096\\]"),
], ids=["dtype", "dtype_int", "rank", "size", "shared_dim", "count", "above_range", "empty"])
def test_contract_violations_are_invalid_argument(package, inputs, message):
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        torch_call(str(package.path), inputs, OUT)


def test_declared_outputs_must_match_the_package(package):
    with pytest.raises(tf.errors.InvalidArgumentError, match="Tout = float int32 does not match"):
        torch_call(str(package.path), _good(), [tf.float32, tf.int32])
    with pytest.raises(tf.errors.InvalidArgumentError, match="does not match"):
        torch_call(str(package.path), _good(), [tf.float32])


def test_missing_package_is_not_found(tmp_path):
    with pytest.raises(tf.errors.NotFoundError, match="package not found: .*absent.pt2"):
        torch_call(str(tmp_path / "absent.pt2"), _good(), OUT)


@pytest.mark.parametrize("name", ["two_heads_aoti", "two_heads_script"])
def test_corrupt_package_is_a_server_fault(packages, tmp_path, name):
    """A bad deploy is the server's fault (a 5xx), never the caller's."""
    source = packages[name].path
    corrupt = tmp_path / f"corrupt{source.suffix}"
    corrupt.write_bytes(source.read_bytes()[: source.stat().st_size // 3])
    with pytest.raises(tf.errors.InternalError, match="cannot load package"):
        torch_call(str(corrupt), _good(), OUT)


def test_repaired_package_loads_after_a_failure(packages, tmp_path):
    path = tmp_path / "later.pt"
    path.write_bytes(b"not a zip archive")
    with pytest.raises(tf.errors.InternalError, match="cannot load package"):
        torch_call(str(path), _good(), OUT)
    shutil.copyfile(packages["two_heads_script"].path, path)
    assert torch_call(str(path), _good(), OUT)[0].shape == (3, 3)


def test_unknown_extension_and_missing_contract(packages, tmp_path):
    odd = tmp_path / "model.bin"
    shutil.copyfile(packages["two_heads_script"].path, odd)
    with pytest.raises(tf.errors.FailedPreconditionError, match="must end in .pt2"):
        torch_call(str(odd), _good(), OUT)
    bare = packages["identity"].path.parent / "bare.pt"
    with pytest.raises(tf.errors.FailedPreconditionError, match="carries no xgr_signature.txt"):
        torch_call(str(bare), [np.ones(3, np.float32)], [tf.float32])


def test_cuda_package_on_a_host_without_cuda_fails_cleanly(packages):
    with pytest.raises(tf.errors.FailedPreconditionError, match="compiled for cuda:0 but this "
                                                                "process sees no CUDA device"):
        torch_call(str(packages["cuda"].path), [np.ones(3, np.float32)], [tf.float32])


def test_package_path_must_be_a_scalar(packages):
    path = str(packages["two_heads_script"].path)
    with pytest.raises(tf.errors.InvalidArgumentError, match="must be a scalar string"):
        torch_call(tf.constant([path, path]), _good(), OUT)


def test_attrs_are_checked(packages):
    with pytest.raises(tf.errors.InvalidArgumentError, match="intra_op_threads must be >= 1"):
        torch_call(str(packages["two_heads_script"].path), _good(), OUT, intra_op_threads=0)


def test_unreadable_contract_names_its_line(packages):
    garbled = packages["identity"].path.parent / "garbled.pt"
    with pytest.raises(tf.errors.FailedPreconditionError,
                       match="signature line 3 \\('sideways float32 n'\\): unknown entry"):
        torch_call(str(garbled), [np.ones(3, np.float32)], [tf.float32])


def test_value_rules_in_a_contract_are_parsed(packages):
    folder = packages["identity"].path.parent
    with pytest.raises(tf.errors.FailedPreconditionError,
                       match="signature line 4 .*rule reduction must be 'any' or 'max'"):
        torch_call(str(folder / "bad_rule.pt"), [np.ones(3, np.float32)], [tf.float32])
    with pytest.raises(tf.errors.FailedPreconditionError,
                       match="rule 'r': this TorchCall cannot check a rule named 'r'"):
        torch_call(str(folder / "with_rule.pt"), [np.ones(3, np.float32)], [tf.float32])
    with pytest.raises(tf.errors.FailedPreconditionError,
                       match="rule 'token_range': needs the parameter vocab=INT"):
        torch_call(str(packages["rule_without_limit"].path),
                   [np.ones((2, 3), np.int32), np.full(2, 3, np.int32),
                    np.full((2, 1), -1, np.int64)], [tf.int64, tf.float32])
