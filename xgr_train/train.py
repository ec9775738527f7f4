"""``xgr train``: fine-tune a team's checkpoint on its behaviour log to predict each user's
next item's semantic ID, with the profile tower of its feature graph trained beside it.

What goes in is what ``xgr export`` takes, plus the log: the checkpoint (a Hugging Face
Qwen2/Qwen3 folder whose vocabulary holds the token layout, with its ``xgr_model.json``:
``xgr extend_vocab``), the catalog file, optionally the feature graph's trained weights to
start from, and the log (``xgr_train.logs``). Each user's last ``examples_per_user`` events
become requests; the feature graph (the TF graph the SavedModel serves) turns them into
prompts; the model learns the target item's codes by cross entropy under the card's prefill
mask (``xgr_world.train.code_loss``, the demo's objective), the tower its soft vectors.

The loop runs on Hugging Face's tools: ``accelerate`` for the device, mixed precision
(``bf16`` / ``fp16``), checkpoints every ``checkpoint_every`` steps and resuming from the
last one; ``transformers``' warm-up and cosine schedule; ``peft``'s LoRA adapters (rank
``lora_rank``) on the attention and MLP projections instead of a full fine-tune, with the
embeddings and LM head (the layout's new rows) trained in full. What comes out is ready for
``xgr export``: ``OUT/model`` (the checkpoint, adapters merged, with the input's tokenizer
and card), ``OUT/tower.safetensors`` (the feature graph's weights in Keras layout), a report
with the loss curve, and its plot.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

# The engine and the bridge before TensorFlow: they load Triton first (xgr_common.import_order).
from bridge import to_torch  # noqa: F401  (the import order, see above)
import torch

from torch_engine.model import Model
from xgr_checkpoint.catalog_file import read_catalog
from xgr_common.errors import ConfigError, require
from xgr_common.model_card import MODEL_CARD_FILE, ModelCard
from xgr_train.examples import examples_of
from xgr_train.logs import last_events, read_logs, requests_at, user_split
from xgr_world.default_model import catalog_feature_graph
from xgr_world.train import OBJECTIVES, ProfileTower, code_loss

PRECISIONS = ("no", "bf16", "fp16")
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "config.json")


@dataclass(frozen=True)
class FineTuneConfig:
    """One fine-tune. ``out`` receives the model, the tower, the report and the checkpoints;
    a run into a folder that holds checkpoints resumes from the last one.

    holdout: a share of the users (those ``xgr evaluate --split users`` holds out with the
        same ``seed``) kept out of training; train_before: only the events before this unix
        time are trained on (``xgr evaluate --split time`` tests what follows).
    max_train_seconds: stop the steps after this long (0: no limit), with a checkpoint, so
        a run that must fit a fixed window ends cleanly and a rerun into ``out`` goes on
        from there; the model written is the one trained so far.
    """

    model: str
    catalog: str
    logs: str
    out: str
    feature_graph: str | None = None
    steps: int = 1000
    batch_size: int = 32
    learning_rate: float = 1e-4
    tower_learning_rate: float = 3e-3
    weight_decay: float = 0.01
    warmup_steps: int = 50
    grad_clip: float = 1.0
    seed: int = 0
    examples_per_user: int = 8
    holdout: float = 0.0
    train_before: int | None = None
    mixed_precision: str = "no"
    lora_rank: int = 0
    lora_alpha: int = 16
    checkpoint_every: int = 200
    device: str = "auto"
    objective: str = "next_item"
    max_train_seconds: float = 0.0

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "examples_per_user", "checkpoint_every"):
            value = getattr(self, name)
            require(isinstance(value, int) and value >= 1, ConfigError,
                    f"FineTuneConfig.{name} must be a positive int, got {value!r}")
        require(0 <= self.warmup_steps < self.steps, ConfigError,
                f"FineTuneConfig.warmup_steps must be in [0, steps={self.steps}), got "
                f"{self.warmup_steps!r}")
        for name in ("learning_rate", "tower_learning_rate"):
            require(getattr(self, name) > 0, ConfigError,
                    f"FineTuneConfig.{name} must be > 0, got {getattr(self, name)!r}")
        require(0 <= self.holdout < 1, ConfigError,
                f"FineTuneConfig.holdout must be in [0, 1), got {self.holdout!r}")
        require(self.mixed_precision in PRECISIONS, ConfigError,
                f"FineTuneConfig.mixed_precision must be one of {PRECISIONS}, got "
                f"{self.mixed_precision!r}")
        require(isinstance(self.lora_rank, int) and self.lora_rank >= 0, ConfigError,
                f"FineTuneConfig.lora_rank must be an int >= 0 (0: a full fine-tune), got "
                f"{self.lora_rank!r}")
        require(self.device in ("auto", "cpu", "cuda"), ConfigError,
                f"FineTuneConfig.device must be auto, cpu or cuda, got {self.device!r}")
        require(self.max_train_seconds >= 0, ConfigError,
                f"FineTuneConfig.max_train_seconds must be >= 0 (0: no limit), got "
                f"{self.max_train_seconds!r}")
        require(self.objective in OBJECTIVES, ConfigError,
                f"FineTuneConfig.objective must be one of {OBJECTIVES}, got "
                f"{self.objective!r}")


@dataclass(frozen=True)
class FineTuneReport:
    """What a fine-tune did: its examples (requests from how many users, events dropped for
    items outside the catalog), the loss of every step, the wall time and where its files
    are."""

    out: str
    model: str
    feature_graph: str
    examples: int
    users: int
    dropped_events: int
    losses: tuple[float, ...]
    resumed_from: int
    seconds: float
    steps_per_second: float
    device: str
    mixed_precision: str
    lora_rank: int
    plot: str
    stopped_at_time_limit: bool = False  # max_train_seconds ended it before `steps`

    def to_json(self) -> dict:
        return {**asdict(self), "losses": list(self.losses)}


class _Progress:
    """The step and the losses so far: saved with each checkpoint, so a resumed run goes on
    from there and keeps the whole loss curve."""

    def __init__(self) -> None:
        self.step, self.losses = 0, []

    def state_dict(self) -> dict:
        return {"step": self.step, "losses": list(self.losses)}

    def load_state_dict(self, state: dict) -> None:
        self.step, self.losses = int(state["step"]), list(state["losses"])


def fine_tune(config: FineTuneConfig, progress: bool = True) -> FineTuneReport:
    """Runs ``config``'s fine-tune (see the module docstring); files under ``config.out``."""
    from accelerate import Accelerator
    from accelerate.utils import set_seed
    from safetensors.numpy import load_file, save_file
    from transformers import get_cosine_schedule_with_warmup

    started = time.perf_counter()
    out = Path(config.out)
    card = ModelCard.read(config.model)
    spec, layout = card.spec, card.spec.layout
    catalog = read_catalog(config.catalog, layout.levels, layout.codebook_size)
    log = read_logs(config.logs)
    known = np.isin(log.items, catalog.item_ids)
    if config.train_before is not None:
        known &= log.times < config.train_before
    dropped = int(np.count_nonzero(~np.isin(log.items, catalog.item_ids)))
    log = log.keep(known)
    users = (user_split(log, config.holdout, config.seed)[0] if config.holdout
             else np.arange(len(log.users)))
    requests = requests_at(log, *last_events(log, users, config.examples_per_user))
    tower = ProfileTower(spec, seed=config.seed)
    if config.feature_graph is not None:
        tower.load_keras_weights(load_file(str(config.feature_graph)))
    graph = catalog_feature_graph(spec, catalog.item_ids, catalog.item_codes,
                                  tower.keras_weights())
    examples = examples_of(graph, requests, catalog.item_ids, catalog.item_codes,
                           layout.pad_id, progress)

    accelerator = Accelerator(mixed_precision=config.mixed_precision,
                              cpu=config.device == "cpu", project_dir=str(out))
    require(config.device != "cuda" or accelerator.device.type == "cuda", ConfigError,
            "FineTuneConfig.device is cuda but no GPU is visible")
    set_seed(config.seed)
    model = Model.from_pretrained(config.model, dtype=torch.float32)
    require(model.config.hidden_size == spec.model_hidden, ConfigError,
            f"{config.model} has hidden size {model.config.hidden_size}, its card's profile "
            f"tower emits {spec.model_hidden}")
    if config.lora_rank:
        _add_lora(model, config)
    groups = [{"params": [p for p in model.parameters() if p.requires_grad],
               "lr": config.learning_rate},
              {"params": list(tower.parameters()), "lr": config.tower_learning_rate}]
    optimiser = torch.optim.AdamW(groups, weight_decay=config.weight_decay, betas=(0.9, 0.98))
    schedule = get_cosine_schedule_with_warmup(optimiser, config.warmup_steps, config.steps)
    model, tower, optimiser, schedule = accelerator.prepare(model, tower, optimiser, schedule)
    state = _Progress()
    accelerator.register_for_checkpointing(state)
    checkpoints = out / "checkpoints"
    last = _last_checkpoint(checkpoints)
    if last is not None:
        accelerator.load_state(str(last))
    resumed_from = state.step
    trained = [p for group in optimiser.param_groups for p in group["params"]]
    model.train()
    tower.train()
    bar = _bar(config.steps, resumed_from, progress)
    steps_started = time.perf_counter()
    while state.step < config.steps:
        # Each step's rows from a generator seeded by the step: a resumed run draws the
        # batches the uninterrupted one would have.
        gen = torch.Generator().manual_seed(config.seed * 1_000_003 + state.step)
        rows = torch.randint(0, len(examples), (config.batch_size,), generator=gen)
        batch = _to(examples.select(rows), accelerator.device)
        with accelerator.autocast():
            loss = code_loss(model, tower, batch, layout, card.prefill_mask, config.objective)
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(trained, config.grad_clip)
        optimiser.step()
        schedule.step()
        optimiser.zero_grad(set_to_none=True)
        state.losses.append(float(loss.detach()))
        state.step += 1
        bar.update(1)
        if state.step % 20 == 0:
            bar.set_postfix(loss=f"{np.mean(state.losses[-20:]):.3f}")
        out_of_time = (config.max_train_seconds > 0 and state.step < config.steps and
                       time.perf_counter() - steps_started >= config.max_train_seconds)
        if (state.step % config.checkpoint_every == 0 or state.step == config.steps
                or out_of_time):
            accelerator.save_state(str(checkpoints / f"step_{state.step:08d}"))
            _keep_last(checkpoints)
        if out_of_time:
            break
    bar.close()
    steps_done = state.step - resumed_from
    per_second = steps_done / max(time.perf_counter() - steps_started, 1e-9)
    model = accelerator.unwrap_model(model)
    tower = accelerator.unwrap_model(tower)
    model_dir = _save_model(model, config, out / "model")
    save_file(tower.keras_weights(), str(out / "tower.safetensors"))
    plot = _plot_losses(state.losses, out / "loss.png")
    report = FineTuneReport(
        out=str(out), model=str(model_dir), feature_graph=str(out / "tower.safetensors"),
        examples=len(examples), users=len(users), dropped_events=dropped,
        losses=tuple(state.losses), resumed_from=resumed_from,
        seconds=time.perf_counter() - started, steps_per_second=per_second,
        device=str(accelerator.device), mixed_precision=config.mixed_precision,
        lora_rank=config.lora_rank, plot=str(plot),
        stopped_at_time_limit=state.step < config.steps)
    (out / "train_report.json").write_text(json.dumps(
        {"config": asdict(config), **report.to_json()}, indent=1) + "\n")
    return report


def _add_lora(model: Model, config: FineTuneConfig) -> None:
    """LoRA adapters on the projections (``peft``), injected in place so the model keeps its
    own forward; everything else frozen but the embeddings and the LM head, whose rows of
    the token layout's codes must learn."""
    from peft import LoraConfig, inject_adapter_in_model

    for param in model.parameters():
        param.requires_grad_(False)
    inject_adapter_in_model(LoraConfig(r=config.lora_rank, lora_alpha=config.lora_alpha,
                                       target_modules=list(LORA_TARGETS), lora_dropout=0.0),
                            model)
    for param in (*model.model.embed_tokens.parameters(), *model.lm_head.parameters()):
        param.requires_grad_(True)


def _merged_state(model: Model) -> dict[str, torch.Tensor]:
    """The model's weights with LoRA adapters folded into the projections they adapt
    (W + scale * B A), under the checkpoint's own names."""
    from peft.tuners.lora import LoraLayer

    state = {}
    adapted = {name: module for name, module in model.named_modules()
               if isinstance(module, LoraLayer)}
    for name, module in adapted.items():
        module.merge()
        state[f"{name}.weight"] = module.get_base_layer().weight.detach().clone()
        if module.get_base_layer().bias is not None:
            state[f"{name}.bias"] = module.get_base_layer().bias.detach().clone()
    for key, value in model.state_dict().items():
        if "lora_" in key or ".base_layer." in key:
            continue
        state.setdefault(key, value.detach().clone())
    return state


def _save_model(model: Model, config: FineTuneConfig, target: Path) -> Path:
    """The fine-tuned checkpoint in Hugging Face's layout, with the input folder's tokenizer
    and card beside it (what ``xgr export --model`` takes)."""
    if config.lora_rank:
        plain = Model(model.config)
        plain.load_state_dict(_merged_state(model), strict=False)
        model = plain
    if target.exists():
        shutil.rmtree(target)
    model.eval().save_pretrained(target)
    source = Path(config.model)
    for path in source.iterdir():
        if path.is_file() and path.name not in WEIGHT_FILES and not path.name.startswith(
                "model-") and path.suffix != ".safetensors":
            shutil.copy2(path, target / path.name)
    require((target / MODEL_CARD_FILE).exists(), ConfigError,
            f"{source} has no {MODEL_CARD_FILE}: write it with `xgr extend_vocab`")
    return target


def _to(batch, device: torch.device):
    from xgr_world.train import TrainingExamples

    return TrainingExamples(*(getattr(batch, name).to(device) for name in (
        "token_ids", "lengths", "segment_ids", "profile_ids", "target_codes")))


def _last_checkpoint(folder: Path) -> Path | None:
    found = sorted(folder.glob("step_*")) if folder.exists() else []
    return found[-1] if found else None


def _keep_last(folder: Path, keep: int = 2) -> None:
    for old in sorted(folder.glob("step_*"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def _bar(total: int, done: int, progress: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=done, desc="train", unit="step", disable=not progress)


def _plot_losses(losses: list[float], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 3.5))
    steps = np.arange(1, len(losses) + 1)
    axis.plot(steps, losses, lw=0.6, alpha=0.4, label="step")
    if len(losses) >= 20:
        window = max(5, len(losses) // 50)
        smooth = np.convolve(losses, np.ones(window) / window, mode="valid")
        axis.plot(steps[window - 1:], smooth, lw=1.5, label=f"mean of {window}")
    axis.set_xlabel("step")
    axis.set_ylabel("cross entropy of the next item's codes")
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path

