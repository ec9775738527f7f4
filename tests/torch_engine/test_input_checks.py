"""The checks of ``Engine.recommend``'s arguments: ``check_arguments`` and the value rules'
verdict read the inputs' values back to the host once per batch (one device synchronisation
on CUDA), whatever rules apply, and still name the rule that failed (each rule of
``xgr_common.value_rules``, in the table's order); ``Engine.recommend`` makes that one read
after the search, on a sanitised copy meanwhile."""

import contextlib

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tests.torch_engine.engine_worlds import checked_batch
from torch_engine import search
from torch_engine.catalog import Catalog
from torch_engine.config import EngineConfig
from torch_engine.checks import check_arguments
from torch_engine.engine import Engine
from torch_engine.model import Model
from xgr_common.errors import InvalidInputError
from xgr_common.value_rules import FLAG_COUNT, VALUE_RULES

READERS = ("tolist", "item", "cpu", "numpy")


class _ScalarReads(TorchDispatchMode):
    """Counts ``bool(t)``, ``int(t)``, ``t.item()``: each dispatches ``_local_scalar_dense``."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.count += 1
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def host_reads(monkeypatch):
    """Counts every way a tensor's values reach Python: scalar reads plus ``tolist``,
    ``item``, ``cpu`` and ``numpy`` calls (on CUDA inputs each is a device wait)."""
    counts = {"n": 0}
    for name in READERS:
        original = getattr(torch.Tensor, name)

        def reader(self, *args, _original=original, **kwargs):
            counts["n"] += 1
            return _original(self, *args, **kwargs)
        monkeypatch.setattr(torch.Tensor, name, reader)
    with _ScalarReads() as mode:
        yield lambda: counts["n"] + mode.count
    monkeypatch.undo()


@pytest.fixture(scope="module")
def engine():
    rng = np.random.default_rng(0)
    ids = rng.choice(np.arange(10_000), size=200, replace=False)
    return Engine(Model.from_preset("tiny", seed=0), Catalog.from_arrays(ids, rng.integers(
        0, 8, (200, 3))), EngineConfig(max_beam_width=64, max_exclude=64))


def request(batch: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(8, 1024, (batch, 20), generator=gen)
    lengths = torch.randint(1, 21, (batch,), generator=gen)
    segments = torch.cumsum((torch.rand(batch, 20, generator=gen) < 0.3).int(), 1).int()
    exclude = torch.randint(-1, 10_000, (batch, 5), generator=gen)
    return tokens, lengths, segments, exclude


@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("segmented", [False, True])
@pytest.mark.parametrize("listed", [False, True])
def test_valid_inputs_are_read_once(engine, monkeypatch, batch, segmented, listed):
    tokens, lengths, segments, exclude = request(batch, batch + 2 * segmented)
    rows = list(exclude) if listed else exclude
    with host_reads(monkeypatch) as reads:
        checked = checked_batch(engine, tokens.int(), lengths,
                                segments if segmented else None, 8, 10,
                                torch.zeros(batch, 2, 64), rows)
        assert reads() == 1
    valid = torch.arange(20)[None, :] < lengths[:, None]
    assert torch.equal(checked.token_ids, torch.where(valid, tokens, 0))
    assert torch.equal(checked.total_lengths, lengths + 2)
    assert torch.equal(checked.exclude_items, exclude)
    assert checked.causal is not segmented
    assert torch.equal(checked.segment_ids, segments if segmented else torch.zeros_like(
        segments))


def test_uneven_exclusion_rows_are_padded(engine):
    tokens, lengths, _, _ = request(3, 0)
    rows = [torch.tensor([5, 7], dtype=torch.int32), torch.tensor([], dtype=torch.int64),
            torch.tensor([9])]
    checked = checked_batch(engine, tokens, lengths, None, 8, 10, None, rows)
    assert checked.exclude_items.tolist() == [[5, 7], [-1, -1], [9, -1]]


@pytest.mark.parametrize("case,match", [
    ("short_and_bad_token", "lengths must be >= 1"),
    ("bad_token_and_segments", "token_ids must lie in"),
    ("segments_and_exclusion", "non-decreasing"),
    ("exclusion", "exclude_items must hold item ids"),
    ("too_long", r"prompt plus generated codes .* must not exceed the model's max_position; "
                 r"got \d+ positions"),
])
def test_first_failing_value_rule_is_named(engine, case, match):
    tokens, lengths, segments, exclude = request(2, 5)
    lengths = torch.tensor([20, 20])
    if case == "short_and_bad_token":
        lengths[1] = 0
        tokens[0, 0] = -3
    if case == "bad_token_and_segments":
        tokens[1, 3] = engine.model.config.vocab_size
        segments[0, 5:] = 0
    if case == "segments_and_exclusion":
        segments[1, 0] = -1
        exclude[0, 0] = -2
    if case == "exclusion":
        exclude[1, 4] = -5
    if case == "too_long":
        tokens = torch.full((2, engine.model.config.max_position), 9)
        segments, lengths = None, torch.tensor([5, engine.model.config.max_position])
    with pytest.raises(InvalidInputError, match=match):
        checked_batch(engine, tokens, lengths, segments, 8, 10, None, exclude)


def broken(engine, rule: str):
    """A valid request of two rows, then ``rule`` (a ``VALUE_RULES`` name) broken alone."""
    tokens, lengths, segments, exclude = request(2, 6)
    lengths = torch.tensor([20, 13])
    if rule == "lengths_positive":
        lengths[1] = 0
    if rule == "lengths_fit":
        lengths[1] = 21
    if rule == "token_range":
        tokens[1, 12] = engine.model.config.vocab_size
    if rule == "segment_order":
        segments[0, 7] = segments[0, 6] - 1
    if rule == "exclusion_ids":
        exclude[1, 2] = -2
    if rule == "positions":
        longest = engine.model.config.max_position
        tokens = torch.full((2, longest), 9)
        segments, lengths = None, torch.tensor([5, longest])
    return tokens, lengths, segments, exclude


@pytest.mark.parametrize("rule", VALUE_RULES, ids=[rule.name for rule in VALUE_RULES])
def test_each_value_rule_raises_its_own_message(engine, rule):
    """Every rule of the table, broken alone, raises a message that starts with that rule's
    text (``test_invalid_values_search_safely_then_raise_and_the_engine_goes_on`` runs such
    requests through ``recommend``); the flags hold one entry per rule."""
    tokens, lengths, segments, exclude = broken(engine, rule.name)
    args = check_arguments(engine.limits, tokens, lengths, segments, 8, 10, None, exclude)
    verdict = engine.runner.verdict(args)
    assert verdict.flags.shape == (FLAG_COUNT,)
    with pytest.raises(InvalidInputError) as info:
        verdict.raise_if_invalid()
    assert str(info.value).startswith(rule.text), str(info.value)


def test_recommend_reads_the_host_once_and_after_the_search(engine, monkeypatch):
    tokens, lengths, segments, exclude = request(3, 7)
    order = []
    plain = search.search

    def recording_search(*args, **kwargs):
        order.append("search")
        return plain(*args, **kwargs)
    want = engine.recommend(tokens, lengths, segments, beam_width=8, top_k=10,
                            exclude_items=exclude)
    with host_reads(monkeypatch) as reads:
        monkeypatch.setattr(search, "search", recording_search)
        got = engine.recommend(tokens, lengths, segments, beam_width=8, top_k=10,
                               exclude_items=exclude)
        assert reads() == 1
    assert order == ["search"]
    assert torch.equal(got[0], want[0])


@pytest.mark.parametrize("case,match", [
    ("empty", "lengths must be >= 1"),
    ("too_long_length", "lengths must be <="),
    ("token_out_of_range", "token_ids must lie in"),
    ("negative_token", "token_ids must lie in"),
    ("segments_fall", "non-decreasing"),
    ("exclusion", "exclude_items must hold item ids"),
])
def test_invalid_values_search_safely_then_raise_and_the_engine_goes_on(engine, case, match):
    """The search runs on the sanitised copy (no out-of-range index however bad the values),
    then the verdict names the rule; the next valid request gets its usual answer."""
    tokens, lengths, segments, exclude = request(2, 9)
    want = engine.recommend(tokens, lengths, segments, beam_width=8, top_k=10,
                            exclude_items=exclude)
    bad_tokens, bad_lengths = tokens.clone(), lengths.clone()
    bad_segments, bad_exclude = segments.clone(), exclude.clone()
    if case == "empty":
        bad_lengths[0] = 0
        bad_tokens[0, 0] = engine.model.config.vocab_size + 7   # outside the length: allowed
    if case == "too_long_length":
        bad_lengths[1] = 50
    if case == "token_out_of_range":
        bad_tokens[1, 0] = engine.model.config.vocab_size + 7
    if case == "negative_token":
        bad_tokens[0, 0] = -5
    if case == "segments_fall":
        bad_segments[0, 0] = bad_segments[0, -1] + 3
    if case == "exclusion":
        bad_exclude[1, 0] = -9
    with pytest.raises(InvalidInputError, match=match):
        engine.recommend(bad_tokens, bad_lengths, bad_segments, beam_width=8, top_k=10,
                         exclude_items=bad_exclude)
    again = engine.recommend(tokens, lengths, segments, beam_width=8, top_k=10,
                             exclude_items=exclude)
    assert torch.equal(again[0], want[0])


def _cuda_engine(seed: int) -> Engine:
    rng = np.random.default_rng(seed)
    ids = rng.choice(np.arange(10_000), size=200, replace=False)
    return Engine(Model.from_preset("tiny", seed=0).cuda(),
                  Catalog.from_arrays(ids, rng.integers(0, 8, (200, 3))),
                  EngineConfig(max_beam_width=64, max_exclude=64))


def _synchronising_calls(work) -> tuple[list[str], object]:
    """Run ``work()`` (once warmed up) under ``set_sync_debug_mode("warn")``, which warns on
    every synchronising call; returns those warnings and ``work``'s result."""
    import warnings

    work()                                              # warm-up: allocations, capture
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = work()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return [str(w.message) for w in caught if "synchroniz" in str(w.message)], result


@pytest.mark.gpu
def test_cuda_recommend_synchronises_once():
    """A whole ``recommend`` on CUDA inputs (whole-search graph replay): one synchronising
    call, the verdict's read after the search."""
    engine = _cuda_engine(2)
    tokens, lengths, segments, exclude = (t.cuda() for t in request(8, 5))
    syncs, _ = _synchronising_calls(lambda: engine.recommend(
        tokens, lengths, segments, beam_width=8, top_k=10, exclude_items=exclude))
    assert len(syncs) == 1, syncs


@pytest.mark.gpu
@pytest.mark.parametrize("segmented", [False, True])
def test_cuda_inputs_cost_one_device_sync(segmented):
    """On CUDA-resident inputs (as ``bench_engine.py`` passes them) the checks wait for the
    device once."""
    engine = _cuda_engine(1)
    tokens, lengths, segments, exclude = (t.cuda() for t in request(8, 4))
    syncs, checked = _synchronising_calls(lambda: checked_batch(
        engine, tokens, lengths, segments if segmented else None, 8, 10, None, exclude))
    assert len(syncs) == 1, syncs
    assert checked.token_ids.device == engine.device
