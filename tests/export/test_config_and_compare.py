"""The export's plain parts, without compiling anything: its configs refuse what cannot be
exported, naming the setting, and the comparison with the in-process pipeline finds every
difference (the fresh-process run itself is tested in tests/torch_call/test_export_engine.py)."""

from __future__ import annotations

import numpy as np
import pytest

from xgr_common.errors import ConfigError
from xgr_export.config import EngineExportConfig, ExportConfig
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
