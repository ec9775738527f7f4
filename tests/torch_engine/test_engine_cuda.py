"""The engine on CUDA: no host synchronisation, whole-search graph replays (``runner``) equal
to eager searches, the fused selection path against the torch one, out-of-memory
containment."""

import numpy as np
import pytest
import torch

from tests.torch_engine.engine_worlds import checked_batch, prompts, small_world
from torch_engine import search
from torch_engine.catalog import Catalog
from torch_engine.checks import check_arguments
from torch_engine.config import EngineConfig
from torch_engine.engine import Engine
from torch_engine.model import Model
from xgr_common.errors import InvalidInputError


@pytest.mark.gpu
@pytest.mark.parametrize("selection", ["torch", "triton"])
@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("width", [4, 64])
def test_search_runs_on_cuda_without_host_sync(width, backend, static, selection):
    """Decode never waits for the host; with static packing prefill does not either."""
    ids, codes = small_world(seed=7, n=3000, used_codes=12)
    cpu_engine = Engine(Model.from_preset("tiny", seed=11), Catalog.from_arrays(ids, codes))
    gpu_engine = Engine(Model.from_preset("tiny", seed=11, device="cuda"),
                        Catalog.from_arrays(ids, codes),
                        EngineConfig(attention_backend=backend, cuda_graphs=False,
                                     static_shapes=static, selection_backend=selection))
    tokens, lengths, segs = prompts(8, [30, 12, 21])
    exclude = torch.tensor([[int(ids[0]), -1], [int(ids[1]), int(ids[2])], [-1, -1]])
    expected = cpu_engine.recommend(tokens, lengths, segs, beam_width=width, top_k=20,
                                    exclude_items=exclude)
    batch = checked_batch(gpu_engine, tokens.cuda(), lengths.cuda(), segs.cuda(), width, 20,
                          None, exclude.cuda())
    tables = (gpu_engine.model, gpu_engine.catalog)
    options, exclusions = gpu_engine.options, gpu_engine.runner.exclusions
    with torch.no_grad():
        state = None if static else search.prefill(*tables, batch, options, exclusions)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            if static:
                state = search.prefill(*tables, batch, options, exclusions)
            items, scores = search.decode(*tables, state, width, 20, options, exclusions)
        finally:
            torch.cuda.set_sync_debug_mode(0)
    assert torch.equal(items.cpu(), expected[0])
    torch.testing.assert_close(scores.cpu(), expected[1], rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_graph_replays_equal_eager_search_across_batches(backend, static):
    """Two batches of one shape but different lengths replay the one captured whole-search
    graph and match the eager search; without static shapes the CUDA engine searches
    eagerly (graphs need static shapes)."""
    ids, codes = small_world(seed=9, n=3000, used_codes=12)
    model = Model.from_preset("tiny", seed=11, device="cuda")
    catalog = Catalog.from_arrays(ids, codes)
    graphed = Engine(model, catalog, EngineConfig(attention_backend=backend,
                                                  static_shapes=static))
    eager = Engine(model, catalog, EngineConfig(attention_backend=backend, cuda_graphs=False))
    assert (graphed.runner.policy is not None) == static and eager.runner.policy is None
    for seed, lengths in ((10, [30, 12, 21]), (11, [5, 30, 9])):
        tokens, lens, segs = prompts(seed, lengths, width=30)
        args = (tokens.cuda(), lens.cuda(), segs.cuda())
        got = graphed.recommend(*args, beam_width=32, top_k=50)
        want = eager.recommend(*args, beam_width=32, top_k=50)
        assert torch.equal(got[0], want[0])
        torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-5)
    assert len(graphed.runner) == int(static)


@pytest.mark.gpu
@pytest.mark.parametrize("selection", ["torch", "triton"])
def test_default_cuda_engine_replays_one_graph_per_bucket_without_host_sync(selection,
                                                                          monkeypatch):
    """The default CUDA engine (whole-search graphs, bucketed shapes): batches of 3 and 4
    requests with different prompt lengths share one graph (the memory check runs only
    before its capture), the replay never waits for the host
    (``set_sync_debug_mode("error")``), and every row equals the eager search."""
    from torch_engine import engine as engine_module
    checks = []
    check = engine_module.check_capacity
    monkeypatch.setattr(engine_module, "check_capacity",
                        lambda *args: checks.append(args[0]) or check(*args))
    ids, codes = small_world(seed=9, n=3000, used_codes=12)
    model = Model.from_preset("tiny", seed=11, device="cuda")
    catalog = Catalog.from_arrays(ids, codes)
    graphed = Engine(model, catalog, EngineConfig(selection_backend=selection))
    eager = Engine(model, catalog, EngineConfig(cuda_graphs=False, selection_backend=selection))
    assert graphed.options.static_shapes and not eager.options.static_shapes
    for seed, lengths in ((12, [30, 12, 21]), (13, [5, 40, 9, 17])):
        tokens, lens, segs = prompts(seed, lengths)
        args = (tokens.cuda(), lens.cuda(), segs.cuda())
        got = graphed.recommend(*args, beam_width=32, top_k=50)
        want = eager.recommend(*args, beam_width=32, top_k=50)
        assert got[0].shape == (len(lengths), 50) and torch.equal(got[0], want[0])
        torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-5)
    assert len(graphed.runner) == 1
    # The footprint is what the check reads of its engine.
    assert sum(f is graphed.footprint for f in checks) == 1
    assert sum(f is eager.footprint for f in checks) == 2
    checked = check_arguments(graphed.limits, *args, 32, 50, None, None)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        items, _, _ = graphed.runner.run(checked, 32, 50)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert torch.equal(items[:4], want[0])


@pytest.mark.gpu
@pytest.mark.parametrize("width", [16, 64])
def test_cuda_fused_path_with_exhausting_exclusions_equals_the_torch_path(width):
    """The default CUDA engine (whole-search graph; fused selection with its exclusion
    kernels) against the eager torch selection, with 300 of 3000 items excluded per request:
    with about two items per path many prefixes are exhausted at every level."""
    ids, codes = small_world(seed=9, n=3000, used_codes=12)
    model = Model.from_preset("tiny", seed=11, device="cuda")
    catalog = Catalog.from_arrays(ids, codes)
    fused = Engine(model, catalog)
    plain = Engine(model, catalog, EngineConfig(cuda_graphs=False, selection_backend="torch"))
    assert fused.options.selection == "triton" and fused.runner.exclusions is not None
    rng = np.random.default_rng(3)
    tokens, lens, segs = prompts(14, [30, 12, 21])
    exclude = torch.from_numpy(np.stack([rng.choice(ids, 300, replace=False)
                                         for _ in range(3)])).cuda()
    exclude[1, 250:] = -1
    args = (tokens.cuda(), lens.cuda(), segs.cuda())
    got = fused.recommend(*args, beam_width=width, top_k=80, exclude_items=exclude)
    want = plain.recommend(*args, beam_width=width, top_k=80, exclude_items=exclude)
    assert torch.equal(got[0], want[0])
    torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-5)
    for row in range(3):
        found = got[0][row][got[0][row] >= 0]     # -1: fewer items than top_k reachable
        assert found.numel() > 0 and not bool(torch.isin(found, exclude[row]).any())


@pytest.mark.gpu
@pytest.mark.parametrize("seed,lengths", [(23, [45]), (24, [37]), (25, [45, 20, 37])])
@pytest.mark.parametrize("graphs", [False, True])
def test_causal_requests_on_cuda_equal_the_cpu_engine(graphs, seed, lengths):
    """Causal requests, alone and batched (their prefill attention through SDPA's causal
    kernel over request-major rows, cuDNN on Hopper; decode reading each request's tokens by
    ``seq_lens``), with a soft prefix and the buckets' padding tails: the same items as the
    CPU engine's plain-torch search, in the eager engine and replayed in its captured graph."""
    ids, codes = small_world(seed=9, n=3000, used_codes=12)
    catalog = Catalog.from_arrays(ids, codes)
    cpu = Engine(Model.from_preset("tiny", seed=11), catalog)
    gpu = Engine(Model.from_preset("tiny", seed=11, device="cuda"), catalog,
                 EngineConfig(cuda_graphs=graphs, static_shapes=True))
    assert gpu.options.attention == "triton"
    tokens, lengths, _ = prompts(seed, lengths, segmented=False)
    soft = torch.randn(len(lengths), 3, 64, generator=torch.Generator().manual_seed(seed))
    want = cpu.recommend(tokens, lengths, beam_width=16, top_k=30, prefix_embeds=soft)
    got = gpu.recommend(tokens.cuda(), lengths.cuda(), beam_width=16, top_k=30,
                        prefix_embeds=soft.cuda())
    assert torch.equal(got[0].cpu(), want[0])
    torch.testing.assert_close(got[1].cpu(), want[1], rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
def test_graph_replays_read_nothing_stale_after_invalid_or_wider_requests():
    """One bucket's graph replayed in turn by: a valid request with exclusions; an invalid one
    (an id out of range) that raises and leaves its values in the buffers; a narrower request
    of fewer rows whose 3 exclusion columns are all padding, which must see neither the stale
    ids nor the stale exclusions (its 4th column). Every valid result equals the eager
    engine's."""
    ids, codes = small_world(seed=9, n=3000, used_codes=12)
    model = Model.from_preset("tiny", seed=11, device="cuda")
    catalog = Catalog.from_arrays(ids, codes)
    graphed = Engine(model, catalog, EngineConfig())
    eager = Engine(model, catalog, EngineConfig(cuda_graphs=False))
    tokens, lens, segs = (t.cuda() for t in prompts(21, [40, 33, 12, 25]))
    eager_items = eager.recommend(tokens, lens, segs, beam_width=32, top_k=50)[0]
    exclude = eager_items[:, :4].contiguous()             # 4 columns: the bucket of 3
    want = eager.recommend(tokens, lens, segs, beam_width=32, top_k=50, exclude_items=exclude)
    got = graphed.recommend(tokens, lens, segs, beam_width=32, top_k=50, exclude_items=exclude)
    assert torch.equal(got[0], want[0])
    bad = tokens.clone()
    bad[2, 5] = model.config.vocab_size
    with pytest.raises(InvalidInputError, match="token_ids must lie in"):
        graphed.recommend(bad, lens, segs, beam_width=32, top_k=50, exclude_items=exclude)
    small = (tokens[:3, :30].contiguous(), lens[:3].clamp(max=30), segs[:3, :30].contiguous())
    want = eager.recommend(*small, beam_width=32, top_k=50)
    padding = torch.full((3, 3), -1, device="cuda")         # 3 columns, none excluded
    got = graphed.recommend(*small, beam_width=32, top_k=50, exclude_items=padding)
    assert torch.equal(got[0], want[0])
    torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-5)
    assert len(graphed.runner) == 1


@pytest.mark.gpu
def test_real_cuda_out_of_memory_fails_one_batch_and_the_next_runs_normally(monkeypatch):
    """A device allocation that cannot be served inside a batch (eager search) raises
    CapacityError; memory is released and the next batch returns the same items."""
    from torch_engine import beam_search
    from xgr_common.errors import CapacityError
    ids, codes = small_world(seed=9, n=3000, used_codes=12)
    engine = Engine(Model.from_preset("tiny", seed=11, device="cuda"),
                    Catalog.from_arrays(ids, codes), EngineConfig(cuda_graphs=False))
    tokens, lens, segs = (t.cuda() for t in prompts(14, [30, 12]))
    want = engine.recommend(tokens, lens, segs, beam_width=16, top_k=20)
    expand = beam_search.expand_items_of
    calls = []

    def hungry(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            free, total = torch.cuda.mem_get_info()
            torch.empty(total + free, dtype=torch.uint8, device="cuda")   # cannot fit
        return expand(*args, **kwargs)

    monkeypatch.setattr(beam_search, "expand_items_of", hungry)
    before = torch.cuda.memory_allocated()
    with pytest.raises(CapacityError, match="ran out of device memory"):
        engine.recommend(tokens, lens, segs, beam_width=16, top_k=20)
    assert torch.cuda.memory_allocated() <= before + (1 << 20)
    got = engine.recommend(tokens, lens, segs, beam_width=16, top_k=20)
    assert len(calls) == 2 and torch.equal(got[0], want[0])
