"""Property checks of the feature ops on hostile input, run as a child process.

``test_properties.py`` runs this file with a fresh interpreter and asserts it exits with 0: a
crash in C++ (abort, segfault) would kill the child, never the test session. Each property
feeds random shapes, extreme values and inconsistent row splits, and requires that
  * the TF op either succeeds or raises ``tf.errors.InvalidArgumentError``;
  * the Torch twin either succeeds or raises ``InvalidInputError`` (``CatalogError`` for
    catalogs);
  * both accept the same inputs, and when they do their outputs are equal.
"""

import collections
import faulthandler
import os
import sys
import tempfile

import numpy as np
import tensorflow as tf
import torch
from hypothesis import HealthCheck, given, settings, strategies as st
from hypothesis.extra.numpy import array_shapes, arrays

import custom_ops
from custom_ops import torch_twins
from custom_ops.catalog_file import read_catalog, write_catalog
from xgr_common.errors import CatalogError, InvalidInputError

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
LIB = custom_ops.load_library("feature_ops")
EXAMPLES = int(os.environ.get("XGR_FUZZ_EXAMPLES", "40"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                    suppress_health_check=list(HealthCheck))

ELEMENTS = st.one_of(st.integers(-3, 12),
                     st.sampled_from([INT64_MIN, INT64_MAX, 2**31, -(2**31) - 1, 2**62]))
ANY_ARRAY = arrays(np.int64, array_shapes(min_dims=0, max_dims=2, min_side=0, max_side=5),
                   elements=ELEMENTS)
# Attribute values: invalid ones (<= 0) about a quarter of the time.
ATTR = st.sampled_from([INT64_MIN, -1, 0, *[1, 2, 3, 7, 12, 2**31, INT64_MAX] * 2])


# Token ids: mostly valid, sometimes negative or beyond int32.
TOKENS = st.one_of(st.integers(0, 40), st.integers(0, 40), st.integers(0, 40), ELEMENTS)


@st.composite
def ragged(draw, levels=None, elements=ELEMENTS):
    """(values, row_splits) that are mostly consistent; sometimes one part is replaced."""
    lengths = draw(st.lists(st.integers(0, 4), max_size=5))
    splits = np.r_[0, np.cumsum(lengths)].astype(np.int64)
    shape = (int(splits[-1]),) if levels is None else (int(splits[-1]), levels)
    values = draw(arrays(np.int64, shape, elements=elements))
    corrupt = draw(st.sampled_from([None, None, None, "values", "splits"]))
    if corrupt == "values":
        values = draw(ANY_ARRAY)
    elif corrupt == "splits":
        splits = draw(ANY_ARRAY)
    return values, splits


# (property, "accepted" | "rejected") -> count; main() requires both outcomes per property so
# a generator that only ever produces rejected input cannot pass unnoticed.
OUTCOMES = collections.Counter()


def agree(name, tf_call, torch_call, twin_errors=(InvalidInputError,)):
    """Runs both sides and checks the contract in the module docstring."""
    try:
        tf_out = [o.numpy() for o in tf_call()]
    except tf.errors.InvalidArgumentError:
        tf_out = None
    try:
        th_out = [o.numpy() for o in torch_call()]
    except twin_errors:
        th_out = None
    assert (tf_out is None) == (th_out is None), (
        f"TF {'rejected' if tf_out is None else 'accepted'} but the twin "
        f"{'rejected' if th_out is None else 'accepted'}")
    OUTCOMES[name, "rejected" if tf_out is None else "accepted"] += 1
    for a, b in zip(tf_out or (), th_out or ()):
        assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, a.shape, b.dtype, b.shape)
        np.testing.assert_array_equal(a, b)


def t(x):
    return torch.from_numpy(np.asarray(x, np.int64))


@SETTINGS
@given(ragged(), st.data(), ATTR, ATTR)
def clean_sequence_is_safe(values_splits, data, window, keep):
    values, splits = values_splits
    times = data.draw(st.one_of(*[arrays(np.int64, values.shape, elements=ELEMENTS)] * 3,
                                ANY_ARRAY))
    if data.draw(st.sampled_from([True, True, True, False])) and times.ndim == 1:
        times = np.sort(times)  # sorted overall is sorted inside every row
    request = data.draw(st.one_of(arrays(np.int64, max(splits.size - 1, 0), elements=ELEMENTS),
                                  ANY_ARRAY))
    agree("clean_sequence_is_safe",
          lambda: LIB.xgr_clean_sequence(values=values, timestamps=times, row_splits=splits,
                                         request_time=request, window_seconds=window,
                                         keep_last=keep),
          lambda: torch_twins.clean_sequence(t(values), t(times), t(splits), t(request),
                                             window_seconds=window, keep_last=keep))


@SETTINGS
@given(ragged(), st.data(), st.sampled_from([-1, *[1, 3, 7, 2**62] * 4]),
       st.sampled_from([0, 2**40 + 1, *[1, 3, 2**40] * 4]),
       st.sampled_from([-1, *[0, 2, 5, INT64_MAX] * 3]), st.sampled_from([0, *[1, 3] * 4]))
def split_history_is_safe(values_splits, data, block, blocks, long_items, recent):
    values, splits = values_splits
    times = data.draw(st.one_of(*[arrays(np.int64, values.shape, elements=ELEMENTS)] * 3,
                                ANY_ARRAY))
    if data.draw(st.sampled_from([True, True, True, False])) and times.ndim == 1:
        times = np.sort(times)  # sorted overall is sorted inside every row
    request = data.draw(st.one_of(arrays(np.int64, max(splits.size - 1, 0), elements=ELEMENTS),
                                  ANY_ARRAY))
    attrs = dict(block_seconds=block, long_term_blocks=blocks, long_term_items=long_items,
                 recent_items=recent)
    agree("split_history_is_safe",
          lambda: LIB.xgr_split_history(values=values, timestamps=times, row_splits=splits,
                                        request_time=request, **attrs),
          lambda: torch_twins.split_history(t(values), t(times), t(splits), t(request),
                                            **attrs))


_WORKDIR = tempfile.TemporaryDirectory(prefix="xgr_fuzz_")  # removed when the child exits
TABLE_DIR = _WORKDIR.name
TABLE_IDS = np.array([INT64_MIN, -1, 0, 3, 7, INT64_MAX], np.int64)
TABLE_CODES = np.array([[0, 1], [1, 0], [2, 2], [3, 0], [0, 0], [1, 3]], np.int64)
TF_TABLE = custom_ops.SemanticIdTable.from_arrays(os.path.join(TABLE_DIR, "t.bin"), TABLE_IDS,
                                                  TABLE_CODES, 4)
TWIN_TABLE = torch_twins.TorchSemanticIdTable(TABLE_IDS, TABLE_CODES, 4)


@SETTINGS
@given(ragged(), st.sampled_from([0, 5, 2**40, INT64_MAX - 8, INT64_MAX - 7, INT64_MAX]))
def semantic_id_lookup_is_safe(items_splits, code_base):
    items, splits = items_splits
    agree("semantic_id_lookup_is_safe",
          lambda: LIB.xgr_semantic_id_lookup(table=TF_TABLE.resource_handle, items=items,
                                             row_splits=splits, code_base=code_base,
                                             codebook_size=4, levels=2),
          lambda: torch_twins.semantic_id_lookup(TWIN_TABLE, t(items), t(splits),
                                                 code_base=code_base))


@st.composite
def catalogs(draw):
    """(ids, codes, codebook_size): mostly well formed, sometimes duplicated, out of range or
    of the wrong shape."""
    n, levels = draw(st.integers(0, 5)), draw(st.integers(1, 3))
    ids = np.array(draw(st.lists(ELEMENTS, min_size=n, max_size=n, unique=draw(st.booleans()))),
                   np.int64)
    codes = draw(arrays(np.int64, (n, levels), elements=st.integers(-1, 4)))
    if draw(st.integers(0, 4)) == 0:
        ids, codes = draw(st.sampled_from([(ids, draw(ANY_ARRAY)), (draw(ANY_ARRAY), codes)]))
    return ids, codes, draw(st.sampled_from([1, 4, 5, 2**31, INT64_MAX, 0, -1]))


@SETTINGS
@given(catalogs())
def table_init_is_safe(catalog):
    ids, codes, codebook_size = catalog
    handle = LIB.xgr_semantic_id_table_handle(shared_name="fuzz_table")

    def tf_init():
        LIB.xgr_semantic_id_table_init_from_arrays(table=handle, item_ids=ids, codes=codes,
                                                   codebook_size=codebook_size)
        return [LIB.xgr_semantic_id_table_size(table=handle)]

    def twin_init():
        if ids.ndim != 1 or codes.ndim != 2:  # the twin's array checks live in CatalogError
            raise CatalogError("ranks")
        return [torch.tensor(len(torch_twins.TorchSemanticIdTable(ids, codes, codebook_size)))]

    agree("table_init_is_safe", tf_init, twin_init, twin_errors=(CatalogError,))


@st.composite
def catalog_files(draw):
    """Bytes of a valid catalog file, then maybe truncated, extended or with a header field
    (N, levels or codebook_size) replaced by a hostile value."""
    n, levels = draw(st.integers(0, 4)), draw(st.integers(1, 3))
    ids = np.arange(n, dtype=np.int64) * 7 - 5
    codes = draw(arrays(np.int64, (n, levels), elements=st.integers(0, 3)))
    path = os.path.join(TABLE_DIR, "source.bin")
    write_catalog(path, ids, codes, 4)
    data = bytearray(open(path, "rb").read())
    mutation = draw(st.sampled_from(["none", "truncate", "extend", "field", "field"]))
    if mutation == "truncate":
        data = data[:draw(st.integers(0, max(len(data) - 1, 0)))]
    elif mutation == "extend":
        data += draw(st.binary(min_size=1, max_size=16))
    elif mutation == "field":
        offset = draw(st.sampled_from([8, 16, 24]))
        data[offset:offset + 8] = np.int64(draw(ELEMENTS)).tobytes()
    return bytes(data)


@SETTINGS
@given(catalog_files())
def catalog_file_is_safe(data):
    path = os.path.join(TABLE_DIR, "fuzz.bin")
    with open(path, "wb") as f:
        f.write(data)

    def tf_init():
        # Declare what the header claims (clamped to the attribute bounds) so the op reaches
        # the size checks instead of stopping at a declaration mismatch.
        levels, size = (int(v) for v in np.frombuffer(data[16:32].ljust(16, b"\0"), "<i8"))
        handle = LIB.xgr_semantic_id_table_handle(shared_name="fuzz_file")
        LIB.xgr_semantic_id_table_init_from_file(table=handle, filename=path,
                                                 levels=min(max(levels, 1), 2**20),
                                                 codebook_size=min(max(size, 1), 2**31 - 1))
        return [LIB.xgr_semantic_id_table_size(table=handle)]

    def twin_init():
        return [torch.tensor(len(read_catalog(path).item_ids))]

    agree("catalog_file_is_safe", tf_init, twin_init, twin_errors=(CatalogError,))


@SETTINGS
@given(ANY_ARRAY, ragged(levels=2, elements=TOKENS), st.data(),
       st.sampled_from([-1, 0, 1, 3, 4, 5, 9, 2**20, 2**20 + 1, INT64_MAX]))
def assemble_prompt_is_safe(context, items_splits, data, max_length):
    items, splits = items_splits
    if data.draw(st.sampled_from([True, True, True, False])):
        context = data.draw(arrays(np.int64, (max(splits.size - 1, 0), data.draw(
            st.integers(0, 2))), elements=TOKENS))
    if max_length == 2**20 and splits.size > 3:
        max_length = 9  # keep the output small: the bound itself is what matters
    specials = dict(bos_id=1, profile_start_id=data.draw(st.sampled_from([2, 2, 2, -1, 2**31])),
                    item_start_id=4, pad_id=0)
    agree("assemble_prompt_is_safe",
          lambda: LIB.xgr_assemble_prompt(context_tokens=context, item_tokens=items,
                                          item_row_splits=splits, max_length=max_length,
                                          **specials),
          lambda: torch_twins.assemble_prompt(t(context), t(items), t(splits),
                                              max_length=max_length, **specials))


@SETTINGS
@given(ragged(levels=2, elements=TOKENS), ragged(levels=2, elements=TOKENS), st.data(),
       st.sampled_from([0, 0, 0, 9, 2**20, 2**20 + 1]))
def assemble_prompt_v2_is_safe(long_splits, recent_splits, data, max_length):
    (long_items, long_rows), (recent_items, recent_rows) = long_splits, recent_splits
    rows = max(long_rows.size - 1, 0)
    context = data.draw(st.one_of(*[arrays(np.int64, (rows, data.draw(st.integers(0, 2))),
                                           elements=TOKENS)] * 3, ANY_ARRAY))
    spans = {name: data.draw(st.lists(TOKENS, max_size=2))
             for name in ("intro", "before_profile", "before_recent", "question")}
    attrs = dict(bos_id=1, profile_start_id=5, item_start_id=4, pad_id=0,
                 soft_id=data.draw(st.sampled_from([6, 6, 6, -1, 2**31])),
                 soft_tokens=data.draw(st.sampled_from([0, 2, 2, -1])), max_length=max_length,
                 **spans)
    agree("assemble_prompt_v2_is_safe",
          lambda: LIB.xgr_assemble_prompt_v2(long_item_tokens=long_items,
                                             long_row_splits=long_rows, context_tokens=context,
                                             recent_item_tokens=recent_items,
                                             recent_row_splits=recent_rows, **attrs),
          lambda: torch_twins.assemble_prompt_v2(t(long_items), t(long_rows), t(context),
                                                 t(recent_items), t(recent_rows), **attrs))


PROPERTIES = (clean_sequence_is_safe, split_history_is_safe, semantic_id_lookup_is_safe,
              table_init_is_safe, catalog_file_is_safe, assemble_prompt_is_safe,
              assemble_prompt_v2_is_safe)

if __name__ == "__main__":
    faulthandler.enable()
    for prop in PROPERTIES:
        prop()
        name = prop.__name__
        accepted, rejected = OUTCOMES[name, "accepted"], OUTCOMES[name, "rejected"]
        print(f"ok {name}: {accepted} accepted, {rejected} rejected", flush=True)
        if not (accepted and rejected):
            sys.exit(f"{name} never saw both outcomes; its generator is too narrow")
    sys.exit(0)
