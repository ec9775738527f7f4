"""The demo's prompt version: its settings, graph and training examples in version 2, and a
cache key of its own (a fit of one version is never loaded for the other)."""

import numpy as np
import pytest

from tf_frontend.feature_graph import features_from_world
from tf_frontend.feature_graph_v2 import FeatureGraphV2
from xgr_common.errors import ConfigError
from xgr_world import default_model as dm
from xgr_world.synthetic import make_world


def test_the_demo_is_version_2_and_ci_s_quick_fit_version_1():
    assert dm.DefaultModelSettings().spec.prompt_v2 == dm.DEMO_PROMPT_V2
    assert dm.QUICK.spec.version == 1


def test_version_2_settings_build_the_version_2_graph_and_examples():
    settings = dm.with_prompt_version(dm.QUICK, 2)
    assert settings.spec.version == 2 and settings.spec.prompt_v2 == dm.DEMO_PROMPT_V2
    assert dm.with_prompt_version(settings, 1).spec == dm.QUICK.spec
    assert settings.cache_key() != dm.QUICK.cache_key()
    world = make_world(settings.world)
    graph = dm.feature_graph_for(settings.spec, world, None)
    assert isinstance(graph, FeatureGraphV2)
    features, targets = dm.cut_features(world, np.arange(6), 1)
    examples = dm.training_examples(graph, features, dm.item_codes_of(world, targets))
    markers = (examples.token_ids == settings.spec.layout.soft_id).sum(dim=1)
    assert (markers == settings.spec.profile_tokens).all()
    with pytest.raises(ConfigError, match="prompt version must be 1 or 2, got 3"):
        dm.with_prompt_version(settings, 3)
