"""A real checkpoint's path end to end, on a stand-in: a random-weight Qwen3 checkpoint with a
``tokenizers``-built tokenizer, its vocabulary extended by ``xgr extend_vocab`` (the layout's
tokens after the text), a catalog file and trained graph weights, exported in bfloat16 with
the card's item-causal mask and verified in a fresh process (TF + custom_ops, no Python torch)
against the Python engine in bfloat16 by the tolerance table's ranked-list rule."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.numpy import save_file

from tests.child_env import child_env
from tests.export.graph_weights import graph_weights
from xgr_checkpoint.catalog_file import write_catalog
from xgr_common.model_card import ModelCard
from xgr_common.tolerances import RANKED_LIST_RULE
from xgr_world.synthetic import WorldConfig, make_world

# Heavy (an AOTInductor compile and a fresh process).
pytestmark = pytest.mark.heavy

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / "build" / "torch_call_cache"
VERIFIED = 16


def _xgr(*args: str, timeout: int = 1200) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "xgr_cli.main", *args], cwd=ROOT,
                          env=child_env(TF_CPP_MIN_LOG_LEVEL="3"), capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("stand_in")
    for args in (("stand_in", f"--out={root / 'base'}", "--architecture=qwen3"),
                 ("extend_vocab", f"--model={root / 'base'}", f"--out={root / 'model'}",
                  "--keep_last=20")):
        done = _xgr(*args, timeout=300)
        assert done.returncode == 0, (args, done.stdout[-2000:], done.stderr[-3000:])
    card = ModelCard.read(root / "model")
    world = make_world(WorldConfig(num_items=400, num_users=10, seed=2))
    write_catalog(root / "catalog.parquet", world.item_ids, world.item_codes)
    save_file(graph_weights(card.spec), str(root / "graph.safetensors"))
    report = root / "report.json"
    done = _xgr("export", f"--model={root / 'model'}", f"--catalog={root / 'catalog.parquet'}",
                f"--feature_graph={root / 'graph.safetensors'}", "--dtype=bfloat16",
                "--beam_width=16", "--top_k=12", "--top_n=8", f"--cache_dir={CACHE}",
                f"--verify_requests={VERIFIED}", f"--out={root / 'saved_model'}",
                f"--report_json={report}")
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-4000:])
    return card, done.stdout, json.loads(report.read_text())


def test_the_layout_sits_after_the_stand_ins_text_vocabulary(exported):
    card = exported[0]
    assert card.spec.layout.base > 0 and card.spec.layout.code_end <= card.vocab_size
    assert card.prefill_mask.value == "item_causal" and card.spec.keep_last == 20


def test_bf16_export_verifies_against_the_bf16_python_engine(exported):
    _, stdout, report = exported
    assert report["dtype"] == "bfloat16" and report["prefill_mask"] == "item_causal"
    verify = report["verify"]
    assert verify["ok"], stdout
    assert verify["requests"] == VERIFIED and verify["dtype"] == "bfloat16"
    assert verify["rule"] == RANKED_LIST_RULE and not verify["forbidden_modules"]
    assert "the Python pipeline (Engine.recommend in bfloat16)" in stdout
    assert "rule (bfloat16): each item returned carries its reference score" in stdout
    # Requests drawn from the catalog reach items: not an empty comparison.
    assert sum(verify["items_per_request"]) > 0
