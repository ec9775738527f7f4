"""``xgr batch`` on a local Ray cluster: every user of a Parquet file through the tiny
engine's exported SavedModel, the results equal to the in-process pipeline over
``Engine.recommend`` user by user (one user with a bad history refused alone);
started again it skips the shards it finished, and a lost shard is redone alone."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bridge.pipeline import RecommendPipeline
from tests.pipeline.conftest import run_xgr
from tests.tiny_export import BEAMS, ITEMS, SEED, TOP_K, TOP_N
from tf_frontend.feature_graph import FeatureGraph, features_from_world
from tf_frontend.pipeline_spec import PipelineConfig
from torch_engine.catalog import Catalog
from torch_engine.engine import Engine
from torch_engine.model import Model
from xgr_batch.users import read_rows, write_users
from xgr_common.prompt_spec import PromptSpec
from xgr_common.tolerances import TOLERANCES
from xgr_world.synthetic import WorldConfig, make_world

pytestmark = pytest.mark.heavy
USERS = 30


def _engine_pipeline(world) -> RecommendPipeline:
    """The in-process pipeline the tiny export packaged: feature graph -> DLPack ->
    ``Engine.recommend`` -> rules."""
    model = Model.from_preset("tiny", seed=SEED)
    engine = Engine(model, Catalog.from_arrays(world.item_ids, world.item_codes))
    graph = FeatureGraph(PromptSpec(model_hidden=model.config.hidden_size), world.item_ids,
                         world.item_codes, seed=SEED)
    return RecommendPipeline.for_engine(graph, engine, BEAMS, TOP_K, PipelineConfig(top_n=TOP_N))


def _break_one_history(users) -> int:
    """Reverses the timestamps of the first user with two distinct ones (the feature graph
    refuses a history whose times decrease); returns that user's row."""
    table = pq.read_table(users)
    times = table.column("history_times").to_pylist()
    bad = next(row for row, t in enumerate(times) if len(set(t)) > 1)
    times[bad] = sorted(times[bad], reverse=True)
    column = table.schema.get_field_index("history_times")
    pq.write_table(table.set_column(column, "history_times",
                                    pa.array(times, table.schema.field(column).type)), users)
    return bad


def _run(saved_model, users, out):
    done = run_xgr("batch", f"--saved_model={saved_model}", f"--users={users}",
                   f"--out={out}", "--rows_per_shard=8", "--batch_size=5", "--actors=1",
                   "--local_cpus=2", timeout=600)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    return done.stdout


def test_the_job_answers_as_the_saved_model_and_resumes(tiny_engine_export, tmp_path):
    saved_model = tiny_engine_export[0]
    world = make_world(WorldConfig(num_items=ITEMS, seed=SEED))
    features = features_from_world(world, slice(0, USERS))
    users = write_users(tmp_path / "users.parquet", features)
    assert read_rows(users, 0, USERS)["history_splits"].tolist() == \
        features["history_splits"].numpy().tolist()
    bad = _break_one_history(users)
    out = tmp_path / "out"
    first = _run(saved_model, users, out)
    assert f"{USERS} users" in first and "4 shards, 0 finished before" in first
    assert "1 refused" in first
    got = pq.read_table(out).to_pydict()
    order = np.argsort(got["user_id"])
    assert np.array_equal(np.asarray(got["user_id"])[order],
                          features["user_id"].numpy())
    # The bad user's row: no items and the op's message; every other user as the SavedModel
    # answers it directly.
    assert got["item_ids"][order[bad]] == [] and got["num_items"][order[bad]] == 0
    assert "non-decreasing" in got["error"][order[bad]]
    want = _engine_pipeline(world)(features)
    good = [order[row] for row in range(USERS) if row != bad]
    assert all(got["error"][i] is None for i in good)
    np.testing.assert_array_equal(np.asarray([got["item_ids"][i] for i in good]),
                                  np.delete(want["item_ids"].numpy(), bad, axis=0))
    np.testing.assert_array_equal(np.asarray([got["num_items"][i] for i in good]),
                                  np.delete(want["num_items"].numpy(), bad, axis=0))
    scores = np.asarray([got["scores"][i] for i in good])
    expected = np.delete(want["scores"].numpy(), bad, axis=0)
    finite = np.isfinite(expected)
    tol = TOLERANCES["float32"]
    np.testing.assert_allclose(scores[finite], expected[finite], atol=tol.atol * 10,
                               rtol=tol.rtol)
    # Everything finished: nothing to redo. A lost shard: only it is redone.
    assert "0 users" in _run(saved_model, users, out)
    (out / "part-000002.parquet").unlink()
    again = _run(saved_model, users, out)
    assert "8 users" in again and "3 finished before" in again
    redone = pq.read_table(out / "part-000002.parquet").to_pydict()
    assert redone["user_id"] == features["user_id"].numpy()[16:24].tolist()
