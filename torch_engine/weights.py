"""Hugging Face checkpoint I/O: ``config.json`` plus ``*.safetensors`` (single file or sharded).

Names are Hugging Face's own (``Model`` mirrors them), so loading is a strict state-dict load:
a missing or unexpected tensor, or a shape mismatch, raises ``ConfigError`` naming it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors.torch import load_file, save_file

from torch_engine.config import ModelConfig
from xgr_common.errors import ConfigError, require

if TYPE_CHECKING:
    from torch_engine.model import Model

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def _shard_files(directory: Path) -> list[Path]:
    """The safetensors files of a checkpoint directory, from its index when sharded."""
    index = directory / INDEX_FILE
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        return [directory / name for name in sorted(set(weight_map.values()))]
    single = directory / SINGLE_FILE
    require(single.exists(), ConfigError,
            f"{directory} holds neither {SINGLE_FILE} nor {INDEX_FILE}")
    return [single]


def load_pretrained(cls: type["Model"], path: str | Path, dtype: torch.dtype | None = None,
                    device: torch.device | str | None = None) -> "Model":
    """Build ``cls`` from a Hugging Face directory; dtype defaults to the checkpoint's."""
    directory = Path(path)
    config_file = directory / "config.json"
    require(config_file.exists(), ConfigError, f"{directory} has no config.json")
    config = ModelConfig.from_hf_dict(json.loads(config_file.read_text()))
    state: dict[str, torch.Tensor] = {}
    for shard in _shard_files(directory):
        state.update(load_file(str(shard), device="cpu"))
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)  # some exports store the tied copy anyway
    with torch.device("meta"):
        model = cls(config)
    expected = {name: p.shape for name, p in model.state_dict().items()}
    if config.tie_word_embeddings:
        expected.pop("lm_head.weight", None)
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected) - {"model.rotary_emb.inv_freq"})
    require(not missing and not unexpected, ConfigError,
            f"checkpoint {directory} does not match {config.architecture}: missing "
            f"{missing[:5]}{'...' if len(missing) > 5 else ''}, unexpected "
            f"{unexpected[:5]}{'...' if len(unexpected) > 5 else ''}")
    for name, shape in expected.items():
        require(tuple(state[name].shape) == tuple(shape), ConfigError,
                f"checkpoint tensor {name} has shape {tuple(state[name].shape)}, "
                f"config expects {tuple(shape)}")
    state = {k: v for k, v in state.items() if k in expected}
    model.load_state_dict(state, strict=False, assign=True)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    target = dtype or next(iter(state.values())).dtype
    return model.to(device=device, dtype=target).eval()


def save_pretrained(model: "Model", path: str | Path, max_shard_bytes: int | None = None) -> None:
    """Write ``config.json`` and the weights; shards of at most ``max_shard_bytes`` with an
    index file when given (a single tensor larger than the limit gets a shard of its own)."""
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    hf = model.config.to_hf_dict()
    hf["torch_dtype"] = str(next(model.parameters()).dtype).replace("torch.", "")
    (directory / "config.json").write_text(json.dumps(hf, indent=2))
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight")  # safetensors refuses shared storage; HF re-ties on load
    if max_shard_bytes is None:
        save_file(state, str(directory / SINGLE_FILE), metadata={"format": "pt"})
        return
    require(max_shard_bytes > 0, ConfigError, f"max_shard_bytes must be > 0, got {max_shard_bytes}")
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in state.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    weight_map = {}
    for i, shard in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(directory / name), metadata={"format": "pt"})
        weight_map.update({key: name for key in shard})
    total = sum(t.numel() * t.element_size() for t in state.values())
    (directory / INDEX_FILE).write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
