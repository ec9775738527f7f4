"""``xgr_model.json`` and the token layout after a text vocabulary: round trips, and every
contradiction refused with the file and the field named."""

from __future__ import annotations

import json

import pytest

from xgr_common.errors import ConfigError
from xgr_common.layout import MaskMode, TokenLayout
from xgr_common.model_card import MODEL_CARD_FILE, ModelCard, served_mask
from xgr_common.prompt_spec import PromptSpec

TEXT_VOCAB = 1000


def _card(**changes) -> ModelCard:
    layout = TokenLayout.after_text(TEXT_VOCAB, levels=3, codebook_size=16, profile_vocab=24)
    values = {"spec": PromptSpec(layout=layout, model_hidden=64),
              "prefill_mask": MaskMode.CAUSAL, "architecture": "qwen3",
              "vocab_size": 1088, "hidden_size": 64, **changes}
    return ModelCard(**values)


def _checkpoint(tmp_path, card: ModelCard, config_changes=None, tokens=None):
    config = {"model_type": card.architecture, "vocab_size": card.vocab_size,
              "hidden_size": card.hidden_size, **(config_changes or {})}
    (tmp_path / "config.json").write_text(json.dumps(config))
    layout = card.spec.layout
    names = layout.token_names() if tokens is None else tokens
    added = [{"id": layout.base + k, "content": name} for k, name in enumerate(names)]
    (tmp_path / "tokenizer.json").write_text(json.dumps({"added_tokens": added}))
    card.write(tmp_path)
    return tmp_path


def test_layout_after_text_places_every_token_after_it():
    layout = TokenLayout.after_text(151_665)
    assert layout.base == layout.pad_id == 151_665
    assert min(layout.special_ids.values()) == 151_665
    assert layout.profile_base == 151_665 + 8 and layout.code_base == 151_665 + 256
    assert layout.code_end == 151_665 + 256 + 3 * 256 == layout.base + layout.num_tokens
    names = layout.token_names()
    assert len(names) == layout.num_tokens and len(set(names)) == len(names)
    assert names[layout.bos_id - layout.base] == "<|xgr_bos|>"
    assert names[layout.code_token(2, 5) - layout.base] == "<|xgr_sid_2_5|>"
    assert TokenLayout.from_dict(layout.to_dict()) == layout


def test_default_layout_is_unchanged():
    layout = TokenLayout()
    assert (layout.base, layout.pad_id, layout.profile_base, layout.code_base,
            layout.code_end) == (0, 0, 8, 256, 1024)


@pytest.mark.parametrize("changes, rule", [
    ({"base": 10}, r"special ids .* must lie in \[base, base \+ num_special\)"),
    ({"bos_id": 0}, "special ids must be distinct"),
    ({"code_base": 4}, "code_base"),
    ({"levels": 1.5}, "TokenLayout.levels must be an int"),
])
def test_layout_refuses_inconsistent_fields(changes, rule):
    with pytest.raises(ConfigError, match=rule):
        TokenLayout(**changes)


def test_card_round_trips_through_its_file(tmp_path):
    card = _card()
    folder = _checkpoint(tmp_path, card)
    assert ModelCard.read(folder) == card
    assert json.loads((folder / MODEL_CARD_FILE).read_text())["prefill_mask"] == "causal"


def test_missing_card_is_refused_with_the_way_to_write_one(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match=f"has no {MODEL_CARD_FILE}.*extend_vocab"):
        ModelCard.read(tmp_path)


@pytest.mark.parametrize("config_changes, field", [
    ({"vocab_size": 2048}, "vocab_size = 1088 contradicts config.json vocab_size = 2048"),
    ({"hidden_size": 128}, "hidden_size = 64 contradicts config.json hidden_size = 128"),
    ({"model_type": "qwen2"}, "architecture = 'qwen3' contradicts config.json model_type"),
])
def test_card_contradicting_config_is_refused_naming_the_field(tmp_path, config_changes, field):
    folder = _checkpoint(tmp_path, _card(), config_changes)
    with pytest.raises(ConfigError, match=field):
        ModelCard.read(folder)


def test_card_contradicting_the_tokenizer_is_refused_naming_the_token(tmp_path):
    card = _card()
    names = card.spec.layout.token_names()
    names[1], names[2] = names[2], names[1]
    folder = _checkpoint(tmp_path, card, tokens=names)
    with pytest.raises(ConfigError, match=r"puts <\|xgr_bos\|> at id 1001, but tokenizer.json "
                                          r"has it at id 1002"):
        ModelCard.read(folder)


@pytest.mark.parametrize("edit, field", [
    (lambda d: d.pop("prefill_mask"), r"lacks fields \['prefill_mask'\]"),
    (lambda d: d.update(extra=1), r"unknown fields \['extra'\]"),
    (lambda d: d.update(prefill_mask="segment"), "prefill_mask must be one of"),
    (lambda d: d.update(version=7), "version 7"),
    (lambda d: d["prompt_spec"].pop("keep_last"), r"prompt_spec: prompt spec lacks fields"),
    (lambda d: d["prompt_spec"]["layout"].update(code_base=5), "prompt_spec: code_base"),
    (lambda d: d["prompt_spec"].update(model_hidden=32), "model_hidden 32"),
    (lambda d: d.update(vocab_size=1040),
     r"xgr_model.json: prompt_spec.layout ends at id 1080 \(code_end\), beyond vocab_size"),
])
def test_bad_card_fields_are_named(tmp_path, edit, field):
    folder = _checkpoint(tmp_path, _card())
    data = json.loads((folder / MODEL_CARD_FILE).read_text())
    edit(data)
    (folder / MODEL_CARD_FILE).write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=field):
        ModelCard.read(folder)


def test_card_that_is_not_json_is_refused(tmp_path):
    folder = _checkpoint(tmp_path, _card())
    (folder / MODEL_CARD_FILE).write_text("{not json")
    with pytest.raises(ConfigError, match="is not valid JSON"):
        ModelCard.read(folder)


def test_served_masks():
    assert served_mask("item_causal") is MaskMode.ITEM_CAUSAL
    with pytest.raises(ConfigError, match="prefill_mask must be one of"):
        served_mask(MaskMode.SEGMENT_BIDIRECTIONAL)
