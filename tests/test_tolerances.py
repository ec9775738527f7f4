"""The one tolerance table: every spelling of a dtype finds its row; ids are exact."""

import numpy as np
import pytest
import torch

from xgr_common.tolerances import TOLERANCES, dtype_name, tolerance_for


@pytest.mark.parametrize("dtype, key", [
    (np.float32, "float32"), (np.dtype("float64"), "float64"), (torch.bfloat16, "bfloat16"),
    (torch.float16, "float16"), ("int64", "int64"), (np.bool_, "bool"), (torch.int32, "int32"),
    (np.dtype(object), "string"),
])
def test_every_spelling_finds_its_row(dtype, key):
    assert dtype_name(dtype) == key
    assert tolerance_for(dtype) is TOLERANCES[key]


def test_integer_and_bool_rows_are_exact_and_float_rows_are_ordered_by_precision():
    assert all(TOLERANCES[k].exact for k in ("int32", "int64", "bool", "string"))
    rels = [TOLERANCES[k].rel_norm for k in ("float64", "float32", "float16", "bfloat16")]
    assert rels == sorted(rels) and rels[0] > 0


def test_unknown_dtype_is_named_in_the_error():
    with pytest.raises(KeyError, match="float8"):
        tolerance_for("float8_e4m3fn")
