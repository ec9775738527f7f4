"""TF ops and Torch twins agree exactly: the synthetic world's pipeline and random cases."""

import numpy as np
import pytest
import torch
from absl.testing import parameterized

from xgr_common.prompt_spec import PromptSpec
from xgr_world.synthetic import COUNTRIES

SPEC = PromptSpec(keep_last=12)
LAYOUT = SPEC.layout


def assert_same(tf_outputs, torch_outputs):
    for name, a, b in zip(tf_outputs._fields, tf_outputs, torch_outputs):
        a, b = a.numpy(), b.numpy()
        assert a.dtype == b.dtype, f"{name}: dtype {a.dtype} vs {b.dtype}"
        assert a.shape == b.shape, f"{name}: shape {a.shape} vs {b.shape}"
        np.testing.assert_array_equal(a, b, err_msg=name)


def pipeline(lib, table, hist, times, splits, request, context, max_length, to):
    cleaned = lib.clean_sequence(to(hist), to(times), to(splits), to(request),
                                 window_seconds=SPEC.window_seconds, keep_last=SPEC.keep_last)
    tokens = lib.semantic_id_lookup(table, cleaned.values, cleaned.row_splits,
                                    code_base=LAYOUT.code_base)
    prompt = lib.assemble_prompt(
        to(context), tokens.code_tokens, tokens.row_splits, bos_id=LAYOUT.bos_id,
        profile_start_id=LAYOUT.profile_start_id, item_start_id=LAYOUT.item_start_id,
        pad_id=LAYOUT.pad_id, max_length=max_length)
    return cleaned, tokens, prompt


@pytest.mark.parametrize("max_length", [0, SPEC.max_prompt_tokens, 23])
def test_synthetic_world_pipeline(ops, twins, world, tmp_path, max_length):
    # A catalog without 10% of the items, so unknown items occur.
    rng = np.random.default_rng(0)
    known = rng.random(len(world.item_ids)) > 0.1
    ids, codes = world.item_ids[known], world.item_codes[known]
    tf_table = ops.SemanticIdTable.from_arrays(tmp_path / "world.bin", ids, codes,
                                               LAYOUT.codebook_size)
    th_table = twins.TorchSemanticIdTable.from_file(tmp_path / "world.bin")
    context = np.array([[SPEC.context_token(COUNTRIES.index(c.decode()))]
                        for c in world.user_context], np.int64)
    args = (world.history_items, world.history_times, world.history_splits, world.request_time,
            context, max_length)
    tf_out = pipeline(ops, tf_table, *args, to=lambda x: x)
    th_out = pipeline(twins, th_table, *args, to=torch.from_numpy)
    for a, b in zip(tf_out, th_out):
        assert_same(a, b)
    cleaned, tokens, prompt = tf_out
    # The world exercises every rule: stale events, repeats, unknown items, truncation.
    assert len(cleaned.values) < len(world.history_items)
    assert int(tokens.unknown_count.numpy().sum()) > 0
    assert prompt.token_ids.shape[1] == (max_length or int(prompt.lengths.numpy().max()))
    if max_length == 23:
        assert int(prompt.lengths.numpy().max()) <= 23
        assert (np.diff(tokens.row_splits.numpy()) > 4).any()


class RandomCasesTest(parameterized.TestCase):

    @pytest.fixture(autouse=True)
    def _fixtures(self, ops, twins, tmp_path):
        self.ops, self.twins, self.tmp = ops, twins, tmp_path

    @parameterized.parameters(*range(8))
    def test_random_case(self, seed):
        rng = np.random.default_rng(seed)
        batch = int(rng.integers(0, 7))
        lengths = rng.integers(0, 15, batch)
        splits = np.r_[0, np.cumsum(lengths)].astype(np.int64)
        values = rng.integers(0, 6, splits[-1]).astype(np.int64)  # small alphabet: repeats
        times = np.concatenate([np.sort(rng.integers(-50, 50, n)) for n in lengths] or
                               [np.zeros(0)]).astype(np.int64)
        request = rng.integers(-20, 60, batch).astype(np.int64)
        window, keep = int(rng.integers(1, 80)), int(rng.integers(1, 6))
        to = torch.from_numpy
        a = self.ops.clean_sequence(values, times, splits, request, window_seconds=window,
                                    keep_last=keep)
        b = self.twins.clean_sequence(to(values), to(times), to(splits), to(request),
                                      window_seconds=window, keep_last=keep)
        assert_same(a, b)

        ids = rng.choice(np.arange(-3, 5), size=int(rng.integers(0, 8)), replace=False)
        levels, codebook = int(rng.integers(1, 4)), int(rng.integers(1, 5))
        codes = rng.integers(0, codebook, (len(ids), levels))
        table = self.ops.SemanticIdTable.from_arrays(self.tmp / f"r{seed}.bin", ids, codes,
                                                     codebook)
        twin_table = self.twins.TorchSemanticIdTable(ids, codes, codebook)
        base = int(rng.integers(0, 1000))
        c = table.lookup(a.values, a.row_splits, code_base=base)
        d = self.twins.semantic_id_lookup(twin_table, b.values, b.row_splits, code_base=base)
        assert_same(c, d)

        context = rng.integers(0, 2**31, (batch, int(rng.integers(0, 3)))).astype(np.int64)
        fixed = 3 + context.shape[1]
        max_length = int(rng.choice([0, fixed, fixed + int(rng.integers(0, 9))]))
        ids_attrs = dict(zip(("bos_id", "profile_start_id", "item_start_id", "pad_id"),
                             map(int, rng.integers(0, 2**31, 4))))
        e = self.ops.assemble_prompt(context, c.code_tokens, c.row_splits, **ids_attrs,
                                     max_length=max_length)
        f = self.twins.assemble_prompt(to(context), d.code_tokens, d.row_splits, **ids_attrs,
                                       max_length=max_length)
        assert_same(e, f)
