"""A cached package served with a prompt-KV pool of more than 2**31 elements (4 GiB in 16
bits: every pool a server would set) reads and writes pages at its far end correctly.

The export traces the pool's page count with a small example; a dimension without an upper
bound let AOTInductor give the kernels that touch the pool 32-bit indexing, and a served pool
past 2**31 elements then wrote out of bounds (an illegal memory access in the server's
warm-up). The test runs a miss (the long-term part written into the pool's last pages) and
then a hit (read back from them), each equal to the engine without a cache.

``gpu`` test: the pool takes about 9 GB of device memory. ``large_pool_calls`` also runs on
the CPU at a small pool (``test_the_calls_agree_with_the_engine_at_a_small_pool``), so the
inputs it builds are checked wherever the suite runs; that case reads the suite's shared CPU
package (``tests/export/tiny_cached.py``)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from tests.export.pool_audit import pool_sized_allocations, wrapper_source
from tests.export.tiny_cached import BEAMS, TOP_K, TinyCached, export_tiny_cached
from tests.torch_engine.engine_worlds import v2_prompts
from torch_engine.aoti_loading import loader_environment
from xgr_common.tolerances import tolerance_for
from xgr_export.cached_package import PAGE_TOKENS

# The package runs in a child that starts with the compiler's libstdc++ preloaded, as every
# AOTInductor load does (``torch_engine.aoti_loading.loader_environment``).
_CHILD = textwrap.dedent("""
    import sys
    import torch
    package, inputs_path, outputs_path = sys.argv[1:]
    with torch._inductor.config.patch({"cpp.vec_isa_ok": False}):
        run = torch._inductor.aoti_load_package(package)
    a = torch.load(inputs_path)
    device = a["device"]
    pool = torch.zeros(a["pool_shape"], dtype=a["dtype"], device=device)
    features = [t.to(device) for t in a["features"]]
    table = a["table"].to(device)
    with torch.no_grad():
        miss = run(*features, torch.zeros(1, dtype=torch.int64, device=device), table,
                   a["miss_slots"].to(device), pool)
        # The miss wrote the long-term part where the table points.
        written = bool(pool[:, :, table[0].long()].abs().sum() > 0)
        hit = run(*features, torch.full((1,), a["frozen"], dtype=torch.int64, device=device),
                  table, a["hit_slots"].to(device), pool)
    torch.save({"miss": [t.cpu() for t in miss], "hit": [t.cpu() for t in hit],
                "written": written}, outputs_path)
""")


def large_pool_calls(tmp_path, cached: TinyCached, pool_pages: int):
    """Runs one user of ``cached`` (a tiny version 2 model's package with the cache) as a
    miss and as a hit with the user's pages at the end of a pool of ``pool_pages`` pages.
    Returns the engine's answer and the two package answers."""
    engine, spec, ids, codes = cached.engine, cached.spec, cached.ids, cached.codes
    model, device = engine.model, str(engine.device)
    spans = spec.prompt_v2.spans
    tokens, lengths, segments, frozen_lengths = v2_prompts(
        [([1, 2, 3, 4], [5, 6, 7], 0)], spec.layout, soft_tokens=spec.profile_tokens,
        intro=spans.intro, before_profile=spans.before_profile,
        before_recent=spans.before_recent, question=spans.question,
        code_of=lambda item, level: int(codes[item, level]))
    width, frozen = tokens.shape[1], int(frozen_lengths[0])
    soft = torch.randn(1, spec.profile_tokens, model.config.hidden_size,
                       generator=torch.Generator().manual_seed(3))
    exclude = torch.tensor([[int(ids[0]), -1]])
    cfg = model.config
    # The user's pages are the pool's last: the largest offsets a served pool can reach.
    pages = -(-width // PAGE_TOKENS) + 1
    table = torch.arange(pool_pages + 1 - pages, pool_pages + 1, dtype=torch.int32)[None]
    position = torch.arange(width)
    slots = table[0, position // PAGE_TOKENS].long() * PAGE_TOKENS + position % PAGE_TOKENS
    features = [tokens, lengths, segments, soft, exclude]
    torch.save({"device": device, "dtype": engine.dtype, "features": features, "table": table,
                "frozen": frozen, "pool_shape": (cfg.num_layers, 2, pool_pages + 1, PAGE_TOKENS,
                                                 cfg.num_kv_heads, cfg.head_dim),
                "miss_slots": torch.where(position < frozen, slots, 0)[None],  # rest: the sink
                "hit_slots": torch.zeros((1, width - frozen), dtype=torch.int64)},
               tmp_path / "inputs.pt")
    done = subprocess.run([sys.executable, "-c", _CHILD, str(cached.package),
                           str(tmp_path / "inputs.pt"),
                           str(tmp_path / "outputs.pt")], capture_output=True, text=True,
                          timeout=600, env=loader_environment())
    assert done.returncode == 0, done.stderr[-3000:]
    got = torch.load(tmp_path / "outputs.pt")
    assert got["written"]
    with torch.no_grad():
        want = engine.recommend(*[t.to(device) for t in features[:3]], BEAMS, TOP_K,
                                prefix_embeds=soft.to(device), exclude_items=exclude.to(device))
    return want, got["miss"], got["hit"]


def _assert_equal(want, got, dtype):
    tol = tolerance_for(dtype)
    assert torch.equal(got[0].cpu(), want[0].cpu())
    torch.testing.assert_close(got[1].cpu().float(), want[1].cpu().float(), atol=tol.atol,
                               rtol=tol.rtol)


@pytest.mark.heavy
def test_the_calls_agree_with_the_engine_at_a_small_pool(tiny_cached_package, tmp_path):
    want, miss, hit = large_pool_calls(tmp_path, tiny_cached_package, pool_pages=64)
    _assert_equal(want, miss, torch.float32)
    _assert_equal(want, hit, torch.float32)
    # The miss's write goes into the pool itself: no buffer of the pool's size.
    assert pool_sized_allocations(wrapper_source(tiny_cached_package.package)) == []


def test_the_audit_finds_a_buffer_sized_by_the_pool():
    source = """
        inputs_info_[0].name = "arg1_1";
        inputs_info_[1].name = "arg7_1";
        int64_t s3 = arg7_1_size[2];
        int64_t s9 = s3;
        const int64_t int_array_4[] = {8L, s2};
        const int64_t int_array_5[] = {2048L*s9, 64L, 16L};
        AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_empty_strided(2, int_array_4, int_array_1, d));
        AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_empty_strided(3, int_array_5, int_array_2, d));
    """
    found = pool_sized_allocations(source)
    assert len(found) == 1 and "int_array_5" in found[0]


@pytest.mark.gpu
def test_a_pool_past_two_to_the_31_elements_is_read_and_written_at_its_end(tmp_path):
    # 2**19 pages of the tiny model: 4.3e9 elements, the last layer's values past 2**31.
    pages = 1 << 19
    free, _ = torch.cuda.mem_get_info()
    if free < pages * PAGE_TOKENS * 2 * 2 * 2 * 16 * 4 * 1.2:
        pytest.skip("the GPU lacks the free memory of the large pool")
    cached = export_tiny_cached(tmp_path, "cuda:0")
    want, miss, hit = large_pool_calls(tmp_path, cached, pool_pages=pages)
    _assert_equal(want, miss, torch.float32)
    _assert_equal(want, hit, torch.float32)
    # A buffer of the pool's size would double the pool's memory and copy it on every miss.
    assert pool_sized_allocations(wrapper_source(cached.package)) == []
