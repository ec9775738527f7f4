"""The prompt contract v2 in the engine: the soft-prompt vectors placed at the SOFT markers
mid-row, and the frozen long-term prefix whose KV computed alone equals its rows in the full
prefill (fp32, the CPU), under both prefill masks."""

import numpy as np
import pytest
import torch

from custom_ops.torch_twins import assemble_prompt_v2
from tests.torch_engine.engine_worlds import prompts, small_world
from torch_engine import search
from torch_engine.catalog import Catalog
from torch_engine.model import Model
from xgr_common.layout import MaskMode, TokenLayout
from xgr_common.tolerances import tolerance_for

LAYOUT = TokenLayout()
FP32 = tolerance_for(torch.float32)
SOFT = 2


@pytest.fixture(scope="module")
def model():
    return Model.from_preset("tiny", seed=5)


def _codes(items):
    """Code tokens of item numbers: level l's code is (item * 7 + l) mod the codebook."""
    items = np.asarray(items, np.int64)
    return torch.from_numpy(np.stack([LAYOUT.code_token(level, 0) + (items * 7 + level) %
                                      LAYOUT.codebook_size for level in range(3)], 1))


def _prompt(long_items, recent_items, context):
    return assemble_prompt_v2(
        _codes(long_items), torch.tensor([0, len(long_items)]),
        torch.tensor([[LAYOUT.profile_base + 1 + context]]), _codes(recent_items),
        torch.tensor([0, len(recent_items)]), bos_id=LAYOUT.bos_id,
        profile_start_id=LAYOUT.profile_start_id, item_start_id=LAYOUT.item_start_id,
        soft_id=LAYOUT.soft_id, pad_id=LAYOUT.pad_id, soft_tokens=SOFT, intro=[20, 21],
        before_profile=[22], question=[23])


def _prefill(model, tokens, lengths, segments, soft, mask):
    catalog = Catalog.from_arrays(*small_world())
    batch, _ = search.sanitise(tokens, lengths, None if mask is MaskMode.CAUSAL else segments,
                               soft, None, model.config.vocab_size, soft_marker=LAYOUT.soft_id)
    return search.prefill(model, catalog, batch, search.SearchOptions())


def test_soft_vectors_replace_the_markers_in_order(model):
    prompt = _prompt([3, 4], [5], context=1)
    soft = torch.randn(1, SOFT, model.config.hidden_size)
    embeds = model.embed(prompt.token_ids.to(torch.int64))
    marked = prompt.token_ids == LAYOUT.soft_id
    placed = search.place_soft_vectors(embeds, marked, soft)
    columns = torch.nonzero(marked[0]).flatten()
    assert columns.numel() == SOFT
    torch.testing.assert_close(placed[0, columns], soft[0])
    unmarked = ~marked[0]
    torch.testing.assert_close(placed[0, unmarked], embeds[0, unmarked])


@pytest.mark.parametrize("mask", [MaskMode.CAUSAL, MaskMode.ITEM_CAUSAL])
def test_the_frozen_prefix_kv_depends_on_itself_alone(model, mask):
    """Two requests of one user (other recent items, another context, other soft vectors)
    and the frozen prefix on its own: the prefix's KV rows agree in every layer."""
    gen = torch.Generator().manual_seed(0)
    hidden = model.config.hidden_size
    runs = []
    for recent, context in (([5, 6], 1), ([9], 3)):
        prompt = _prompt([3, 4, 8], recent, context)
        soft = torch.randn(1, SOFT, hidden, generator=gen)
        state = _prefill(model, prompt.token_ids, prompt.lengths, prompt.segment_ids, soft, mask)
        runs.append((state, int(prompt.frozen_lengths[0]), prompt))
    frozen = runs[0][1]
    prompt = runs[0][2]
    alone = _prefill(model, prompt.token_ids[:, :frozen], torch.tensor([frozen]),
                     prompt.segment_ids[:, :frozen], None, mask)
    for layer in range(model.config.num_layers):
        reference = alone.shared.keys[layer][:frozen].double()
        for state, length, _ in runs:
            assert length == frozen
            for got, want in ((state.shared.keys[layer], alone.shared.keys[layer]),
                              (state.shared.values[layer], alone.shared.values[layer])):
                torch.testing.assert_close(got[:frozen].double(), want[:frozen].double(),
                                           atol=FP32.atol, rtol=FP32.rtol)
        assert reference.abs().sum() > 0
    # The rest of the rows did see the differences.
    assert not torch.allclose(runs[0][0].last_hidden, runs[1][0].last_hidden)


@pytest.mark.parametrize("segmented", [True, False])
def test_the_engine_places_soft_vectors_at_the_markers(model, segmented):
    """Rows whose S markers come first (segment 0) are the version 1 rows with the soft
    vectors before them: ``Engine.recommend`` with the marker returns the version 1 engine's
    items and scores (the same positions, segments and attention)."""
    from torch_engine.config import EngineConfig, engine_config_for
    from torch_engine.engine import Engine
    from xgr_common.prompt_spec import PromptSpec
    from xgr_common.prompt_v2 import PromptV2Layout

    ids, codes = small_world()
    tokens, lengths, segments = prompts(7, [9, 14, 6], segmented=segmented)
    soft = torch.randn(3, SOFT, model.config.hidden_size, generator=torch.Generator()
                       .manual_seed(3))
    marked = torch.cat([torch.full((3, SOFT), LAYOUT.soft_id), tokens], dim=1)
    marked_segments = None if segments is None else torch.cat(
        [torch.zeros(3, SOFT, dtype=torch.int32), segments], dim=1)
    v1 = Engine(model, Catalog.from_arrays(ids, codes), EngineConfig())
    spec = PromptSpec(model_hidden=model.config.hidden_size, prompt_v2=PromptV2Layout())
    v2 = Engine(model, Catalog.from_arrays(ids, codes), engine_config_for(spec))
    assert v2.config.soft_marker == LAYOUT.soft_id
    want = v1.recommend(tokens, lengths, segments, 8, 6, prefix_embeds=soft)
    got = v2.recommend(marked, lengths + SOFT, marked_segments, 8, 6, prefix_embeds=soft)
    assert torch.equal(got[0], want[0])
    torch.testing.assert_close(got[1], want[1], atol=FP32.atol, rtol=FP32.rtol)


def test_a_marker_outside_the_layout_is_refused(model):
    from torch_engine.config import EngineConfig, engine_config_for
    from torch_engine.engine import Engine
    from xgr_common.errors import ConfigError
    from xgr_common.prompt_spec import PromptSpec

    with pytest.raises(ConfigError, match="soft_marker must be None .* or the layout's SOFT "
                                          f"token id {LAYOUT.soft_id}"):
        Engine(model, Catalog.from_arrays(*small_world()), EngineConfig(soft_marker=3))
    with pytest.raises(ConfigError, match="soft_marker must be None or a token id"):
        EngineConfig(soft_marker=-1)
    assert engine_config_for(PromptSpec(), max_graphs=2) == EngineConfig(max_graphs=2)
    with pytest.raises(ConfigError, match="takes the soft marker from the prompt spec"):
        engine_config_for(PromptSpec(), soft_marker=6)


# The builder's default spans, and text before the recent items (after the context token, in
# the profile's segment) with none before the profile.
@pytest.mark.parametrize("spans", [
    {"intro": (20, 21), "before_profile": (22,), "question": (23,)},
    {"intro": (20,), "before_profile": (), "before_recent": (21,), "question": (22, 23)}])
def test_the_tf_free_prompt_builder_lays_prompts_out_as_the_op_does(spans):
    """``engine_worlds.v2_prompts`` (the prompt-cache tests' prompts, which must run where
    TensorFlow is absent) equals the assembly op's twin, padding included."""
    from tests.torch_engine.engine_worlds import v2_prompts

    users = [([3, 4, 8], [5, 6], 1), ([12], [2], 3), ([21, 22, 23, 24], [9, 10, 11], 0)]
    longs, recents, contexts = zip(*users)
    flat = lambda rows: [i for r in rows for i in r]                    # noqa: E731
    splits = lambda rows: torch.tensor(np.cumsum([0] + [len(r) for r in rows]))  # noqa: E731
    twin = assemble_prompt_v2(
        _codes(flat(longs)), splits(longs),
        torch.tensor([[LAYOUT.profile_base + 1 + c] for c in contexts]),
        _codes(flat(recents)), splits(recents), bos_id=LAYOUT.bos_id,
        profile_start_id=LAYOUT.profile_start_id, item_start_id=LAYOUT.item_start_id,
        soft_id=LAYOUT.soft_id, pad_id=LAYOUT.pad_id, soft_tokens=SOFT,
        **{name: list(span) for name, span in spans.items()})
    built = v2_prompts(users, LAYOUT, soft_tokens=SOFT, **spans)
    for name, got in zip(("token_ids", "lengths", "segment_ids", "frozen_lengths"), built):
        assert torch.equal(got, getattr(twin, name).to(got.dtype)), name
