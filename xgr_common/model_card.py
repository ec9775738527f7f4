"""``xgr_model.json``: what a model was trained with, kept beside its checkpoint.

Training (``xgr_world``) and the vocabulary extension (``xgr_checkpoint.vocabulary``) write it;
export reads it, so a served model gets the token layout, prompt contract, prefill mask and
soft-prompt width it learned with, never a default. ``check_checkpoint`` refuses a card that
contradicts the checkpoint's ``config.json`` or tokenizer, naming the field.

Pure Python (JSON only): the TF side reads it too. Format::

    {"format": "xgr_model", "version": 1, "architecture": "qwen2", "vocab_size": 152704,
     "hidden_size": 896, "prefill_mask": "item_causal",
     "prompt_spec": {..., "profile_tokens": 2, "layout": {"base": 151665, ...}}}
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from xgr_common.errors import ConfigError, require
from xgr_common.layout import MaskMode
from xgr_common.prompt_spec import PromptSpec

MODEL_CARD_FILE = "xgr_model.json"
FORMAT, VERSION = "xgr_model", 1
# The masks the engine's prefill runs (``bridge.pipeline.EngineSearch``).
SERVED_MASKS = (MaskMode.CAUSAL, MaskMode.ITEM_CAUSAL)
ARCHITECTURES = ("qwen2", "qwen3")
_KEYS = ("format", "version", "architecture", "vocab_size", "hidden_size", "prefill_mask",
         "prompt_spec")


@dataclass(frozen=True)
class ModelCard:
    """The training-time facts export needs.

    spec: the prompt contract (token layout, history window, profile tower sizes; its
    ``profile_tokens`` is the soft-prompt width); prefill_mask: the mask the model learned
    with (causal or item-causal); architecture, vocab_size, hidden_size: the checkpoint's, as
    its ``config.json`` states them (checked against it on read).
    """

    spec: PromptSpec
    prefill_mask: MaskMode
    architecture: str
    vocab_size: int
    hidden_size: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "prefill_mask", served_mask(self.prefill_mask))
        require(self.architecture in ARCHITECTURES, ConfigError,
                f"architecture must be one of {ARCHITECTURES}, got "
                f"{self.architecture!r}")
        for name in ("vocab_size", "hidden_size"):
            value = getattr(self, name)
            require(isinstance(value, int) and not isinstance(value, bool) and value >= 1,
                    ConfigError, f"{name} must be a positive int, got "
                                 f"{value!r}")
        layout = self.spec.layout
        require(layout.code_end <= self.vocab_size, ConfigError,
                f"prompt_spec.layout ends at id {layout.code_end} "
                f"(code_end), beyond vocab_size {self.vocab_size}")
        require(self.spec.model_hidden == self.hidden_size, ConfigError,
                f"prompt_spec.model_hidden {self.spec.model_hidden} (the "
                f"soft-prompt vector width) differs from hidden_size {self.hidden_size}")

    def to_json(self) -> dict:
        return {"format": FORMAT, "version": VERSION, "architecture": self.architecture,
                "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
                "prefill_mask": self.prefill_mask.value, "prompt_spec": self.spec.to_dict()}

    @classmethod
    def from_json(cls, data: dict, source: str = MODEL_CARD_FILE) -> "ModelCard":
        """The card of ``data``; ConfigError names ``source`` and the field at fault."""
        require(isinstance(data, dict), ConfigError, f"{source} must hold a JSON object")
        unknown = sorted(set(data) - set(_KEYS))
        missing = [key for key in _KEYS if key not in data]
        require(not missing, ConfigError, f"{source} lacks fields {missing}")
        require(not unknown, ConfigError, f"{source} has unknown fields {unknown}")
        require(data["format"] == FORMAT and data["version"] == VERSION, ConfigError,
                f"{source} is format {data['format']!r} version {data['version']!r}; this "
                f"build reads {FORMAT!r} version {VERSION}")
        try:
            spec = PromptSpec.from_dict(data["prompt_spec"])
        except ConfigError as error:
            raise ConfigError(f"{source} prompt_spec: {error}") from None
        try:
            return cls(spec=spec, prefill_mask=data["prefill_mask"],
                       architecture=data["architecture"], vocab_size=data["vocab_size"],
                       hidden_size=data["hidden_size"])
        except ConfigError as error:
            raise ConfigError(f"{source}: {error}") from None

    def write(self, directory: str | os.PathLike) -> Path:
        """Writes ``xgr_model.json`` into ``directory``; returns its path."""
        path = Path(directory) / MODEL_CARD_FILE
        path.write_text(json.dumps(self.to_json(), indent=1) + "\n")
        return path

    @classmethod
    def read(cls, directory: str | os.PathLike) -> "ModelCard":
        """The card beside a checkpoint, checked against its ``config.json`` and, when the
        checkpoint has one, its ``tokenizer.json`` (``check_checkpoint``)."""
        directory = Path(directory)
        path = directory / MODEL_CARD_FILE
        require(path.is_file(), ConfigError,
                f"{directory} has no {MODEL_CARD_FILE}: export needs the token layout, prompt "
                f"contract and prefill mask the model was trained with. Training writes it "
                f"(xgr_world), and so does `xgr extend_vocab` for a checkpoint it resizes")
        try:
            data = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ConfigError(f"{path} is not valid JSON: {error}") from None
        card = cls.from_json(data, str(path))
        check_checkpoint(card, directory)
        return card


def served_mask(value) -> MaskMode:
    """``value`` (a MaskMode or its name) as one of the masks the engine serves; ConfigError
    otherwise."""
    try:
        mask = MaskMode(value)
    except ValueError:
        mask = None
    require(mask in SERVED_MASKS, ConfigError,
            f"prefill_mask must be one of "
            f"{[m.value for m in SERVED_MASKS]} (the masks the engine serves), got {value!r}")
    return mask


def check_checkpoint(card: ModelCard, directory: str | os.PathLike) -> None:
    """Refuses a card that contradicts the checkpoint in ``directory``: its ``config.json``
    (model_type, vocab_size, hidden_size) and its ``tokenizer.json``'s added tokens (each
    layout token's name at the layout's id). ConfigError names the file and the field."""
    directory = Path(directory)
    config_path = directory / "config.json"
    require(config_path.is_file(), ConfigError, f"{directory} has no config.json")
    config = json.loads(config_path.read_text())
    stated = {"architecture": config.get("model_type"), "vocab_size": config.get("vocab_size"),
              "hidden_size": config.get("hidden_size")}
    config_key = {"architecture": "model_type"}
    for field, value in stated.items():
        require(getattr(card, field) == value, ConfigError,
                f"{directory / MODEL_CARD_FILE} {field} = {getattr(card, field)!r} contradicts "
                f"config.json {config_key.get(field, field)} = {value!r}")
    tokenizer_path = directory / "tokenizer.json"
    if tokenizer_path.is_file():
        added = {entry["content"]: entry["id"] for entry in
                 json.loads(tokenizer_path.read_text()).get("added_tokens", [])}
        layout = card.spec.layout
        for offset, name in enumerate(layout.token_names()):
            want = layout.base + offset
            require(added.get(name) == want, ConfigError,
                    f"{directory / MODEL_CARD_FILE} prompt_spec.layout puts {name} at id {want}, "
                    f"but tokenizer.json has it "
                    f"{'at id ' + str(added[name]) if name in added else 'not at all'}")
