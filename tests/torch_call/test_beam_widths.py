"""Per-request beam widths (``xgr export --beam_widths``): one engine package serves every
named width, the width the length of its sixth input (``beam_slots``, traced dynamic).
Through TorchCall each named width returns ``Engine.recommend``'s items at that width and
widths outside the named span are refused before anything runs; through the SavedModel's
``serving_with_controls`` each request's ``beam_width`` gives the in-process pipeline's items
at that width, and a call whose requests disagree, or a width not named, is refused naming
``beam_width``; widths the traced search cannot serve are refused at export."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
import torch

from bridge.pipeline import RecommendPipeline
from custom_ops.torch_call import torch_call
from tests.tiny_export import ITEMS, SEED, TOP_N, run_python, served
from tests.torch_engine.engine_worlds import prompts, small_world
from tf_frontend.feature_graph import FeatureGraph, features_from_world
from tf_frontend.pipeline_spec import PipelineConfig
from torch_engine.catalog import Catalog
from torch_engine.config import PRESETS, EngineConfig
from torch_engine.engine import Engine
from torch_engine.model import Model
from xgr_common.errors import ConfigError, ExportError, InvalidInputError
from xgr_common.prompt_spec import PromptSpec
from xgr_common.serving_names import CONTROLS_SIGNATURE, SERVING_SPEC_FILE
from xgr_common.tolerances import tolerance_for
from xgr_export.config import EngineExportConfig, ExportConfig
from xgr_export.engine_package import export_engine
from xgr_world.synthetic import WorldConfig, make_world

# Heavy (an AOTInductor compile of the search, fresh processes): out of `make test-quick`.
pytestmark = pytest.mark.heavy

WIDTHS, DEFAULT, TOP_K, MAX_EXCLUSIONS = (16, 24, 32), 16, 10, 256
FP32 = tolerance_for(torch.float32)


@pytest.fixture(scope="module")
def widths_export(tmp_path_factory):
    """(SavedModel folder, its engine package's contract) of one `xgr export --beam_widths`."""
    folder = tmp_path_factory.mktemp("widths")
    out, report = folder / "pipeline", folder / "report.json"
    run_python(["-m", "xgr_cli.main", "export", f"--out={out}", f"--seed={SEED}",
                f"--num_items={ITEMS}", f"--beam_width={DEFAULT}",
                f"--beam_widths={','.join(map(str, WIDTHS))}", f"--top_k={TOP_K}",
                f"--top_n={TOP_N}", "--max_batch=16", "--cache_dir=", "--verify_requests=2",
                f"--report_json={report}"], timeout=900)
    return out, json.loads(report.read_text())


def _world_engine():
    world = make_world(WorldConfig(num_items=ITEMS, seed=SEED))
    model = Model.from_preset("tiny", seed=SEED)
    return world, Engine(model, Catalog.from_arrays(world.item_ids, world.item_codes))


def _engine() -> tuple[Engine, np.ndarray, PromptSpec]:
    model = Model(PRESETS["tiny"])
    model.init_weights(3)
    ids, codes = small_world(seed=1, n=300, used_codes=8)
    engine = Engine(model.eval(), Catalog.from_arrays(ids, codes),
                    EngineConfig(cuda_graphs=False))
    return engine, ids, PromptSpec(model_hidden=model.config.hidden_size, keep_last=3)


def _request(engine, ids, spec):
    tokens, lengths, segments = prompts(9, [7, 12, 10], width=12)
    tokens = (tokens % (engine.model.config.vocab_size - 8)).to(torch.int32)
    soft = torch.randn(3, spec.profile_tokens, engine.model.config.hidden_size,
                       generator=torch.Generator().manual_seed(1))
    exclude = torch.tensor([[int(ids[1]), -1], [-1, -1], [int(ids[2]), int(ids[5])]])
    return tokens, lengths.to(torch.int32), segments, soft, exclude


def _call(saved_model: Path, inputs, width: int):
    args = [tf.constant(t.numpy()) for t in inputs] + [tf.zeros([width], tf.int8)]
    items, scores = torch_call(str(saved_model / "assets" / "engine.pt2"), args,
                               [tf.int64, tf.float32])
    return items.numpy(), scores.numpy()


def test_the_package_takes_the_width_bounded_by_the_named_widths(widths_export):
    out, report = widths_export
    contract = report["engine_signature"].splitlines()
    inputs = [line.split() for line in contract if line.startswith("in ")]
    assert len(inputs) == 6 and inputs[-1][1] == "int8"
    assert f"dim {inputs[-1][2]} {WIDTHS[0]} {WIDTHS[-1]}" in contract
    assert report["verify"]["ok"]   # serving_default, at the default width
    spec = json.loads((out / SERVING_SPEC_FILE).read_text())
    assert spec["per_call"] == ["beam_width"] and spec["defaults"]["beam_width"] == DEFAULT


def test_each_named_width_answers_like_recommend_at_that_width(widths_export):
    world, engine = _world_engine()
    spec = PromptSpec(model_hidden=engine.model.config.hidden_size)
    inputs = _request(engine, world.item_ids, spec)
    saved_model = widths_export[0]
    answers = {}
    for width in WIDTHS:
        items, scores = _call(saved_model, inputs, width)
        want_items, want_scores = engine.recommend(
            *inputs[:3], beam_width=width, top_k=TOP_K, prefix_embeds=inputs[3],
            exclude_items=inputs[4])[:2]
        np.testing.assert_array_equal(items, want_items.numpy(), err_msg=f"width {width}")
        np.testing.assert_allclose(scores, want_scores.numpy(), rtol=FP32.rtol, atol=FP32.atol)
        answers[width] = items
    # The widths search differently: a package that ignored its input would answer alike.
    assert not all(np.array_equal(answers[WIDTHS[0]], a) for a in answers.values())
    # The next call at the default width is unaffected by the ones before it.
    np.testing.assert_array_equal(_call(saved_model, inputs, DEFAULT)[0], answers[DEFAULT])


@pytest.mark.parametrize("width", [WIDTHS[0] - 1, WIDTHS[-1] + 1])
def test_widths_outside_the_named_span_are_refused_before_anything_runs(widths_export, width):
    world, engine = _world_engine()
    inputs = _request(engine, world.item_ids,
                      PromptSpec(model_hidden=engine.model.config.hidden_size))
    with pytest.raises((tf.errors.InvalidArgumentError, InvalidInputError), match=r"input 5"):
        _call(widths_export[0], inputs, width)
    # The refusal cost the next call nothing.
    _call(widths_export[0], inputs, DEFAULT)


def _served(saved_model: Path, features: dict, tmp_path: Path, name: str) -> dict:
    return served(saved_model, features, tmp_path, name, CONTROLS_SIGNATURE)


def _python_pipeline(world, engine) -> RecommendPipeline:
    """The in-process pipeline the SavedModel must equal, with the export's named widths."""
    graph = FeatureGraph(PromptSpec(model_hidden=engine.model.config.hidden_size),
                         world.item_ids, world.item_codes, seed=SEED)
    return RecommendPipeline.for_engine(
        graph, engine, DEFAULT, TOP_K,
        PipelineConfig(top_n=TOP_N, max_request_exclusions=MAX_EXCLUSIONS, beam_widths=WIDTHS,
                       beam_width=DEFAULT))


def _controls(rows: int, widths: list[int]) -> dict:
    return {"exclude_items": np.zeros(0, np.int64), "exclude_splits": np.zeros(rows + 1, np.int64),
            "top_k": np.full(rows, TOP_K, np.int32), "beam_width": np.array(widths, np.int32)}


def test_each_requests_width_through_the_saved_model(widths_export, tmp_path):
    world, engine = _world_engine()
    features = features_from_world(world, slice(0, 3))
    python = _python_pipeline(world, engine)
    lists = {}
    for width in WIDTHS:
        controls = _controls(3, [width] * 3)
        got = _served(widths_export[0], {**features, **controls}, tmp_path, f"w{width}")
        assert "error" not in got, got.get("error")
        want = python({**features, **controls})
        np.testing.assert_array_equal(got["item_ids"], want["item_ids"].numpy())
        lists[width] = got["item_ids"]
    assert not all(np.array_equal(lists[WIDTHS[0]], v) for v in lists.values())


@pytest.mark.parametrize("widths, rule", [
    ([16, 24, 16], "beam_width must be the same for every request of one call"),
    ([20, 20, 20], "beam_width must be one of [16, 24, 32]"),
])
def test_bad_widths_are_refused_naming_the_rule(widths_export, tmp_path, widths, rule):
    world, _ = _world_engine()
    features = features_from_world(world, slice(0, 3))
    got = _served(widths_export[0], {**features, **_controls(3, widths)}, tmp_path, "bad")
    assert "error" in got and rule in str(got["error"])


def test_named_widths_are_checked_before_the_compile(tmp_path):
    engine, _, spec = _engine()
    with pytest.raises(ConfigError, match="default width and must be one of beam_widths"):
        EngineExportConfig(beam_width=12, beam_widths=WIDTHS)
    # Widths are chosen through serving_with_controls: an export without it is refused.
    with pytest.raises(ConfigError, match="max_request_exclusions 0 leaves out"):
        ExportConfig(out="x", engine=EngineExportConfig(beam_width=16, beam_widths=WIDTHS,
                                                        max_request_exclusions=0))
    reachable = engine.catalog.reachable_items(1)
    with pytest.raises(ConfigError, match="beam_width 1 can reach"):
        export_engine(engine, spec, tmp_path / "e.pt2",
                      EngineExportConfig(beam_width=16, top_k=reachable + 1, max_batch=8,
                                         beam_widths=(1, 16)))
    # A width that reaches top_k items but that the traced search's shape rules exclude
    # (its guards bound the width from below here).
    assert engine.catalog.reachable_items(3) >= TOP_K
    with pytest.raises(ExportError, match=r"beam widths \[3\] are outside \[\d+, \d+\]"):
        export_engine(engine, spec, tmp_path / "f.pt2",
                      EngineExportConfig(beam_width=16, top_k=TOP_K, max_batch=8,
                                         beam_widths=(3, 16)))


def test_concurrent_requests_of_several_widths_through_the_server(widths_export, tmp_path):
    """REST clients at once, each with its own width, top_k and exclusions: the batcher merges
    only equal widths, and each answer is the in-process pipeline's for that request alone."""
    import concurrent.futures
    import shutil
    import threading

    from tests.serving.helpers import http, start_server
    from tf_frontend.serving.config import BatchingConfig

    base = tmp_path / "models"
    shutil.copytree(widths_export[0], base / "1")
    world, engine = _world_engine()
    features = features_from_world(world, slice(0, 6))
    splits = features["history_splits"].numpy()
    widths, top_ks = [16, 24, 16, 32, 24, 16], [10, 4, 7, 10, 10, 2]
    excluded = [[], [int(world.item_ids[0])], [], list(map(int, world.item_ids[:5])), [], []]
    rows = [{"user_id": int(features["user_id"][r]),
             "country": features["country"][r].numpy().decode(),
             "request_time": int(features["request_time"][r]),
             "history_items": features["history_items"][splits[r]:splits[r + 1]].numpy().tolist(),
             "history_times": features["history_times"][splits[r]:splits[r + 1]].numpy().tolist(),
             "exclude_items": excluded[r], "top_k": top_ks[r], "beam_width": widths[r]}
            for r in range(6)]
    server = start_server(str(base), file_system_poll_wait_seconds=0,
                          batching=BatchingConfig(max_batch_size=16, batch_timeout_micros=50_000,
                                                  max_enqueued_batches=50, num_batch_threads=1))
    try:
        start = threading.Barrier(len(rows))

        def client(row: dict):
            start.wait()
            return http(server.rest_port, "/v1/models/recs:predict",
                        {"signature_name": CONTROLS_SIGNATURE, "instances": [row]})

        with concurrent.futures.ThreadPoolExecutor(len(rows)) as pool:
            answers = list(pool.map(client, rows))
        mixed = http(server.rest_port, "/v1/models/recs:predict",
                     {"signature_name": CONTROLS_SIGNATURE, "instances": rows[:2]})
    finally:
        server.stop()
    python = _python_pipeline(world, engine)
    for r, (status, body) in enumerate(answers):
        assert status == 200, body
        one = {k: v[r:r + 1] for k, v in features.items() if k != "history_splits"}
        lo, hi = splits[r], splits[r + 1]
        one.update(history_items=features["history_items"][lo:hi],
                   history_times=features["history_times"][lo:hi],
                   history_splits=np.array([0, hi - lo], np.int64))
        want = python({**one, "exclude_items": np.array(excluded[r], np.int64),
                       "exclude_splits": np.array([0, len(excluded[r])], np.int64),
                       "top_k": np.array([top_ks[r]], np.int32),
                       "beam_width": np.array([widths[r]], np.int32)})
        got = body["predictions"][0]
        np.testing.assert_array_equal(got["item_ids"], want["item_ids"].numpy()[0],
                                      err_msg=f"request {r} at width {widths[r]}")
        assert not set(got["item_ids"]) & set(excluded[r])
    # One request whose rows ask for two widths: refused naming the input, before the model.
    assert mixed[0] == 400 and "beam_width" in json.dumps(mixed[1])


@pytest.mark.gpu
def test_cuda_package_captures_one_graph_per_width_and_answers_like_recommend(tmp_path):
    """The same on the GPU, in float32: each named width through TorchCall equals
    ``Engine.recommend`` on CUDA at that width, and each width is its own captured graph,
    replayed on the next call at that width (no eager runs, no failure)."""
    from custom_ops.torch_call import package_stats

    out, report = tmp_path / "pipeline", tmp_path / "report.json"
    run_python(["-m", "xgr_cli.main", "export", f"--out={out}", f"--seed={SEED}",
                f"--num_items={ITEMS}", f"--beam_width={DEFAULT}",
                f"--beam_widths={','.join(map(str, WIDTHS))}", f"--top_k={TOP_K}",
                f"--top_n={TOP_N}", "--max_batch=16", "--cache_dir=", "--verify_requests=2",
                "--device=cuda:0", "--dtype=float32", f"--report_json={report}"], timeout=900)
    assert json.loads(report.read_text())["verify"]["ok"]
    world = make_world(WorldConfig(num_items=ITEMS, seed=SEED))
    model = Model.from_preset("tiny", seed=SEED, device="cuda:0")
    engine = Engine(model, Catalog.from_arrays(world.item_ids, world.item_codes))
    inputs = _request(engine, world.item_ids,
                      PromptSpec(model_hidden=model.config.hidden_size))
    for _ in range(2):
        for width in WIDTHS:
            items, _scores = _call(out, inputs, width)
            want = engine.recommend(*(t.cuda() for t in inputs[:3]), beam_width=width,
                                    top_k=TOP_K, prefix_embeds=inputs[3].cuda(),
                                    exclude_items=inputs[4].cuda())[0]
            np.testing.assert_array_equal(items, want.cpu().numpy(), err_msg=f"width {width}")
    stats = package_stats()[str(out / "assets" / "engine.pt2")]
    assert stats["graphs"] and stats["failure"] == "" and stats["eager_runs"] == 0, stats
    assert stats["captures"] == len(WIDTHS) and stats["replays"] == 2 * len(WIDTHS), stats
