"""``extend_vocabulary`` and the stand-ins, checked with transformers' own forward.

For qwen2 and qwen3, tied and untied: the text logits stay, the new rows follow the documented
rule, the tokenizer maps each layout name to its id, ``xgr_model.json`` reads back, and our
``Model`` loads the result, agrees with transformers and recommends through an ``Engine``.
"""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import replace

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.child_env import child_env
from tests.xgr_commands import run_commands
from torch_engine.catalog import Catalog
from torch_engine.engine import Engine
from torch_engine.model import Model
from xgr_checkpoint.stand_in import BPE_VOCAB, QWEN_SPECIALS, ROW_MULTIPLE, make_stand_in
from xgr_checkpoint.vocabulary import VocabularyConfig, extend_vocabulary
from xgr_common.errors import ConfigError
from xgr_common.layout import MaskMode
from xgr_common.model_card import MODEL_CARD_FILE, ModelCard
from xgr_common.tolerances import tolerance_for

TEXT = "Customers who bought this lamp also watched three films."
F32 = tolerance_for("float32")


def hf_model(path):
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def assert_close(got: torch.Tensor, want: torch.Tensor) -> None:
    got, want = got.double(), want.double()
    assert float((got - want).norm() / want.norm()) <= F32.rel_norm
    torch.testing.assert_close(got, want, atol=F32.atol, rtol=F32.rtol)


def matrices(path, tied: bool) -> dict[str, torch.Tensor]:
    """The embedding and, untied, the head of a saved checkpoint."""
    weights = load_file(str(path / "model.safetensors"))
    found = {"embedding": weights["model.embed_tokens.weight"]}
    if not tied:
        found["lm_head"] = weights["lm_head.weight"]
    return found


def layout_prompt(spec) -> list[int]:
    """BOS PROFILE_START ctx | ITEM_START c0 c1 c2 (twice) | ITEM_START, as layout ids."""
    layout = spec.layout
    prompt = [layout.bos_id, layout.profile_start_id, spec.context_token(1)]
    for item in ((3, 200, 17), (255, 0, 128)):
        prompt += [layout.item_start_id, *(layout.code_token(level, code)
                                           for level, code in enumerate(item))]
    return prompt + [layout.item_start_id]


# ------------------------------------------------------------------------------- stand-ins
def test_a_stand_in_is_shaped_like_a_qwen_checkpoint(stand_ins, kind):
    arch, tied = kind
    stand_in = stand_ins[arch, tied]
    config = json.loads((stand_in.path / "config.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(stand_in.path)
    assert (config["model_type"], config["hidden_size"], config["tie_word_embeddings"]) == \
        (arch, 64, tied)
    assert len(tokenizer) == stand_in.text_vocab == BPE_VOCAB + len(QWEN_SPECIALS)
    assert tokenizer.convert_tokens_to_ids(list(QWEN_SPECIALS)) == \
        list(range(BPE_VOCAB, BPE_VOCAB + len(QWEN_SPECIALS)))
    # Padding rows past the text, as Qwen2's 151936 rows hold 151665 tokens.
    assert config["vocab_size"] == stand_in.vocab_size > stand_in.text_vocab
    assert config["vocab_size"] % ROW_MULTIPLE == 0
    tokens = torch.tensor([tokenizer(TEXT).input_ids])
    assert tokens.shape[1] > len(TEXT.split())          # BPE splits words into pieces
    with torch.no_grad():
        assert_close(Model.from_pretrained(stand_in.path)(tokens),
                     hf_model(stand_in.path)(tokens).logits)


def test_a_stand_in_is_reproducible_from_its_seed(tmp_path):
    first, again, other = (make_stand_in(tmp_path / name, "qwen3", seed=seed)
                           for name, seed in (("a", 5), ("b", 5), ("c", 6)))
    assert (first.path / "tokenizer.json").read_text() == \
        (again.path / "tokenizer.json").read_text()
    a, b, c = (load_file(str(s.path / "model.safetensors")) for s in (first, again, other))
    assert all(torch.equal(a[name], b[name]) for name in a)
    assert not torch.equal(a["model.embed_tokens.weight"], c["model.embed_tokens.weight"])


@pytest.mark.parametrize("arguments, message", [
    ({"architecture": "llama"}, "architecture must be one of"),
    ({"heads": 3}, r"heads \(3\) must be a multiple of kv_heads \(2\)"),
    ({"hidden_size": 0}, "hidden_size must be a positive int"),
])
def test_make_stand_in_refuses_bad_arguments(tmp_path, arguments, message):
    with pytest.raises(ConfigError, match=message):
        make_stand_in(tmp_path / "out", **arguments)


def test_make_stand_in_refuses_a_folder_in_use(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="must be new or empty"):
        make_stand_in(tmp_path)


# ------------------------------------------------------------------------- the extension
def test_the_report_states_the_layout_after_the_text(stand_ins, extended, extension, kind):
    arch, tied = kind
    stand_in, report = stand_ins[arch, tied], extended[arch, tied]
    layout = extension.layout(stand_in.text_vocab)
    assert (report.base, report.code_end) == (stand_in.text_vocab, layout.code_end)
    assert (report.old_vocab_size, report.new_vocab_size) == \
        (stand_in.vocab_size, math.ceil(layout.code_end / 64) * 64)
    assert report.tokens_added == layout.num_tokens == 8 + 248 + 3 * 256
    assert (report.tied, report.initialised_rows) == (tied, (report.base, report.new_vocab_size))
    assert "seed 7" in report.init_rule and "0.1" in report.init_rule
    assert f"[{report.base}, {report.code_end})" in report.summary()


def test_text_logits_are_unchanged(stand_ins, extended, kind):
    arch, tied = kind
    before_dir, after_dir = stand_ins[arch, tied].path, extended[arch, tied].out_dir
    base = extended[arch, tied].base
    for name, before in matrices(before_dir, tied).items():     # bit-identical text rows
        assert torch.equal(matrices(after_dir, tied)[name][:base], before[:base]), name
    tokens = torch.tensor([AutoTokenizer.from_pretrained(before_dir)(TEXT).input_ids])
    with torch.no_grad():
        before, after = hf_model(before_dir)(tokens).logits, hf_model(after_dir)(tokens).logits
    assert after.shape[-1] == extended[arch, tied].new_vocab_size
    assert_close(after[..., :base], before[..., :base])


def expected_rows(text_rows: torch.Tensor, count: int, generator: torch.Generator,
                  noise_scale: float):
    """The documented rule, written out: text-row mean + noise_scale x text-row std x N(0, 1)
    per dimension (population std, float64)."""
    text = text_rows.double()
    mean, std = text.mean(0), text.std(0, unbiased=False)
    noise = torch.randn((count, text.shape[1]), generator=generator).double()
    return mean + noise_scale * std * noise, mean, std


def test_new_rows_follow_the_documented_rule(extended, extension, kind):
    arch, tied = kind
    report = extended[arch, tied]
    (start, end), base = report.initialised_rows, report.base
    # One generator: the embedding's rows first, then the untied head's.
    generator = torch.Generator().manual_seed(extension.seed)
    for name, weight in matrices(report.out_dir, tied).items():
        want, mean, std = expected_rows(weight[:base], end - start, generator,
                                        extension.noise_scale)
        rows = weight[start:end].double()
        assert_close(rows, want)
        z = (rows - mean) / (extension.noise_scale * std)      # standard normal draws
        assert abs(float(z.mean())) < 0.02 and abs(float(z.std()) - 1) < 0.02, name
        assert torch.unique(weight[start:end], dim=0).shape[0] == end - start   # distinct


def test_a_layout_inside_the_old_padding_keeps_the_size(stand_ins, tmp_path):
    """A small layout fits the padding rows: no resize; the layout's rows are drawn by the
    rule, the padding past code_end stays as it was."""
    stand_in = stand_ins["qwen2", False]
    config = VocabularyConfig(levels=1, codebook_size=16, profile_vocab=16, seed=1)
    report = extend_vocabulary(stand_in.path, tmp_path / "out", config)
    assert report.code_end == stand_in.text_vocab + 40 < stand_in.vocab_size
    assert report.new_vocab_size == report.old_vocab_size == stand_in.vocab_size
    assert report.initialised_rows == (stand_in.text_vocab, report.code_end)
    generator = torch.Generator().manual_seed(1)
    before = matrices(stand_in.path, tied=False)
    for name, weight in matrices(report.out_dir, tied=False).items():
        assert torch.equal(weight[report.code_end:], before[name][report.code_end:])
        want, _, _ = expected_rows(weight[:report.base], 40, generator, config.noise_scale)
        assert_close(weight[report.base:report.code_end].double(), want)
    ModelCard.read(report.out_dir)


def test_the_new_rows_are_reproducible_from_the_seed(stand_ins, tmp_path):
    stand_in = stand_ins["qwen3", False]
    small = VocabularyConfig(levels=2, codebook_size=32, profile_vocab=16, seed=11)
    reports = [extend_vocabulary(stand_in.path, tmp_path / name, replace(small, seed=seed))
               for name, seed in (("a", 11), ("b", 11), ("c", 12))]
    a, b, c = (load_file(str(r.out_dir / "model.safetensors")) for r in reports)
    assert all(torch.equal(a[name], b[name]) for name in a)
    base = reports[0].base
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        assert torch.equal(a[name][:base], c[name][:base])
        assert not torch.equal(a[name][base:], c[name][base:])


def test_the_tokenizer_maps_each_name_to_its_layout_id(stand_ins, extended, kind):
    arch, tied = kind
    report = extended[arch, tied]
    layout = report.card.spec.layout
    tokenizer = AutoTokenizer.from_pretrained(report.out_dir)
    names = layout.token_names()
    assert len(tokenizer) == layout.code_end
    assert tokenizer.convert_tokens_to_ids(names) == list(range(layout.base, layout.code_end))
    ids = layout_prompt(report.card.spec)
    prompt = TEXT + " " + "".join(names[i - layout.base] for i in ids)
    text_ids = AutoTokenizer.from_pretrained(stand_ins[arch, tied].path)(TEXT + " ").input_ids
    encoded = tokenizer(prompt).input_ids
    assert encoded == text_ids + ids
    assert tokenizer.decode(encoded) == prompt


def test_the_model_card_reads_back(stand_ins, extended, extension, kind):
    arch, tied = kind
    report = extended[arch, tied]
    card = ModelCard.read(report.out_dir)
    assert card == report.card
    assert (card.architecture, card.vocab_size, card.hidden_size) == \
        (arch, report.new_vocab_size, 64)
    assert card.spec.model_hidden == 64 and card.prefill_mask is MaskMode.ITEM_CAUSAL
    assert card.spec.layout == extension.layout(stand_ins[arch, tied].text_vocab)
    assert json.loads((report.out_dir / "config.json").read_text())["vocab_size"] == \
        report.new_vocab_size


def test_our_model_loads_it_and_agrees_with_transformers(extended, kind):
    arch, tied = kind
    report = extended[arch, tied]
    tokens = torch.tensor([layout_prompt(report.card.spec)])
    model = Model.from_pretrained(report.out_dir, dtype=torch.float32)
    assert model.config.vocab_size == report.new_vocab_size
    assert model.config.tie_word_embeddings is tied
    with torch.no_grad():
        assert_close(model(tokens), hf_model(report.out_dir)(tokens).logits)


def transformers_path_scores(hf, prompt: list[int], codes: np.ndarray, layout) -> np.ndarray:
    """Each item's log-probability under transformers' forward, each level normalised over the
    codes the catalog allows after the item's prefix (what the engine's scores are)."""
    scores = []
    for path in codes:
        tokens = prompt + [layout.code_token(level, int(c)) for level, c in enumerate(path)]
        with torch.no_grad():
            logits = hf(torch.tensor([tokens[:-1]])).logits[0, len(prompt) - 1:].double()
        total = 0.0
        for level in range(layout.levels):
            same_prefix = (codes[:, :level] == path[:level]).all(axis=1)
            allowed = sorted(set(codes[same_prefix, level].tolist()))
            ids = [layout.code_token(level, c) for c in allowed]
            total += float(torch.log_softmax(logits[level, ids], 0)[allowed.index(path[level])])
        scores.append(total)
    return np.array(scores)


def test_an_engine_recommends_with_it(extended, kind):
    arch, tied = kind
    """Beams wider than the catalog's prefixes: the engine scores every item, so its ranking
    and scores must equal transformers' path log-probabilities."""
    report = extended[arch, tied]
    spec = report.card.spec
    layout = spec.layout
    rng = np.random.default_rng(0)
    codes = np.unique(rng.integers(0, layout.codebook_size, (40, layout.levels)), axis=0)
    item_ids = np.arange(5000, 5000 + len(codes), dtype=np.int64)
    engine = Engine(Model.from_pretrained(report.out_dir, dtype=torch.float32),
                    Catalog.from_arrays(item_ids, codes, layout))
    prompt = layout_prompt(spec)
    items, scores = engine.recommend(torch.tensor([prompt]), torch.tensor([len(prompt)]),
                                     beam_width=64, top_k=len(codes))
    want = transformers_path_scores(hf_model(report.out_dir), prompt, codes, layout)
    order = np.argsort(-want, kind="stable")
    assert items[0].tolist() == item_ids[order].tolist()
    np.testing.assert_allclose(scores[0].double().numpy(), want[order], atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------- refusals
def _copy(stand_ins, extended, tmp_path, source: str):
    src = (extended["qwen2", True].out_dir if source == "extended"
           else stand_ins["qwen2", True].path)
    return shutil.copytree(src, tmp_path / "model")


def _edit_config(path, **changes):
    config_file = path / "config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), **changes}))


BROKEN = {
    "already extended": ("extended", lambda p: None, f"already holds {MODEL_CARD_FILE}"),
    "extended tokenizer, no card": (
        "extended", lambda p: (p / MODEL_CARD_FILE).unlink(),
        r"tokenizer already holds 1024 xgr tokens \(<\|xgr_bos\|>, <\|xgr_eos\|>, \.\.\.\)"),
    "llama": ("stand_in", lambda p: _edit_config(p, model_type="llama"),
              r"config.json model_type is 'llama': only \['qwen2', 'qwen3'\]"),
    "no tokenizer": ("stand_in", lambda p: [(p / n).unlink() for n in
                                            ("tokenizer.json", "tokenizer_config.json")],
                     r"has no tokenizer \(tokenizer.json or tokenizer_config.json\)"),
    "no config": ("stand_in", lambda p: (p / "config.json").unlink(), "has no config.json"),
    "tokenizer of another model": ("stand_in", lambda p: _edit_config(p, vocab_size=100),
                                   "tokenizer holds 323 tokens but config.json vocab_size is "
                                   "100"),
}


@pytest.mark.parametrize("case", BROKEN)
def test_a_checkpoint_it_cannot_extend_is_refused(stand_ins, extended, tmp_path, case):
    source, breaks, message = BROKEN[case]
    model = _copy(stand_ins, extended, tmp_path, source)
    breaks(model)
    with pytest.raises(ConfigError, match=message):
        extend_vocabulary(model, tmp_path / "out", VocabularyConfig())
    assert not (tmp_path / "out").exists()


def test_a_missing_model_folder_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=f"model folder {tmp_path / 'nope'} does not exist"):
        extend_vocabulary(tmp_path / "nope", tmp_path / "out")


def test_a_layout_past_the_largest_vocabulary_is_refused(stand_ins, tmp_path):
    with pytest.raises(ConfigError, match=r"ends at id 1347 \(code_end = 323 text ids \+ 1024 "
                                          r"layout tokens\), a vocabulary of 1408 rows, beyond "
                                          r"VocabularyConfig.max_vocab_size 1000"):
        extend_vocabulary(stand_ins["qwen2", True].path, tmp_path / "out",
                          VocabularyConfig(max_vocab_size=1000))


def test_an_output_folder_in_use_is_refused(stand_ins, tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"\0")
    with pytest.raises(ConfigError, match=f"output folder {tmp_path} must be new or empty"):
        extend_vocabulary(stand_ins["qwen2", True].path, tmp_path)


@pytest.mark.parametrize("changes, message", [
    ({"levels": 0}, r"levels must be an int >= 1, got 0"),
    ({"levels": True}, r"levels must be an int >= 1, got True"),
    ({"codebook_size": -4}, r"codebook_size must be an int >= 1"),
    ({"profile_vocab": 4}, "context tokens do not fit"),
    ({"keep_last": 0}, "keep_last must be an int >= 1"),
    ({"profile_tokens": -1}, "profile_tokens must be an int >= 0"),
    ({"seed": -1}, "seed must be an int >= 0"),
    ({"pad_to_multiple_of": 0}, "pad_to_multiple_of must be an int >= 1"),
    ({"noise_scale": 0.0}, "noise_scale must be a finite number > 0"),
    ({"noise_scale": float("nan")}, "noise_scale must be a finite number > 0"),
    ({"prefill_mask": "segment"}, r"prefill_mask must be one of \['causal', 'item_causal'\]"),
    ({"context_vocab": ("us", "us")}, "context_vocab must not repeat a value"),
    ({"context_vocab": ("us", "")}, "context_vocab must hold non-empty strings"),
    ({"max_vocab_size": 2**31}, r"max_vocab_size must be <= 2147483647"),
])
def test_bad_config_values_are_refused(changes, message):
    with pytest.raises(ConfigError, match=message):
        VocabularyConfig(**changes)


# ---------------------------------------------------------------------------------- CLI
# Subcommands define their own absl flags (both of these define --out), so, as in real use,
# each runs in its own process: one per subcommand, its commands in turn with the flags
# restored between them (flagsaver), each command's exit status and output reported back.
def xgr(*commands: list[str]) -> list[tuple[int, str, str]]:
    """Runs ``xgr`` commands of one subcommand in order, in one fresh process."""
    return run_commands(list(commands), child_env())


@pytest.mark.heavy
def test_the_commands_end_to_end(tmp_path):
    stand_in, out, report_json = tmp_path / "stand_in", tmp_path / "out", tmp_path / "r.json"
    made, again, bad_heads, shaped, both = xgr(
        ["stand_in", "--out", str(stand_in), "--architecture", "qwen3",
         "--notie_word_embeddings", "--seed", "2"],
        ["stand_in", "--out", str(stand_in)],
        ["stand_in", "--out", str(tmp_path / "other"), "--heads", "3"],
        ["stand_in", "--out", str(tmp_path / "shaped"), "--preset", "tiny"],
        ["stand_in", "--out", str(tmp_path / "both"), "--preset", "tiny", "--layers", "3"])
    assert made[0] == 0, made
    assert "wrote a random-weight qwen3 stand-in" in made[1]
    assert "323 text tokens in 384 embedding rows, hidden 64, lm_head untied" in made[1]
    # A preset's shape: the engine's tiny model (its MLP width too), the stand-in vocabulary.
    assert shaped[0] == 0, shaped
    config = json.loads((tmp_path / "shaped" / "config.json").read_text())
    assert (config["num_hidden_layers"], config["num_attention_heads"],
            config["intermediate_size"], config["vocab_size"]) == (2, 4, 128, 384)
    assert both[0] == 1 and "--preset tiny sets the shape: drop --layers" in both[2]
    assert not (tmp_path / "both").exists()
    results = xgr(
        ["extend_vocab", "--model", str(stand_in), "--out", str(out), "--levels", "2",
         "--codebook_size", "64", "--profile_vocab", "32", "--keep_last", "20",
         "--profile_tokens", "3", "--prefill_mask", "causal", "--seed", "5",
         "--report_json", str(report_json)],
        ["extend_vocab", "--model", str(out), "--out", str(tmp_path / "twice")],
        ["extend_vocab", "--model", str(stand_in), "--out", str(out)],
        ["extend_vocab", "--model", str(stand_in), "--out", str(tmp_path / "e"), "--levels",
         "0"],
        ["extend_vocab", "--model", str(stand_in), "--out", str(tmp_path / "e"),
         "--prefill_mask", "segment"],
        ["extend_vocab", "--out", str(tmp_path / "e")])
    extended, *refused = results
    assert extended[0] == 0, extended
    assert "vocabulary: 384 -> 512 rows" in extended[1]
    assert "168 tokens at ids [323, 491)" in extended[1]
    report = json.loads(report_json.read_text())
    assert (report["text_vocab"], report["code_end"], report["new_vocab_size"]) == \
        (323, 491, 512)
    card = ModelCard.read(out)
    assert (card.spec.keep_last, card.spec.profile_tokens, card.prefill_mask) == \
        (20, 3, MaskMode.CAUSAL)
    assert (card.spec.layout.levels, card.spec.layout.codebook_size) == (2, 64)
    expected = [(again, "must be new or empty"), (bad_heads, "multiple of kv_heads"),
                (refused[0], f"already holds {MODEL_CARD_FILE}"),
                (refused[1], "must be new or empty"),
                (refused[2], "levels must be an int >= 1, got 0"),
                (refused[3], "--prefill_mask"), (refused[4], "--model")]
    for (code, stdout, stderr), message in expected:
        assert code == 1 and message in stderr, (code, stdout, stderr)
        assert "Traceback" not in stdout + stderr
    assert not (tmp_path / "e").exists() and not (tmp_path / "twice").exists()


@pytest.mark.heavy
def test_a_version_2_card_from_the_command(stand_ins, tmp_path):
    """``--prompt_version 2`` writes the history split and the spans' text, tokenised by the
    checkpoint's own text tokenizer (a layout token's name in the text stays text), into the
    card; version 2 flags without it are refused."""
    stand_in = stand_ins["qwen2", True].path
    out = tmp_path / "v2"
    made, without_version = xgr(
        ["extend_vocab", "--model", str(stand_in), "--out", str(out), "--levels", "2",
         "--codebook_size", "32", "--profile_vocab", "16", "--prompt_version", "2",
         "--block_hours", "12", "--long_term_items", "30", "--recent_items", "8",
         "--intro", "Customers who bought", "--question", "also watched <|xgr_sid_0_0|>"],
        ["extend_vocab", "--model", str(stand_in), "--out", str(tmp_path / "e"),
         "--recent_items", "8"])
    assert made[0] == 0, made
    card = ModelCard.read(out)
    v2 = card.spec.prompt_v2
    assert card.spec.version == 2
    assert (v2.split.block_seconds, v2.split.long_term_items, v2.split.recent_items) == \
        (12 * 3600, 30, 8)
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert list(v2.spans.intro) == tokenizer("Customers who bought",
                                             add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(list(v2.spans.question)) == "also watched <|xgr_sid_0_0|>"
    assert card.spec.layout.code_token(0, 0) not in v2.spans.question
    assert v2.spans.before_profile == v2.spans.before_recent == ()
    assert all(t < card.spec.layout.base for t in v2.spans.intro + v2.spans.question)
    assert without_version[0] == 1 and "belong to prompt version 2" in without_version[2]
    assert not (tmp_path / "e").exists()
