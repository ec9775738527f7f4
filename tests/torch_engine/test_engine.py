"""Engine.recommend against brute-force scoring and a plain-Python beam search on full forwards."""

import numpy as np
import pytest
import torch

from tests.torch_engine.engine_worlds import checked_batch, prompts, small_world
from torch_engine import search
from torch_engine.catalog import Catalog
from torch_engine.checks import Verdict, check_arguments
from torch_engine.config import EngineConfig
from torch_engine.engine import Engine
from torch_engine.model import Model
from torch_engine.runner import Runner, StaticInputs
from xgr_common.buckets import BucketPolicy, bucket_of
from xgr_common.errors import ConfigError, InvalidInputError
from xgr_common.layout import MaskMode, TokenLayout
from xgr_common.tolerances import tolerance_for
from xgr_common.value_rules import FLAG_COUNT, FLAG_INDEX

FP32 = tolerance_for(torch.float32)
LAYOUT = TokenLayout()


@pytest.fixture(scope="module")
def model():
    return Model.from_preset("tiny", seed=11)


@pytest.fixture(scope="module")
def world():
    ids, codes = small_world()
    return ids, codes, Engine(Model.from_preset("tiny", seed=11), Catalog.from_arrays(ids, codes))


def level_logp(model, tokens, segs, prefix, codes):
    """Log-probs over the next code after ``prefix`` (full forward), normalised over the codes
    the catalog allows there; -inf elsewhere."""
    level = len(prefix)
    seq = torch.tensor(list(tokens) + [LAYOUT.code_token(i, c) for i, c in enumerate(prefix)])
    if segs is None:
        logits = model(seq[None])[0, -1]
    else:
        seg = torch.cat([segs, segs[-1] + 1 + torch.arange(level, dtype=torch.int32)])
        logits = model(seq[None], segment_ids=seg[None], mode=MaskMode.ITEM_CAUSAL)[0, -1]
    start, end = LAYOUT.level_range(level)
    masked = logits[start:end].double().masked_fill(~allowed_codes(codes, prefix), float("-inf"))
    return torch.log_softmax(masked, dim=0)


def allowed_codes(codes, prefix):
    """[C] bool: the codes the catalog allows after ``prefix``."""
    level = len(prefix)
    allowed = np.zeros(LAYOUT.codebook_size, dtype=bool)
    match = (codes[:, :level] == np.asarray(prefix, dtype=np.int64)).all(axis=1)
    allowed[np.unique(codes[match, level])] = True
    return torch.from_numpy(allowed)


def brute_force_path_scores(model, tokens, segs, codes):
    """{path: score} for every distinct path: one batched forward over prompt + path tokens
    gives the three levels' logits (after the prompt, after c0, after c1)."""
    paths = sorted({tuple(c) for c in codes.tolist()})
    n = tokens.shape[0]
    seq = torch.stack([torch.cat([tokens, torch.tensor([LAYOUT.code_token(0, p[0]),
                                                        LAYOUT.code_token(1, p[1])])])
                       for p in paths])
    with torch.no_grad():
        if segs is None:
            logits = model(seq)
        else:
            seg = torch.cat([segs, segs[-1] + 1 + torch.arange(2, dtype=torch.int32)])
            logits = model(seq, segment_ids=seg.expand(len(paths), -1),
                           mode=MaskMode.ITEM_CAUSAL)
    scores = {}
    for row, path in enumerate(paths):
        total = 0.0
        for level in range(3):
            start, end = LAYOUT.level_range(level)
            masked = logits[row, n - 1 + level, start:end].double().masked_fill(
                ~allowed_codes(codes, path[:level]), float("-inf"))
            total += float(torch.log_softmax(masked, dim=0)[path[level]])
        scores[path] = total
    return scores


def python_beam_search(model, tokens, segs, ids, codes, width, top_k, exclude=()):
    """Beam search with one full forward per beam and level; then items of the best paths."""
    beams = [((), 0.0)]
    excluded = set(exclude)
    with torch.no_grad():
        for level in range(3):
            cands = []
            for prefix, score in beams:
                logp = level_logp(model, tokens, segs, prefix, codes)
                for code in np.flatnonzero(np.isfinite(logp.numpy())):
                    path = prefix + (int(code),)
                    items = ids[(codes[:, :level + 1] == path).all(axis=1)]
                    if all(int(i) in excluded for i in items):
                        continue                    # nothing left under this prefix
                    cands.append((path, score + float(logp[code])))
            beams = sorted(cands, key=lambda c: -c[1])[:width]
    out = []
    for path, score in beams:
        for item in sorted(ids[(codes == path).all(axis=1)].tolist()):
            if item not in excluded:
                out.append((item, score))
    return out[:top_k]


def assert_same(got_items, got_scores, expected):
    items = [i for i in got_items.tolist() if i >= 0]
    assert items == [i for i, _ in expected]
    np.testing.assert_allclose(got_scores[:len(items)].numpy(), [s for _, s in expected],
                               rtol=FP32.rtol, atol=FP32.atol)


@pytest.mark.parametrize("segmented", [False, True])
def test_beam_covering_every_prefix_equals_brute_force(world, segmented):
    ids, codes, engine = world
    paths = engine.catalog.num_prefixes[-1]
    tokens, lengths, segs = prompts(1, [13], segmented=segmented)
    items, scores = engine.recommend(tokens, lengths, segs, beam_width=paths, top_k=ids.shape[0])
    # Brute force: score every item's full path on full forwards, sort (score desc, id asc).
    path_score = brute_force_path_scores(engine.model, tokens[0], None if segs is None
                                         else segs[0], codes)
    item_scores = np.array([path_score[tuple(c)] for c in codes.tolist()])
    order = np.lexsort((ids, -item_scores))
    assert_same(items[0], scores[0], [(int(ids[i]), item_scores[i]) for i in order])


@pytest.mark.parametrize("width,top_k", [(3, 7), (8, 20), (1, 2)])
def test_ranked_beams_equal_python_beam_search(world, width, top_k):
    ids, codes, engine = world
    assert engine.catalog.num_prefixes[1] > width or engine.catalog.num_prefixes[2] > width
    tokens, lengths, segs = prompts(2, [9])
    items, scores = engine.recommend(tokens, lengths, segs, beam_width=width, top_k=top_k)
    expected = python_beam_search(engine.model, tokens[0], segs[0], ids, codes, width, top_k)
    assert_same(items[0], scores[0], expected)


@pytest.mark.parametrize("exclude", [False, True])
def test_a_smaller_top_k_returns_the_first_items_of_a_larger_one(world, exclude):
    """What lets a served request have its own top_k without its own search: the beams do
    not depend on top_k, and the final pick is sorted by one order (score, then item id)."""
    ids, _, engine = world
    tokens, lengths, segs = prompts(3, [11, 4, 7])
    excluded = torch.tensor([[int(ids[0]), int(ids[5]), -1]] * 3) if exclude else None
    width, most = 4, 12
    full_items, full_scores = engine.recommend(tokens, lengths, segs, beam_width=width,
                                               top_k=most, exclude_items=excluded)
    for k in (1, 2, 5, most - 1):
        items, scores = engine.recommend(tokens, lengths, segs, beam_width=width, top_k=k,
                                         exclude_items=excluded)
        assert torch.equal(items, full_items[:, :k]), k
        assert torch.equal(scores, full_scores[:, :k]), k


@pytest.mark.parametrize("as_list", [False, True], ids=["table", "list"])
@pytest.mark.parametrize("width,top_k", [(1, 1), (4, 6)])
def test_excluded_items_never_returned_and_exhausted_paths_never_expanded(world, width, top_k,
                                                                          as_list):
    ids, codes, engine = world
    tokens, lengths, segs = prompts(3, [11])
    best, _ = engine.recommend(tokens, lengths, segs, beam_width=width, top_k=top_k)
    # Exclude every item of the best path, one item of another path, and an unknown id.
    best_path = codes[ids == int(best[0, 0])][0]
    whole_path = ids[(codes == best_path).all(axis=1)].tolist()
    exclude = whole_path + [int(best[0, -1]), 999_999]
    given = [torch.tensor(exclude)] if as_list else torch.tensor([exclude + [-1, -1]])
    items, scores = engine.recommend(tokens, lengths, segs, beam_width=width, top_k=top_k,
                                     exclude_items=given)
    assert not set(items[0].tolist()) & set(exclude)
    assert int(items[0, 0]) >= 0  # the beam moved to a path with items left
    expected = python_beam_search(engine.model, tokens[0], segs[0], ids, codes, width,
                                  top_k, exclude=exclude)
    assert_same(items[0], scores[0], expected)


@pytest.mark.parametrize("selection", ["torch", "triton"])
def test_a_prefix_whose_items_are_all_excluded_takes_no_beam_at_any_level(world, selection):
    """Excluding every item under the best first code: with one beam, a search that only
    checked full paths would spend its beam there and return nothing; it must move on."""
    ids, codes, engine = world
    engine = Engine(engine.model, engine.catalog, EngineConfig(selection_backend=selection))
    tokens, lengths, segs = prompts(21, [10])
    best, _ = engine.recommend(tokens, lengths, segs, beam_width=1, top_k=1)
    first_code = codes[ids == int(best[0, 0])][0][0]
    exclude = ids[codes[:, 0] == first_code].tolist()
    assert len(exclude) > 1 and len(exclude) < len(ids)
    items, scores = engine.recommend(tokens, lengths, segs, beam_width=1, top_k=1,
                                     exclude_items=[torch.tensor(exclude)])
    assert int(items[0, 0]) >= 0 and int(items[0, 0]) not in exclude
    expected = python_beam_search(engine.model, tokens[0], segs[0], ids, codes, 1, 1,
                                  exclude=exclude)
    assert_same(items[0], scores[0], expected)


@pytest.mark.parametrize("row", range(3))
def test_results_exist_are_unique_and_sorted_when_top_k_exceeds_beam_width(model, row):
    ids, codes = small_world(seed=5, n=400, used_codes=4)  # about 6 items per path
    catalog = Catalog.from_arrays(ids, codes)
    engine = Engine(model, catalog)
    tokens, lengths, segs = prompts(4, [12, 5, 9])
    items, scores = engine.recommend(tokens, lengths, segs, beam_width=5, top_k=25)
    assert items.shape == (3, 25) and items.dtype == torch.int64
    assert scores.dtype == torch.float32
    got = items[row].tolist()
    assert len(set(got)) == 25 and set(got) <= set(ids.tolist())
    assert bool((scores[row][1:] <= scores[row][:-1]).all())


@pytest.mark.parametrize("row", range(4))
def test_batched_equals_one_by_one(world, row):
    _, _, engine = world
    tokens, lengths, segs = prompts(5, [14, 6, 10, 1])
    items, scores = engine.recommend(tokens, lengths, segs, beam_width=6, top_k=12)
    n = int(lengths[row])
    alone_items, alone_scores = engine.recommend(tokens[row:row + 1, :n], lengths[row:row + 1],
                                                 segs[row:row + 1, :n], beam_width=6,
                                                 top_k=12)
    assert torch.equal(items[row], alone_items[0])
    torch.testing.assert_close(scores[row], alone_scores[0], rtol=FP32.rtol, atol=FP32.atol)


@pytest.mark.parametrize("segmented", [False, True])
def test_static_packing_equals_dynamic_packing(world, segmented):
    """Fixed-capacity packing (padding slots computed in a tail segment) changes no result."""
    _, _, engine = world
    static = Engine(engine.model, engine.catalog, EngineConfig(static_shapes=True))
    tokens, lengths, segs = prompts(14, [3, 15, 8], segmented=segmented)
    soft = torch.randn(3, 2, 64, generator=torch.Generator().manual_seed(15))
    exclude = torch.tensor([[-1], [int(engine.catalog.path_items[0])], [-1]])
    args = dict(beam_width=7, top_k=12, prefix_embeds=soft, exclude_items=exclude)
    want = engine.recommend(tokens, lengths, segs, **args)
    got = static.recommend(tokens, lengths, segs, **args)
    assert torch.equal(got[0], want[0])
    torch.testing.assert_close(got[1], want[1], rtol=FP32.rtol, atol=FP32.atol)


@pytest.mark.parametrize("segmented", [False, True])
def test_padded_buffers_give_each_request_its_own_result(world, segmented):
    """What a whole-search graph runs (``Runner._search_buffers``), eagerly: a request of 3
    rows in the buffers of its bucket (4 rows, width 22, 4 exclusion columns) that an earlier,
    wider and invalid request left full of stale values. Each real row equals the eager engine's
    result, the flags equal the eager rules' flags, and the padding row runs as a one-token
    request."""
    _, _, engine = world
    static = Engine(engine.model, engine.catalog, EngineConfig(static_shapes=True))
    runner = static.runner
    tokens, lengths, segs = prompts(16, [3, 15, 8], segmented=segmented)
    soft = torch.randn(3, 2, 64, generator=torch.Generator().manual_seed(17))
    exclude = torch.tensor([[-1, -1, -1], [int(engine.catalog.path_items[0]), -1, -1],
                            [-1, int(engine.catalog.path_items[1]), -1]])
    want = engine.recommend(tokens, lengths, segs, beam_width=7, top_k=12, prefix_embeds=soft,
                            exclude_items=exclude)
    args = check_arguments(static.limits, tokens, lengths, segs, 7, 12, soft, exclude)
    policy = BucketPolicy(length_multiple=8)
    bucket = bucket_of(3, 15, 2, 3, segs is None, policy)
    assert (bucket.rows, bucket.width, bucket.soft, bucket.excluded) == (4, 22, 2, 4)
    padded = StaticInputs.allocate(bucket, 64, static.dtype, static.device)
    # An earlier request of the same bucket: 4 rows, ids past the vocabulary, lengths past
    # the width, falling segments, exclusion ids < -1.
    stale = torch.full((4, 22), 10 ** 6)
    stale_segments = None if segs is None else torch.full((4, 22), -3, dtype=torch.int32)
    old = check_arguments(static.limits, stale, torch.full((4,), 30), stale_segments, 7, 12,
                          torch.full((4, 2, 64), 9.0), torch.full((4, 4), -7))
    assert bucket_of(4, 22, 2, 4, segs is None, policy) == bucket
    padded.load(old)
    padded.load(args)
    with torch.no_grad():
        items, scores, flags = runner._search_buffers(padded, 7, 12)
    assert torch.equal(flags, runner.verdict(args).flags)
    assert torch.equal(items[:3], want[0])
    torch.testing.assert_close(scores[:3], want[1], rtol=FP32.rtol, atol=FP32.atol)
    assert bool((items[3] >= 0).any())                       # the padding row ran normally
    padded.load(old)
    with torch.no_grad():
        flags = runner._search_buffers(padded, 7, 12)[2]
    cfg = static.model.config
    verdict = Verdict.of(old, flags, cfg.vocab_size, static.catalog.levels, cfg.max_position)
    with pytest.raises(InvalidInputError, match="lengths must be <= token_ids.shape"):
        verdict.raise_if_invalid()


def test_a_runner_captures_only_on_cuda_with_static_shapes(world):
    _, _, engine = world
    options = search.SearchOptions(static_shapes=True)
    with pytest.raises(ConfigError, match="captured searches need CUDA and static shapes"):
        Runner(engine.model, engine.catalog, options, BucketPolicy())


class _HostReads(torch.utils._python_dispatch.TorchDispatchMode):
    """Records ops that read device values on the host or copy host data in: on a GPU each
    is a synchronisation or breaks CUDA-graph capture."""

    SYNCING = {"aten::_local_scalar_dense", "aten::nonzero", "aten::is_nonzero",
               "aten::lift_fresh", "aten::item", "aten::masked_select", "aten::unique_dim",
               "aten::_unique2", "aten::repeat_interleave"}

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func._schema.name in self.SYNCING:
            self.seen.append(func._schema.name)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("static,selection,reads", [
    (True, "torch", []), (True, "triton", []),
    (False, "torch", ["aten::nonzero"]),                    # the probe does see host reads
])
def test_static_search_never_reads_device_values_on_the_host(world, static, selection, reads):
    """What the CPU can check of the CUDA-graph contract: the static search (prefill, decode,
    selection, expansion) calls no op that reads a value back or copies host data in."""
    _, _, engine = world
    engine = Engine(engine.model, engine.catalog,
                    EngineConfig(static_shapes=static, selection_backend=selection))
    tokens, lengths, segs = prompts(18, [9, 4])
    exclude = torch.tensor([[int(engine.catalog.path_items[2])], [-1]])
    batch = checked_batch(engine, tokens, lengths, segs, 6, 10, None, exclude)
    with torch.no_grad(), _HostReads() as seen:
        search.search(engine.model, engine.catalog, batch, 6, 10, engine.options,
                      engine.runner.exclusions)
    assert seen.seen == reads


@pytest.mark.parametrize("segmented", [False, True])
def test_prefix_embeds_equal_the_tokens_they_embed(world, segmented):
    _, _, engine = world
    tokens, lengths, segs = prompts(6, [12, 8], segmented=segmented)
    soft = 3
    if segmented:
        segs[:, :soft] = 0  # soft tokens belong to the profile segment
    full = engine.recommend(tokens, lengths, segs, beam_width=5, top_k=9)
    with torch.no_grad():
        embeds = engine.model.embed(tokens[:, :soft])
    rest = engine.recommend(tokens[:, soft:], lengths - soft,
                            None if segs is None else segs[:, soft:], beam_width=5, top_k=9,
                            prefix_embeds=embeds)
    assert torch.equal(full[0], rest[0])
    torch.testing.assert_close(full[1], rest[1], rtol=FP32.rtol, atol=FP32.atol)


GOOD = dict(token_ids=torch.full((2, 4), 9), lengths=torch.tensor([4, 2]))
BAD_INPUTS = [
    (dict(lengths=torch.tensor([4, 0])), "lengths must be >= 1"),
    (dict(lengths=torch.tensor([5, 2])), r"lengths must be <= token_ids.shape\[1\] = 4"),
    (dict(lengths=torch.tensor([4])), r"lengths must have shape \[2\]"),
    (dict(token_ids=torch.tensor([[9, 9, 9, 2000], [9, 9, 0, 0]])), "token_ids must lie in"),
    (dict(token_ids=torch.full((2, 4), 9.0)), "token_ids must have an integer dtype"),
    (dict(token_ids=torch.full((4,), 9)), "token_ids must be 2-D"),
    (dict(beam_width=0), "beam_width must be an int in"),
    (dict(beam_width=65), "beam_width must be an int in"),
    (dict(top_k=61), r"top_k must be an int in \[1, "),
    (dict(segment_ids=torch.zeros(2, 3, dtype=torch.int32)), "segment_ids must have the shape"),
    (dict(segment_ids=torch.tensor([[0, 1, 0, 0], [0, 0, 0, 0]])), "non-decreasing"),
    (dict(prefix_embeds=torch.zeros(2, 3, 5)), r"prefix_embeds must have shape \[2, S, 64\]"),
    (dict(exclude_items=torch.tensor([[1, -2], [1, 2]])), "exclude_items must hold item ids"),
    (dict(exclude_items=[torch.tensor([1])]), "one tensor per request"),
    (dict(exclude_items=torch.zeros(2, 70, dtype=torch.long)), "max_exclude=64"),
]


@pytest.mark.parametrize("change,match", BAD_INPUTS, ids=[m for _, m in BAD_INPUTS])
def test_bad_inputs_raise_clear_value_errors(model, change, match):
    ids, codes = small_world()
    engine = Engine(model, Catalog.from_arrays(ids, codes),
                    EngineConfig(max_beam_width=64, max_exclude=64))
    args = {"beam_width": 4, "top_k": 5, **GOOD, **change}
    with pytest.raises(InvalidInputError, match=match) as info:
        engine.recommend(**args)
    assert isinstance(info.value, ValueError)


class _Features(torch.nn.Module):
    """``search.search_features`` with tensors in and out, as an exported program calls it:
    the catalog's tables stay arguments of the call, not state of a closure."""

    def __init__(self, engine):
        super().__init__()
        self.model, self.catalog, self.options = engine.model, engine.catalog, engine.options

    def forward(self, token_ids, lengths, segment_ids, exclude_items):
        items, scores, _ = search.search_features(self.model, self.catalog, token_ids,
                                                  lengths, segment_ids, None, exclude_items,
                                                  6, 10, self.options)
        return items, scores


@pytest.mark.heavy
@pytest.mark.parametrize("static", [False, True])
def test_search_exports_with_dynamic_batch_and_length(world, static):
    _, _, engine = world
    engine = Engine(engine.model, engine.catalog, EngineConfig(static_shapes=static))
    wrapper = _Features(engine)
    tokens, lengths, segs = prompts(12, [12, 7])
    batch_dim = torch.export.Dim("batch", min=1, max=64)
    length_dim = torch.export.Dim("length", min=2, max=4096)
    exported = torch.export.export(
        wrapper, (tokens, lengths, segs, torch.full((2, 3), -1)), strict=False,
        dynamic_shapes=({0: batch_dim, 1: length_dim}, {0: batch_dim},
                        {0: batch_dim, 1: length_dim}, {0: batch_dim}))
    tokens, lengths, segs = prompts(13, [20, 5, 9])
    exclude = torch.tensor([[-1, -1, -1], [1000, -1, -1], [-1, -1, -1]])
    with torch.no_grad():
        got = exported.module()(tokens, lengths, segs, exclude)
        want = engine.recommend(tokens, lengths, segs, beam_width=6, top_k=10,
                                exclude_items=exclude)
    assert torch.equal(got[0], want[0])
    torch.testing.assert_close(got[1], want[1], rtol=FP32.rtol, atol=FP32.atol)


def test_search_features_sanitises_by_the_value_rules(world):
    """Values the rules forbid (ids past the vocabulary outside the length, a falling segment
    id there) change nothing: the features search equals the engine on the valid copy, and
    its flags name the broken rule."""
    _, _, engine = world
    tokens, lengths, segs = prompts(19, [12, 7])
    want = engine.recommend(tokens, lengths, segs, beam_width=6, top_k=10)
    noisy = tokens.clone()
    noisy[1, 7:] = engine.model.config.vocab_size + 5          # past row 1's length
    with torch.no_grad():
        items, scores, flags = search.search_features(
            engine.model, engine.catalog, noisy.int(), lengths.int(), segs, None, None, 6, 10,
            engine.options)
    assert torch.equal(items, want[0])
    torch.testing.assert_close(scores, want[1], rtol=FP32.rtol, atol=FP32.atol)
    expected = [0] * FLAG_COUNT
    expected[FLAG_INDEX["positions"]] = 12                      # the longest length
    assert flags.tolist() == expected
    noisy[0, 3] = -4                                             # inside row 0's length
    with torch.no_grad():
        flags = search.search_features(engine.model, engine.catalog, noisy, lengths, segs,
                                       None, None, 6, 10, engine.options)[2]
    expected[FLAG_INDEX["token_range"]] = 1
    assert flags.tolist() == expected
