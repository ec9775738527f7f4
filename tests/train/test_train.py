"""``xgr train`` as a team runs it: a stand-in checkpoint with the token layout
(``xgr stand_in`` then ``xgr extend_vocab``), a catalog file and a behaviour log in Parquet in;
a checkpoint, its card and tokenizer, and the profile tower's weights out, ready for
``xgr export``. Fine-tuned on a log with a planted pattern (each user walks one chain of
items), the model learns to predict the next item; a run resumes from its last checkpoint
with the batches and losses of an uninterrupted one; LoRA adapters come out merged."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from tests.pipeline.conftest import run_xgr
from xgr_checkpoint.catalog_file import write_catalog
from xgr_train.logs import write_logs

pytestmark = pytest.mark.heavy
CHAIN = 60


@pytest.fixture(scope="module")
def team(tmp_path_factory):
    """A stand-in checkpoint with the layout, a 300-item catalog and a planted log: 200
    users, each 12 consecutive steps along one 60-item chain from a random start."""
    root = tmp_path_factory.mktemp("team")
    done = run_xgr("stand_in", f"--out={root / 'base'}")
    assert done.returncode == 0, done.stderr[-2000:]
    done = run_xgr("extend_vocab", f"--model={root / 'base'}", f"--out={root / 'model'}",
                   "--keep_last=10")
    assert done.returncode == 0, done.stderr[-2000:]
    rng = np.random.default_rng(0)
    ids = rng.choice(np.arange(1000, 100_000), 300, replace=False).astype(np.int64)
    codes = rng.integers(0, 256, (300, 3)).astype(np.int32)
    write_catalog(root / "catalog.parquet", ids, codes)
    chain = ids[:CHAIN]
    users, items, times = [], [], []
    for user in range(200):
        start = rng.integers(0, CHAIN)
        for step in range(12):
            users.append(user)
            items.append(int(chain[(start + step) % CHAIN]))
            times.append(1_700_000_000 + 3600 * step)
    write_logs(root / "log.parquet", users, items, times, ["us"] * len(users))
    return root


def _train(team: Path, out: Path, *flags: str):
    done = run_xgr("train", f"--model={team / 'model'}", f"--catalog={team / 'catalog.parquet'}",
                   f"--logs={team / 'log.parquet'}", f"--out={out}", "--device=cpu",
                   "--batch_size=16", "--warmup_steps=5", "--learning_rate=3e-3", *flags,
                   timeout=900)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    return done, json.loads((out / "train_report.json").read_text())


def test_a_fine_tune_writes_what_export_takes_and_learns_the_pattern(team, tmp_path):
    from torch_engine.model import Model
    from xgr_common.model_card import ModelCard

    done, report = _train(team, tmp_path / "out", "--steps=300", "--holdout=0.2")
    assert "export it: xgr export --model" in done.stdout
    losses = report["losses"]
    assert len(losses) == 300 and np.mean(losses[-20:]) < 0.5 * np.mean(losses[:20])
    assert report["users"] == 160 and report["examples"] == 160 * 8
    model_dir = tmp_path / "out" / "model"
    card = ModelCard.read(model_dir)
    assert card == ModelCard.read(team / "model")
    assert (model_dir / "tokenizer.json").exists()
    model = Model.from_pretrained(model_dir)
    assert model.config.vocab_size == 1408
    tower = load_file(str(tmp_path / "out" / "tower.safetensors"))
    assert tower["projection_kernel"].shape == (card.spec.tower_hidden,
                                                card.spec.profile_tokens * card.spec.model_hidden)
    assert (tmp_path / "out" / "loss.png").stat().st_size > 0


def test_a_run_resumes_from_its_last_checkpoint(team, tmp_path):
    import shutil

    _, straight = _train(team, tmp_path / "out", "--steps=30", "--checkpoint_every=10")
    # A run stopped after its checkpoint at step 20: the later one never written.
    shutil.rmtree(tmp_path / "out" / "checkpoints" / "step_00000030")
    _, resumed = _train(team, tmp_path / "out", "--steps=30", "--checkpoint_every=10")
    assert resumed["resumed_from"] == 20 and len(resumed["losses"]) == 30
    assert resumed["losses"][:20] == straight["losses"][:20]
    # The batches a resumed run draws are the uninterrupted run's, and so are its losses.
    np.testing.assert_allclose(resumed["losses"], straight["losses"], rtol=1e-4)


def test_a_time_limit_stops_at_a_checkpoint_and_a_rerun_goes_on(team, tmp_path):
    """``--max_train_seconds`` ends the steps at a checkpoint with the model written so far;
    the same command again resumes there and finishes the steps asked for."""
    done, stopped = _train(team, tmp_path / "out", "--steps=10", "--checkpoint_every=5",
                           "--max_train_seconds=0.001")
    assert stopped["stopped_at_time_limit"] and len(stopped["losses"]) == 1
    assert "stopped at the time limit" in done.stdout
    assert (tmp_path / "out" / "checkpoints" / "step_00000001").is_dir()
    assert (tmp_path / "out" / "model" / "model.safetensors").exists()
    _, resumed = _train(team, tmp_path / "out", "--steps=10", "--checkpoint_every=5")
    assert resumed["resumed_from"] == 1 and len(resumed["losses"]) == 10
    assert not resumed["stopped_at_time_limit"]
    assert resumed["losses"][0] == stopped["losses"][0]


def test_a_negative_time_limit_is_refused_by_name():
    from xgr_common.errors import ConfigError
    from xgr_train.train import FineTuneConfig

    with pytest.raises(ConfigError, match=r"max_train_seconds must be >= 0 \(0: no limit\)"):
        FineTuneConfig(model="m", catalog="c", logs="l", out="o", max_train_seconds=-1.0)


def test_lora_adapters_come_out_merged(team, tmp_path):
    _, report = _train(team, tmp_path / "out", "--steps=20", "--lora_rank=4")
    assert report["lora_rank"] == 4
    before = load_file(str(team / "model" / "model.safetensors"))
    after = load_file(str(tmp_path / "out" / "model" / "model.safetensors"))
    assert set(after) == set(before)                 # no adapter tensors, the same names
    name = "model.layers.0.self_attn.q_proj.weight"
    assert not np.array_equal(after[name], before[name])   # the adapter folded in
    norm = "model.layers.0.input_layernorm.weight"
    assert np.array_equal(after[norm], before[norm])       # frozen under LoRA


def test_bad_inputs_are_refused_by_name(team, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"user": [1], "item": [2]}), tmp_path / "bad.parquet")
    done = run_xgr("train", f"--model={team / 'model'}", f"--catalog={team / 'catalog.parquet'}",
                   f"--logs={tmp_path / 'bad.parquet'}", f"--out={tmp_path / 'out'}",
                   "--device=cpu", "--steps=5", "--warmup_steps=1")
    assert done.returncode == 1
    assert "lacks column(s) ['timestamp']" in done.stderr
    done = run_xgr("train", f"--model={team / 'base'}", f"--catalog={team / 'catalog.parquet'}",
                   f"--logs={team / 'log.parquet'}", f"--out={tmp_path / 'out'}",
                   "--device=cpu", "--steps=5", "--warmup_steps=1")
    assert done.returncode == 1 and "xgr_model.json" in done.stderr


def test_a_version_2_checkpoint_trains_on_its_own_prompt(team, tmp_path):
    """A card with the version 2 contract (frozen long-term part, text spans from the
    checkpoint's tokenizer): the examples come from its feature graph, the card comes out
    unchanged, and the loss falls."""
    from xgr_common.model_card import ModelCard

    v2 = tmp_path / "model_v2"
    done = run_xgr("extend_vocab", f"--model={team / 'base'}", f"--out={v2}",
                   "--prompt_version=2", "--prefill_mask=causal", "--recent_items=6",
                   "--long_term_items=20", "--intro=recent items of a user:",
                   "--question=next item:")
    assert done.returncode == 0, done.stderr[-2000:]
    card = ModelCard.read(v2)
    assert card.spec.version == 2
    done = run_xgr("train", f"--model={v2}", f"--catalog={team / 'catalog.parquet'}",
                   f"--logs={team / 'log.parquet'}", f"--out={tmp_path / 'out'}",
                   "--device=cpu", "--batch_size=16", "--warmup_steps=5",
                   "--learning_rate=3e-3", "--steps=120", "--examples_per_user=4",
                   timeout=900)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    losses = json.loads((tmp_path / "out" / "train_report.json").read_text())["losses"]
    assert np.mean(losses[-20:]) < 0.7 * np.mean(losses[:20])
    assert ModelCard.read(tmp_path / "out" / "model") == card
