"""An engine package of a version 2 model: the profile vectors at the rows' SOFT markers, as
``Engine.recommend`` places them; the export's example row is the longest row the feature
graph emits; a card and an engine that disagree on the version are refused."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from tests.export.prompt_v2_rows import v2_rows
from tests.export.v2_spec import small_v2_spec
from tests.torch_engine.engine_worlds import small_world
from torch_engine.catalog import Catalog
from torch_engine.config import EngineConfig, engine_config_for
from torch_engine.engine import Engine
from torch_engine.model import Model
from xgr_common.errors import ConfigError
from xgr_common.prompt_spec import PromptSpec
from xgr_common.tolerances import tolerance_for
from xgr_export.config import EngineExportConfig
from xgr_export.engine_package import example_row, export_engine

FP32 = tolerance_for(torch.float32)
BEAMS, TOP_K = 8, 6


def test_the_example_row_is_the_longest_row_the_graph_emits():
    spec = small_v2_spec(64)
    ids, codes = small_world()
    zero = [[0, 0, 0]] * 60
    full = v2_rows(spec, zero, [4], [3])
    tokens, segments = example_row(spec)
    assert int(full.lengths[0]) == len(tokens) == spec.max_prompt_tokens
    assert full.token_ids[0].tolist() == tokens and full.segment_ids[0].tolist() == segments


@pytest.mark.heavy
def test_a_version_2_package_places_the_vectors_at_the_markers(tmp_path):
    from torch_engine.aoti_loading import load_package

    ids, codes = small_world()
    model = Model.from_preset("tiny", seed=1)
    spec = small_v2_spec(model.config.hidden_size)
    engine = Engine(model, Catalog.from_arrays(ids, codes),
                    engine_config_for(spec, selection_backend="torch"))
    export_engine(engine, spec, tmp_path / "v2.pt2",
                  EngineExportConfig(BEAMS, TOP_K, max_batch=4))
    runner = load_package(tmp_path / "v2.pt2")
    prompt = v2_rows(spec, codes, [4, 1, 0], [3, 2, 1])
    gen = torch.Generator().manual_seed(4)
    soft = torch.randn(3, spec.profile_tokens, model.config.hidden_size, generator=gen)
    exclude = torch.tensor([[int(ids[0]), -1], [-1, -1], [int(ids[5]), int(ids[7])]])
    with torch.no_grad():
        want = engine.recommend(prompt.token_ids, prompt.lengths, prompt.segment_ids, BEAMS,
                                TOP_K, prefix_embeds=soft, exclude_items=exclude)
        got = runner(prompt.token_ids, prompt.lengths, prompt.segment_ids, soft, exclude)
    assert torch.equal(got[0], want[0])
    torch.testing.assert_close(got[1], want[1], atol=FP32.atol, rtol=FP32.rtol)
    # The vectors reach the result: other vectors, other scores.
    with torch.no_grad():
        other = runner(prompt.token_ids, prompt.lengths, prompt.segment_ids, soft * 3, exclude)
    assert not torch.equal(other[1], got[1])


def test_a_card_and_an_engine_of_different_versions_are_refused(tmp_path):
    ids, codes = small_world()
    model = Model.from_preset("tiny", seed=1)
    spec = small_v2_spec(model.config.hidden_size)
    engine = Engine(model, Catalog.from_arrays(ids, codes), EngineConfig())
    with pytest.raises(ConfigError, match="card says prompt version 2, whose soft vectors go "
                                          "at the SOFT markers; the engine has "
                                          "EngineConfig.soft_marker=None"):
        export_engine(engine, spec, tmp_path / "e.pt2", EngineExportConfig(BEAMS, TOP_K))
    assert not list(tmp_path.iterdir())


def test_the_exclusion_bound_is_the_cards_history_not_keep_last(tmp_path):
    from xgr_common.prompt_v2 import HistorySplit, PromptV2Layout
    from xgr_export.engine_package import check_engine_for_export, dynamic_inputs

    long_history = PromptSpec(model_hidden=64, keep_last=50,
                              prompt_v2=PromptV2Layout(HistorySplit(86400, 30, 1000, 246)))
    config = EngineExportConfig(BEAMS, TOP_K, max_request_exclusions=16)
    assert dynamic_inputs(long_history, config, 8192)[4][1].max == 1246 + 1 + 16
    assert dynamic_inputs(PromptSpec(keep_last=50), config, 8192)[4][1].max == 50 + 1 + 16
    # An engine that cannot take that many exclusions is refused before the trace.
    ids, codes = small_world()
    model = Model.from_preset("tiny", seed=1)
    spec = PromptSpec(model_hidden=model.config.hidden_size, keep_last=50,
                      prompt_v2=PromptV2Layout(HistorySplit(86400, 30, 700, 46)))
    engine = Engine(model, Catalog.from_arrays(ids, codes),
                    replace(engine_config_for(spec, selection_backend="torch"), max_exclude=500))
    with pytest.raises(ConfigError, match="may exclude 763 items .*746 history items.*"
                                          "max_request_exclusions=16.*max_exclude=500"):
        check_engine_for_export(engine, spec, config)


def test_the_exported_engine_takes_the_cards_whole_history(tmp_path):
    from types import SimpleNamespace

    from xgr_common.prompt_v2 import HistorySplit, PromptV2Layout
    from xgr_export.config import ExportConfig
    from xgr_export.engine_package import check_engine_for_export
    from xgr_export.export import build_engine

    ids, codes = small_world()
    hidden = Model.from_preset("tiny", seed=0).config.hidden_size
    for long_items, widest in ((1000, 4096), (5000, 5000 + 9 + 1 + 256)):
        spec = PromptSpec(model_hidden=hidden, prompt_v2=PromptV2Layout(
            HistorySplit(86400, 30, long_items, 9)))
        config = ExportConfig(out=tmp_path / "out", engine=EngineExportConfig(BEAMS, TOP_K))
        engine = build_engine(config, SimpleNamespace(item_ids=ids, item_codes=codes, spec=spec),
                              "torch", "torch")
        assert engine.config.max_exclude == widest       # never narrower than the default
        if long_items == 1000:
            check_engine_for_export(engine, spec, config.engine)
        else:   # wide enough; the tiny model's context is what refuses this card
            with pytest.raises(ConfigError, match="positions; the model has max_position"):
                check_engine_for_export(engine, spec, config.engine)


def test_the_server_accepts_twice_the_cards_history(tmp_path):
    from xgr_common.prompt_v2 import HistorySplit, PromptV2Layout
    from xgr_export.config import ExportConfig
    from xgr_export.export import pipeline_config_for

    config = ExportConfig(out=tmp_path / "out")
    for long_items, events in ((1000, 4096), (3000, 2 * (3000 + 9) + 2)):
        spec = PromptSpec(prompt_v2=PromptV2Layout(HistorySplit(86400, 30, long_items, 9)))
        assert pipeline_config_for(config, spec, False).max_history_events == events


def _contract(exclude_max: int, batch_max: int = 4):
    from xgr_export.torch_package import Package, TensorSpec

    inputs = (TensorSpec("int32", ("s0", "s1")), TensorSpec("int32", ("s0",)),
              TensorSpec("int32", ("s0", "s1")), TensorSpec("float32", ("s0", 2, 64)),
              TensorSpec("int64", ("s0", "s2")))
    return Package(Path("e.pt2"), "aoti", "cpu", inputs, (),
                   (("s0", 1, batch_max), ("s1", 2, 2 ** 63 - 1), ("s2", 1, exclude_max)))


def test_a_package_narrower_than_the_graph_is_refused_at_export():
    from xgr_common.errors import ExportError
    from xgr_common.prompt_v2 import HistorySplit, PromptV2Layout
    from xgr_export.engine_package import require_served_sizes

    spec = PromptSpec(prompt_v2=PromptV2Layout(HistorySplit(86400, 30, 1000, 246)))
    config = EngineExportConfig(BEAMS, TOP_K, max_batch=4, max_request_exclusions=16)
    require_served_sizes(_contract(1263), spec, config)
    with pytest.raises(ExportError, match="exclusion row of 1..307 \\(input 4 dim 1\\), the "
                                          "feature graph can send 1263"):
        require_served_sizes(_contract(307), spec, config)
    with pytest.raises(ExportError, match="batch of 1..2 .* can send 4"):
        require_served_sizes(_contract(1263, batch_max=2), spec, config)


def test_a_card_whose_longest_prompt_the_model_cannot_hold_is_refused():
    from xgr_common.prompt_v2 import HistorySplit, PromptV2Layout
    from xgr_export.engine_package import check_engine_for_export

    ids, codes = small_world()
    model = Model.from_preset("tiny", seed=1)
    fits = (model.config.max_position - 60) // 4      # items of 4 tokens, room to spare
    config = EngineExportConfig(BEAMS, TOP_K)
    for items, refused in ((fits, False), (fits + 20, True)):
        spec = PromptSpec(model_hidden=model.config.hidden_size, prompt_v2=PromptV2Layout(
            HistorySplit(86400, 30, items, 5)))
        engine = Engine(model, Catalog.from_arrays(ids, codes),
                        engine_config_for(spec, selection_backend="torch"))
        if refused:
            with pytest.raises(ConfigError, match="needs \\d+ positions; the model has "
                                                  f"max_position {model.config.max_position}"):
                check_engine_for_export(engine, spec, config)
        else:
            check_engine_for_export(engine, spec, config)


def test_the_graph_budget_set_at_export_reaches_the_package(tmp_path):
    """``xgr export --cuda_graphs``: the engine built for the export keeps that many graphs,
    and a CUDA package's replay line says so."""
    from types import SimpleNamespace

    from xgr_export.config import ExportConfig
    from xgr_export.engine_package import engine_replay
    from xgr_export.export import build_engine

    ids, codes = small_world()
    spec = small_v2_spec(Model.from_preset("tiny", seed=0).config.hidden_size)
    config = ExportConfig(out=tmp_path / "out", engine=EngineExportConfig(BEAMS, TOP_K,
                                                                         cuda_graphs=20))
    engine = build_engine(config, SimpleNamespace(item_ids=ids, item_codes=codes, spec=spec),
                          "torch", "torch")
    assert engine.config.max_graphs == 20
    # The replay line a CUDA export writes (the engine's device is all it reads besides).
    on_cuda = SimpleNamespace(device=torch.device("cuda", 0),
                              config=replace(engine.config, cuda_graphs=True))
    assert engine_replay(on_cuda, spec).graphs == 20
    assert engine_replay(engine, spec).graphs == 0       # a CPU package replays no graphs
    with pytest.raises(ConfigError, match="EngineExportConfig.cuda_graphs"):
        EngineExportConfig(cuda_graphs=0)
