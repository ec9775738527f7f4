"""The export's plain parts, without compiling anything: its configs refuse what cannot be
exported, naming the setting, and the comparison with the in-process pipeline finds every
difference (the fresh-process run itself is tested in tests/torch_call/test_export_engine.py)."""

from __future__ import annotations

import numpy as np
import pytest

from xgr_common.errors import CapacityError, ConfigError
from xgr_export.config import EngineExportConfig, ExportConfig
from xgr_export import verify
from xgr_export.verify import compare
from xgr_world.synthetic import WorldConfig


@pytest.mark.parametrize("changes, rule", [
    ({"out": ""}, "ExportConfig.out"),
    ({"top_n": 0}, "ExportConfig.top_n"),
    ({"keep_last": -1}, "ExportConfig.keep_last"),
    ({"dtype": "float64"}, "ExportConfig.dtype"),
    ({"attention_backend": "cudnn"}, "ExportConfig.attention_backend"),
    ({"verify_requests": 11, "world": WorldConfig(num_items=200, num_users=10)},
     r"verify_requests must be in \[0, world.num_users=10\]"),
])
def test_export_config_names_the_setting_it_refuses(changes, rule):
    with pytest.raises(ConfigError, match=rule):
        ExportConfig(**{"out": "/tmp/never", **changes})


@pytest.mark.parametrize("changes, rule", [
    ({"beam_width": 0}, "EngineExportConfig.beam_width"),
    ({"top_k": 2.5}, "EngineExportConfig.top_k"),
    ({"max_batch": True}, "EngineExportConfig.max_batch"),
    ({"device": "tpu"}, "EngineExportConfig.device"),
])
def test_engine_export_config_names_the_setting_it_refuses(changes, rule):
    with pytest.raises(ConfigError, match=rule):
        EngineExportConfig(**changes)


def test_export_config_defaults_match_the_command_line():
    config = ExportConfig(out="/tmp/never")
    assert (config.engine.beam_width, config.engine.top_k, config.top_n) == (16, 12, 8)
    assert config.model_name == "tiny" and config.world == WorldConfig()


def _outputs(items, scores, counts) -> dict[str, np.ndarray]:
    return {"item_ids": np.array(items, np.int64), "scores": np.array(scores, np.float32),
            "num_items": np.array(counts, np.int32)}


WANT = _outputs([[5, 7, -1], [3, 4, 6]], [[-1.0, -2.0, -np.inf], [-1.0, -1.5, -2.0]], [2, 3])


def test_equal_outputs_pass():
    report = compare(dict(WANT), WANT, modules=["tensorflow", "custom_ops"])
    assert report.ok and report.rows_exact == 2 and report.max_score_error == 0.0


def test_a_different_item_is_reported_with_its_row_and_position():
    got = _outputs([[5, 7, -1], [3, 6, 4]], WANT["scores"], [2, 3])
    report = compare(got, WANT)
    assert not report.ok and report.rows_exact == 1
    assert report.mismatched_rows == ({"row": 1, "position": 1, "got": 6, "want": 4,
                                       "got_score": -1.5, "want_score": -1.5},)


def test_a_score_beyond_the_tolerance_fails():
    got = _outputs(WANT["item_ids"], [[-1.0, -2.1, -np.inf], [-1.0, -1.5, -2.0]], [2, 3])
    report = compare(got, WANT)
    assert not report.ok and report.max_score_error == pytest.approx(0.1, rel=1e-5)


def test_an_infinite_score_where_a_finite_one_was_fails():
    got = _outputs(WANT["item_ids"], [[-1.0, -np.inf, -np.inf], [-1.0, -1.5, -2.0]], [2, 3])
    assert compare(got, WANT).max_score_error == float("inf")


def test_torch_or_engine_code_in_the_child_fails():
    report = compare(dict(WANT), WANT, modules=["tensorflow", "torch._C", "torch_engine.model",
                                                "tf_frontend", "bridge.dlpack", "torchvision"])
    assert not report.ok
    assert report.forbidden_modules == ("bridge.dlpack", "tf_frontend", "torch._C",
                                        "torch_engine.model")


# A bf16 row whose item 9, never scored by the reference, took position 1 at a score tied with
# the reference's there: a prefix the reference's beam dropped at a near tie.
BF16_WANT = _outputs([[5, 7, 8, 2]], [[-1.0, -2.0, -2.5, -4.0]], [4])
BF16_GOT = _outputs([[5, 9, 8, 2]], [[-1.0, -2.01, -2.5, -4.0]], [4])


def test_a_bf16_item_the_reference_never_scored_breaks_the_rule_without_evidence():
    report = compare(BF16_GOT, BF16_WANT, dtype="bfloat16")
    assert not report.ok and report.mismatched_rows[0]["position"] == 1
    assert report.wider_beam == 0


@pytest.mark.parametrize("wide_items, wide_scores, ok", [
    ([5, 9, 7, 8], [-1.0, -2.005, -2.0, -2.5], True),    # the wider beam scores item 9 alike
    ([5, 9, 7, 8], [-1.0, -2.6, -2.0, -2.5], False),     # ... at another score
    ([5, 7, 8, 2], [-1.0, -2.0, -2.5, -4.0], False),     # ... or never returns it
])
def test_a_wider_beams_reference_is_the_evidence_for_an_item_the_reference_dropped(
        wide_items, wide_scores, ok):
    wider = _outputs([wide_items], [wide_scores], [4])
    report = compare(BF16_GOT, BF16_WANT, dtype="bfloat16", wider=wider, wider_beam=64)
    assert report.ok == ok and report.wider_beam == 64
    assert report.rows_within_ties == (1 if ok else 0)


# The reference's beam dropped item 9 (well above the position's score): every later position
# of the reference lags one item behind the SavedModel's list.
HOLE_WANT = _outputs([[5, 7, 8, 2]], [[-1.0, -2.0, -2.5, -4.0]], [4])


@pytest.mark.parametrize("got_items, got_scores, position", [
    ([5, 9, 7, 8], [-1.0, -1.5, -2.0, -2.5], None),      # each item at its own score
    ([5, 9, 7, 2], [-1.0, -1.5, -2.0, -4.0], 3),         # 8 (-2.5) skipped for a lower score
    ([5, 9, 7, 8], [-1.0, -1.5, -2.0, -2.9], 3),         # 8 at another score than its own
    ([5, 9, 7, 6], [-1.0, -1.5, -2.0, -2.5], 3),         # 6: scored by neither reference
    ([5, 7, 9, 8], [-1.0, -2.0, -1.5, -2.5], 2),         # out of score order
])
def test_past_an_item_the_reference_dropped_its_positions_lag(got_items, got_scores,
                                                              position):
    wider = _outputs([[5, 9, 7, 8]], [[-1.0, -1.51, -2.0, -2.5]], [4])
    got = _outputs([got_items], [got_scores], [4])
    assert not compare(got, HOLE_WANT, dtype="bfloat16").ok       # no evidence, no pass
    report = compare(got, HOLE_WANT, dtype="bfloat16", wider=wider, wider_beam=64)
    assert report.ok == (position is None)
    if position is not None:
        assert report.mismatched_rows[0]["position"] == position
    else:   # the error is read item by item, as the rule reads the lists
        assert report.max_score_error == pytest.approx(0.01, abs=1e-6)


def test_a_wider_beam_excuses_no_float32_difference():
    wider = _outputs([[5, 9, 7, 8]], [[-1.0, -2.01, -2.0, -2.5]], [4])
    report = compare(BF16_GOT, BF16_WANT, dtype="float32", wider=wider, wider_beam=64)
    assert not report.ok and report.wider_beam == 0


def _fresh(monkeypatch, got: dict):
    def run_fresh(saved_model, features, repeats, timeout):
        return {**got, "modules": np.array(["tensorflow"]), "seconds": np.zeros(3)}
    monkeypatch.setattr(verify, "run_fresh", run_fresh)


def test_verify_runs_the_wider_reference_only_when_the_rule_breaks(monkeypatch):
    calls = []

    def wider():
        calls.append(1)
        return _outputs([[5, 9, 7, 8]], [[-1.0, -2.005, -2.0, -2.5]], [4])

    _fresh(monkeypatch, BF16_WANT)
    assert verify.verify_saved_model("m", {}, BF16_WANT, dtype="bfloat16",
                                     wider=(64, wider)).ok and calls == []
    _fresh(monkeypatch, BF16_GOT)
    report = verify.verify_saved_model("m", {}, BF16_WANT, dtype="bfloat16", wider=(64, wider))
    assert report.ok and report.wider_beam == 64 and calls == [1]


def test_a_wider_reference_without_memory_leaves_the_break_reported(monkeypatch):
    def wider():
        raise CapacityError("no memory for 1024 beams")

    _fresh(monkeypatch, BF16_GOT)
    report = verify.verify_saved_model("m", {}, BF16_WANT, dtype="bfloat16", wider=(64, wider))
    assert not report.ok and report.mismatched_rows[0]["got"] == 9


# A float32 search of the same requests: the SavedModel's item 9 is off by 0.4, the
# in-process engine's item 7 by 0.05.
PRECISE = _outputs([[5, 7, 9, 8]], [[-1.0, -2.05, -2.41, -2.5]], [4])


def test_drift_is_each_sides_largest_error_against_the_precise_search():
    saved, engine = verify.drift(PRECISE, [BF16_GOT], BF16_WANT)
    assert saved == pytest.approx(0.4, abs=1e-6) and engine == pytest.approx(0.05, abs=1e-6)
    # Over every call compared (a repeated call's list too): the worst of them.
    later = _outputs([[5, 9, 8, 2]], [[-1.0, -3.01, -2.5, -4.0]], [4])
    assert verify.drift(PRECISE, [BF16_GOT, later], BF16_WANT)[0] == pytest.approx(0.6, abs=1e-6)


def test_verify_runs_the_float32_search_only_when_the_rule_stays_broken(monkeypatch):
    calls = []

    def precise():
        calls.append(1)
        return PRECISE

    _fresh(monkeypatch, BF16_WANT)
    report = verify.verify_saved_model("m", {}, BF16_WANT, dtype="bfloat16", precise=precise)
    assert report.ok and calls == [] and report.saved_drift is None
    _fresh(monkeypatch, BF16_GOT)
    report = verify.verify_saved_model("m", {}, BF16_WANT, dtype="bfloat16", precise=precise)
    assert not report.ok and calls == [1]
    assert report.saved_drift == pytest.approx(0.4, abs=1e-6)
    assert report.engine_drift == pytest.approx(0.05, abs=1e-6)
    assert report.to_json()["saved_drift"] == report.saved_drift
    # Item 9 is 0.4 from the float32 search's score: past a tie widened by the engine's 0.05.
    assert report.precise_rows_broken == 1

    def no_memory():
        raise CapacityError("no memory for a float32 copy")

    report = verify.verify_saved_model("m", {}, BF16_WANT, dtype="bfloat16", precise=no_memory)
    assert not report.ok and report.saved_drift is None


# The exact answer between two 16-bit programs: the engine 0.05 above it on item 7, the
# SavedModel 0.05 below; apart by 0.1, past one tie (0.031 at this score).
PRECISE_BETWEEN = _outputs([[5, 7, 8, 2]], [[-1.0, -2.05, -2.5, -4.0]], [4])
BELOW = _outputs([[5, 7, 8, 2]], [[-1.0, -2.1, -2.5, -4.0]], [4])


def _check_of(report):
    """``report`` as ``xgr export --verify_requests`` summarises it (one request row)."""
    from xgr_export.check import PipelineCheck
    return PipelineCheck(report=report, device="cpu", reference="the Python pipeline",
                         prompt_tokens_min=6, prompt_tokens_max=9,
                         python_first_call_seconds=1.0, python_call_seconds=0.1,
                         items_per_request=(4,))


def test_a_16_bit_package_as_close_to_the_exact_answer_as_the_engine_passes(monkeypatch):
    assert compare(BELOW, BF16_WANT, dtype="bfloat16").mismatched_rows   # against each other
    _fresh(monkeypatch, BELOW)
    report = verify.verify_saved_model("m", {}, BF16_WANT, dtype="bfloat16",
                                       precise=lambda: PRECISE_BETWEEN)
    assert report.ok and report.mismatched_rows and report.precise_rows_broken == 0
    assert report.saved_drift == pytest.approx(0.05, abs=1e-6)
    assert report.engine_drift == pytest.approx(0.05, abs=1e-6)
    assert "float32 search" in report.rule
    check = _check_of(report)
    assert "items as close to a float32 search as the in-process engine's" in check.summary()
    assert "with ties widened by the engine's error: 0" in check.summary()


def test_an_item_the_exact_search_never_scored_is_not_excused_by_small_score_errors(
        monkeypatch):
    """A small drift over the items both lists hold says nothing of an item only the
    package returned: it must still sit at or below the float32 list's end, within the
    widened tie."""
    stray = _outputs([[5, 11, 8, 2]], [[-1.0, -2.0, -2.5, -4.0]], [4])
    _fresh(monkeypatch, stray)
    report = verify.verify_saved_model("m", {}, BF16_WANT, dtype="bfloat16",
                                       precise=lambda: PRECISE_BETWEEN)
    assert not report.ok and report.precise_rows_broken == 1
    assert report.saved_drift == pytest.approx(0.0, abs=1e-6)


def test_a_widened_tie_reaches_exactly_the_engines_error():
    from xgr_common.tolerances import scores_tied
    # -2.0 and -1.9: 0.1 apart, one bf16 tie is 0.01 + 0.01 x 2.0 = 0.03.
    assert scores_tied(-2.0, -1.9, "bfloat16", slack=0.0701)
    assert not scores_tied(-2.0, -1.9, "bfloat16", slack=0.0699)
    assert not scores_tied(-2.0, -1.9, "bfloat16")


def test_no_float32_reference_for_an_engine_in_32_bits():
    from types import SimpleNamespace

    import torch

    from tf_frontend.pipeline_spec import PipelineConfig
    from xgr_export.check import _float32_reference
    engine = SimpleNamespace(dtype=torch.float32)
    assert _float32_reference(None, engine, PipelineConfig(), {}, 16, 12, None) is None


def test_a_float32_copy_without_memory_is_a_capacity_error(monkeypatch):
    """The check then reports its verdict without the drift figures, the export goes on."""
    from types import SimpleNamespace

    import torch

    from tf_frontend.pipeline_spec import PipelineConfig
    from torch_engine.config import EngineConfig
    from xgr_export import check

    def no_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 6.80 GiB")

    monkeypatch.setattr(check, "Engine", no_memory)
    engine = SimpleNamespace(dtype=torch.bfloat16, model=torch.nn.Linear(2, 2), catalog=None,
                             config=EngineConfig())
    run = check._float32_reference(None, engine, PipelineConfig(), {}, 16, 12, None)
    with pytest.raises(CapacityError, match="no memory for a float32 copy of the model"):
        run()


def test_no_wider_reference_past_the_engines_widest_beam_or_for_requests_naming_widths():
    from types import SimpleNamespace

    from tf_frontend.pipeline_spec import WIDTH_CONTROL, PipelineConfig
    from xgr_export.check import _wider_reference
    engine = SimpleNamespace(config=SimpleNamespace(max_beam_width=256))
    assert _wider_reference(None, engine, PipelineConfig(), {}, 256, 12, None) is None
    engine = SimpleNamespace(config=SimpleNamespace(max_beam_width=1024))
    assert _wider_reference(None, engine, PipelineConfig(), {WIDTH_CONTROL: [16]}, 16, 12,
                            None) is None


def test_the_check_summary_names_the_wider_reference_it_consulted():
    wider = _outputs([[5, 9, 7, 8]], [[-1.0, -2.005, -2.0, -2.5]], [4])
    report = compare(BF16_GOT, BF16_WANT, dtype="bfloat16", wider=wider, wider_beam=64)
    check = _check_of(report)
    assert "items equal" in check.summary()
    assert "1 differing only inside score ties, a 64-beam reference consulted" in check.summary()


def test_the_check_summary_says_which_side_drifts_from_the_float32_search():
    from dataclasses import replace

    report = replace(compare(BF16_GOT, BF16_WANT, dtype="bfloat16"), saved_drift=0.4,
                     engine_drift=0.05)
    check = _check_of(report)
    assert "items DIFFERENT" in check.summary()
    assert ("against a float32 search of the same weights: SavedModel score error 4.00e-01, "
            "in-process engine 5.00e-02") in check.summary()
