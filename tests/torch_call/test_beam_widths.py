"""One engine package for several beam widths (``EngineExportConfig.beam_widths``): the width
is the length of a sixth input (``beam_slots``), traced dynamic, so one package (the weights
once) serves each width, and TorchCall runs each call at its own width: every named width
returns ``Engine.recommend``'s items at that width, widths outside the named span are refused
naming the input before anything runs, and a width the traced search cannot serve is refused
at export."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
import torch

from custom_ops.torch_call import torch_call
from tests.torch_engine.engine_worlds import prompts, small_world
from torch_engine.catalog import Catalog
from torch_engine.config import PRESETS, EngineConfig
from torch_engine.engine import Engine
from torch_engine.model import Model
from xgr_common.errors import ConfigError, ExportError, InvalidInputError
from xgr_common.prompt_spec import PromptSpec
from xgr_common.tolerances import tolerance_for
from xgr_export.config import EngineExportConfig, ExportConfig
from xgr_export.engine_package import export_engine

# Heavy (an AOTInductor compile of the search): left out of `make test-quick`.
pytestmark = pytest.mark.heavy

WIDTHS, DEFAULT, TOP_K = (8, 16, 32), 16, 10
FP32 = tolerance_for(torch.float32)


def _engine() -> tuple[Engine, np.ndarray, PromptSpec]:
    model = Model(PRESETS["tiny"])
    model.init_weights(3)
    ids, codes = small_world(seed=1, n=300, used_codes=8)
    engine = Engine(model.eval(), Catalog.from_arrays(ids, codes),
                    EngineConfig(cuda_graphs=False))
    return engine, ids, PromptSpec(model_hidden=model.config.hidden_size, keep_last=3)


@pytest.fixture(scope="module")
def widths_package(tmp_path_factory):
    engine, ids, spec = _engine()
    path = tmp_path_factory.mktemp("widths") / "engine.pt2"
    package = export_engine(engine, spec, path,
                            EngineExportConfig(beam_width=DEFAULT, top_k=TOP_K, max_batch=8,
                                               beam_widths=WIDTHS))
    return package, engine, ids, spec


def _request(engine, ids, spec):
    tokens, lengths, segments = prompts(9, [7, 12, 10], width=12)
    tokens = (tokens % (engine.model.config.vocab_size - 8)).to(torch.int32)
    soft = torch.randn(3, spec.profile_tokens, engine.model.config.hidden_size,
                       generator=torch.Generator().manual_seed(1))
    exclude = torch.tensor([[int(ids[1]), -1], [-1, -1], [int(ids[2]), int(ids[5])]])
    return tokens, lengths.to(torch.int32), segments, soft, exclude


def _call(package, inputs, width: int):
    args = [tf.constant(t.numpy()) for t in inputs] + [tf.zeros([width], tf.int8)]
    items, scores = torch_call(str(package.path), args, [tf.int64, tf.float32])
    return items.numpy(), scores.numpy()


def test_the_package_takes_the_width_as_an_input_bounded_by_the_named_widths(widths_package):
    package = widths_package[0]
    width_input = package.inputs[-1]
    assert width_input.dtype == "int8" and len(package.inputs) == 6
    symbol = width_input.dims[0]
    assert (symbol, WIDTHS[0], WIDTHS[-1]) in package.ranges


def test_each_named_width_answers_like_recommend_at_that_width(widths_package):
    package, engine, ids, spec = widths_package
    inputs = _request(engine, ids, spec)
    answers = {}
    for width in WIDTHS:
        items, scores = _call(package, inputs, width)
        want_items, want_scores = engine.recommend(
            *inputs[:3], beam_width=width, top_k=TOP_K, prefix_embeds=inputs[3],
            exclude_items=inputs[4])[:2]
        np.testing.assert_array_equal(items, want_items.numpy(), err_msg=f"width {width}")
        np.testing.assert_allclose(scores, want_scores.numpy(), rtol=FP32.rtol, atol=FP32.atol)
        answers[width] = items
    # The widths search differently: a package that ignored its input would answer alike.
    assert not all(np.array_equal(answers[WIDTHS[0]], a) for a in answers.values())
    # The next call at the default width is unaffected by the ones before it.
    np.testing.assert_array_equal(_call(package, inputs, DEFAULT)[0], answers[DEFAULT])


@pytest.mark.parametrize("width", [WIDTHS[0] - 1, WIDTHS[-1] + 1])
def test_widths_outside_the_named_span_are_refused_before_anything_runs(widths_package, width):
    package, engine, ids, spec = widths_package
    inputs = _request(engine, ids, spec)
    with pytest.raises((tf.errors.InvalidArgumentError, InvalidInputError),
                       match=r"input 5"):
        _call(package, inputs, width)
    # The refusal cost the next call nothing.
    _call(package, inputs, DEFAULT)


def test_named_widths_are_checked_before_the_compile(tmp_path):
    engine, _, spec = _engine()
    with pytest.raises(ConfigError, match="default width and must be one of beam_widths"):
        EngineExportConfig(beam_width=12, beam_widths=WIDTHS)
    # The SavedModel's signatures do not take a width yet: refused, not half-served.
    with pytest.raises(ConfigError, match="signatures take no beam width yet"):
        ExportConfig(out="x", engine=EngineExportConfig(beam_width=16, beam_widths=WIDTHS))
    reachable = engine.catalog.reachable_items(1)
    with pytest.raises(ConfigError, match="beam width 1 can reach"):
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
