"""Fit a decoder and its profile tower on semantic-ID prompts by next-token cross entropy.

Torch only. The prompts come in as tensors (``TrainingExamples``), produced by whoever owns the
feature processing (the TF feature graph in ``xgr_world.default_model``), so training sees exactly
the prompts that serving sees.

One training example is a request's prompt followed by the item the user took next::

    [S soft vectors] BOS PROFILE_START ctx | ITEM_START c0 c1 c2 | ... | ITEM_START  t0 t1 (t2)
    <- profile tower ->  <------------------- prompt (item-causal mask) ------------>  <-target->

The loss is the cross entropy of the ``levels`` target codes, predicted at the trailing
ITEM_START and at t0 .. t(levels-2), over the full vocabulary. The prompt keeps the item-causal
mask the engine's prefill uses (a history item's tokens see each other); the target tokens get
one segment each, which makes the item-causal rule ``seg[k] <= seg[q]`` causal among them, as
decoding is: a decoded code sees everything before it and itself, never a later code.

The profile tower mirrors ``tf_frontend``'s Keras stages and keeps Keras' weight layout
(kernel ``[in, out]``), so ``ProfileTower.keras_weights`` loads into the TF graph unchanged.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from torch_engine.attention import padded_attention
from torch_engine.layers import rotary_cos_sin
from torch_engine.model import Model
from torch_engine.search import place_soft_vectors
from xgr_common.errors import ConfigError, InvalidInputError, require
from xgr_common.layout import PAD_SEGMENT, MaskMode, TokenLayout
from xgr_common.prompt_spec import PromptSpec


OBJECTIVES = ("next_item", "all_codes")


@dataclass(frozen=True)
class TrainConfig:
    """Optimiser and schedule of one fit. ``steps`` batches of ``batch_size`` examples."""

    steps: int = 1500
    batch_size: int = 64
    learning_rate: float = 3e-3
    weight_decay: float = 0.01
    warmup_steps: int = 50
    grad_clip: float = 1.0
    seed: int = 0
    mask_mode: MaskMode = MaskMode.ITEM_CAUSAL
    objective: str = "next_item"          # or "all_codes" (causal mask only); see code_loss

    def __post_init__(self) -> None:
        require(self.steps >= 1, ConfigError, f"steps must be >= 1, got {self.steps}")
        require(self.batch_size >= 1, ConfigError,
                f"batch_size must be >= 1, got {self.batch_size}")
        require(self.learning_rate > 0, ConfigError,
                f"learning_rate must be > 0, got {self.learning_rate}")
        require(0 <= self.warmup_steps < self.steps or self.steps == 1, ConfigError,
                f"warmup_steps must be in [0, steps={self.steps}), got {self.warmup_steps}")
        require(self.objective in OBJECTIVES, ConfigError,
                f"objective must be one of {OBJECTIVES}, got {self.objective!r}")
        require(self.objective == "next_item" or MaskMode(self.mask_mode) is MaskMode.CAUSAL,
                ConfigError, "the all_codes objective needs mask_mode CAUSAL: under the "
                "item-causal mask a history item's first tokens see its later codes")


@dataclass(frozen=True)
class TrainingExamples:
    """N prompts (right-padded) and the item each one should produce.

    token_ids: ``[N, L]`` int64; lengths: ``[N]`` int64 in ``[1, L]``; segment_ids: ``[N, L]``
    int32 (``PAD_SEGMENT`` past each length); profile_ids: ``[N, 2]`` int64 rows of the sparse
    table; target_codes: ``[N, levels]`` int64, the next item's code path.
    """

    token_ids: torch.Tensor
    lengths: torch.Tensor
    segment_ids: torch.Tensor
    profile_ids: torch.Tensor
    target_codes: torch.Tensor

    def __post_init__(self) -> None:
        n = self.token_ids.shape[0]
        require(self.token_ids.dim() == 2 and self.segment_ids.shape == self.token_ids.shape,
                InvalidInputError, "token_ids and segment_ids must both be [N, L], got "
                f"{tuple(self.token_ids.shape)} and {tuple(self.segment_ids.shape)}")
        for name in ("lengths", "profile_ids", "target_codes"):
            value = getattr(self, name)
            require(value.shape[0] == n, InvalidInputError,
                    f"{name} must have N={n} rows, got shape {tuple(value.shape)}")
        require(self.profile_ids.dim() == 2 and self.profile_ids.shape[1] == 2,
                InvalidInputError, f"profile_ids must be [N, 2], got {tuple(self.profile_ids.shape)}")
        require(n > 0 and bool(((self.lengths >= 1) & (self.lengths <= self.token_ids.shape[1])).all()),
                InvalidInputError, f"lengths must lie in [1, L={self.token_ids.shape[1]}] (N > 0)")

    def __len__(self) -> int:
        return self.token_ids.shape[0]

    def select(self, rows: torch.Tensor) -> "TrainingExamples":
        """The examples at ``rows`` (``[n]`` int64), trimmed to their longest prompt."""
        width = int(self.lengths[rows].max())
        return TrainingExamples(self.token_ids[rows, :width], self.lengths[rows],
                                self.segment_ids[rows, :width], self.profile_ids[rows],
                                self.target_codes[rows])


class ProfileTower(nn.Module):
    """Sparse table + tower, the Torch twin of the TF graph's profile stages.

    ``profile_ids [B, 2]`` int64 -> embeddings ``[B, 2, dim]`` -> concat ``[B, 2*dim]`` ->
    Dense(tower_hidden, silu) -> Dense(S*hidden) -> ``[B, S, hidden]`` float32. Parameters are
    stored as Keras stores them: table ``[buckets, dim]``, kernels ``[in, out]``, biases ``[out]``.
    """

    def __init__(self, spec: PromptSpec, seed: int = 0) -> None:
        super().__init__()
        require(spec.profile_tokens >= 1, ConfigError, "the profile tower needs profile_tokens >= 1")
        self.spec = spec
        gen = torch.Generator().manual_seed(seed)
        # Keras' defaults: uniform(-0.05, 0.05) embeddings, Glorot-uniform kernels, zero biases.
        table = (torch.rand(spec.embedding_buckets, spec.embedding_dim, generator=gen) - 0.5) * 0.1
        self.table = nn.Parameter(table)
        self.tower_kernel = nn.Parameter(_glorot(2 * spec.embedding_dim, spec.tower_hidden, gen))
        self.tower_bias = nn.Parameter(torch.zeros(spec.tower_hidden))
        out = spec.profile_tokens * spec.model_hidden
        self.projection_kernel = nn.Parameter(_glorot(spec.tower_hidden, out, gen))
        self.projection_bias = nn.Parameter(torch.zeros(out))

    def forward(self, profile_ids: torch.Tensor) -> torch.Tensor:
        require(profile_ids.dim() == 2 and profile_ids.shape[1] == 2, InvalidInputError,
                f"profile_ids must be [B, 2], got {tuple(profile_ids.shape)}")
        require(bool(((profile_ids >= 0) & (profile_ids < self.spec.embedding_buckets)).all()),
                InvalidInputError,
                f"profile_ids must lie in [0, embedding_buckets={self.spec.embedding_buckets})")
        rows = self.table[profile_ids].flatten(1)                                 # [B, 2*dim]
        hidden = torch.nn.functional.silu(rows @ self.tower_kernel + self.tower_bias)
        out = hidden @ self.projection_kernel + self.projection_bias              # [B, S*hidden]
        return out.view(-1, self.spec.profile_tokens, self.spec.model_hidden)

    def keras_weights(self) -> dict[str, np.ndarray]:
        """Float32 NumPy copies keyed by stage: the embedding table and each Dense kernel/bias."""
        names = ("table", "tower_kernel", "tower_bias", "projection_kernel", "projection_bias")
        return {name: getattr(self, name).detach().cpu().numpy().astype(np.float32) for name in names}

    def load_keras_weights(self, weights: dict[str, np.ndarray | torch.Tensor]) -> None:
        """Inverse of ``keras_weights``; shapes must match this tower's spec."""
        with torch.no_grad():
            for name, param in self.named_parameters():
                require(name in weights, InvalidInputError, f"profile tower weights lack {name!r}")
                value = torch.as_tensor(np.asarray(weights[name]), dtype=torch.float32)
                require(value.shape == param.shape, InvalidInputError,
                        f"profile tower weight {name!r} must be {tuple(param.shape)}, "
                        f"got {tuple(value.shape)}")
                param.copy_(value)


def _glorot(fan_in: int, fan_out: int, gen: torch.Generator) -> torch.Tensor:
    limit = math.sqrt(6.0 / (fan_in + fan_out))
    return (torch.rand(fan_in, fan_out, generator=gen) * 2 - 1) * limit


def teacher_forced_batch(batch: TrainingExamples, layout: TokenLayout, soft_tokens: int
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Append each row's ``levels`` target codes after its prompt.

    Returns ``tokens [B, L + levels]`` int64 (PAD past each row), ``segment_ids
    [B, S + L + levels]`` int32 (S leading profile-segment slots for the soft vectors; one new
    segment per appended code) and ``predict_at [B, levels]`` int64, the positions (soft slots
    included) whose logits predict the target codes. The last code is input to no prediction
    of the target; it is there so the all-codes objective sees a whole item.
    """
    rows, width = batch.token_ids.shape
    levels, device = layout.levels, batch.token_ids.device   # built where the batch lives
    arange = torch.arange(rows, device=device)
    tokens = torch.full((rows, width + levels), layout.pad_id, dtype=torch.int64, device=device)
    tokens[:, :width] = batch.token_ids
    segments = torch.full((rows, width + levels), PAD_SEGMENT, dtype=torch.int32, device=device)
    segments[:, :width] = batch.segment_ids
    last_segment = batch.segment_ids[arange, batch.lengths - 1]
    offsets = torch.arange(levels, device=device)
    tail = batch.lengths[:, None] + offsets[None, :]                             # [B, levels]
    tokens[arange[:, None], tail] = _level_bases(layout, device)[None, :] + batch.target_codes
    segments[arange[:, None], tail] = (last_segment[:, None] + 1 + offsets[None, :]).int()
    soft = torch.zeros(rows, soft_tokens, dtype=torch.int32, device=device)
    predict_at = soft_tokens + batch.lengths[:, None] - 1 + offsets[None, :]
    return tokens, torch.cat([soft, segments], dim=1), predict_at


def _level_bases(layout: TokenLayout, device: torch.device | str = "cpu") -> torch.Tensor:
    """``[levels]`` int64 on ``device``: the first token id of each level's codebook."""
    return torch.tensor([layout.level_range(level)[0] for level in range(layout.levels)],
                        device=device)


def final_hidden(model: Model, embeds: torch.Tensor, segment_ids: torch.Tensor,
                 mode: MaskMode) -> torch.Tensor:
    """Normalised last-layer hidden states ``[B, T, hidden]`` of right-padded rows.

    ``Model.forward`` without its LM head: training needs logits at ``levels`` positions per
    row only, and the full ``[B, T, vocab]`` logits would cost as much as the layers themselves.
    """
    positions = torch.arange(embeds.shape[1], device=embeds.device)
    cos, sin = rotary_cos_sin(positions, model.config.head_dim, model.config.rope_theta,
                              embeds.dtype)
    x = embeds
    for layer in model.model.layers:
        q, k, v = layer.project_qkv(x, cos, sin)
        x = layer.finish(x, padded_attention(q, k, v, segment_ids, mode))
    return model.model.norm(x)


def code_loss(model: Model, tower: ProfileTower | None, batch: TrainingExamples,
              layout: TokenLayout, mode: MaskMode = MaskMode.ITEM_CAUSAL,
              objective: str = "next_item") -> torch.Tensor:
    """Mean cross entropy (over the full vocabulary) of code tokens of ``batch``.

    objective "next_item": the target item's ``levels`` codes only (any mask mode).
    "all_codes": every code token of the prompt and of the target, each predicted from the
    position before it; leak-free only under the causal mask (under the item-causal one a
    history item's first tokens see its later codes).
    """
    require(objective in OBJECTIVES, ConfigError,
            f"objective must be one of {OBJECTIVES}, got {objective!r}")
    require(objective == "next_item" or MaskMode(mode) is MaskMode.CAUSAL, ConfigError,
            "the all_codes objective needs the causal mask")
    # Prompt version 2 rows hold the soft vectors' markers: the vectors take their places,
    # as the engine places them (``search.place_soft_vectors``); version 1 prepends them.
    marked = tower is not None and tower.spec.version == 2
    soft = tower.spec.profile_tokens if tower is not None and not marked else 0
    tokens, segments, predict_at = teacher_forced_batch(batch, layout, soft)
    embeds = model.embed(tokens)
    if marked:
        embeds = place_soft_vectors(embeds, tokens == layout.soft_id,
                                    tower(batch.profile_ids).to(embeds.dtype))
    elif tower is not None:
        embeds = torch.cat([tower(batch.profile_ids).to(embeds.dtype), embeds], dim=1)
    hidden = final_hidden(model, embeds, segments, mode)
    if objective == "next_item":
        rows = torch.arange(len(batch), device=hidden.device)[:, None]
        picked = hidden[rows, predict_at]                                   # [B, levels, hidden]
        labels = _level_bases(layout, hidden.device)[None, :] + batch.target_codes
    else:
        following = tokens[:, 1:]
        is_code = (following >= layout.code_base) & (following < layout.code_end)
        picked = hidden[:, soft:soft + tokens.shape[1] - 1][is_code]         # [n, hidden]
        labels = following[is_code]
    logits = (picked @ model.lm_head.weight.T).float()
    return nn.functional.cross_entropy(logits.flatten(0, -2), labels.flatten())


@dataclass(frozen=True)
class FitResult:
    """Per-step training losses and the wall time of the fit."""

    losses: tuple[float, ...]
    seconds: float

    def mean_loss(self, first: bool, window: int = 25) -> float:
        """Mean loss of the first (``first=True``) or last ``window`` steps."""
        part = self.losses[:window] if first else self.losses[-window:]
        return float(np.mean(part))


def fit(model: Model, tower: ProfileTower | None, examples: TrainingExamples,
        layout: TokenLayout, config: TrainConfig = TrainConfig(), progress: bool = True
        ) -> FitResult:
    """Train ``model`` and ``tower`` jointly in place (AdamW, warm-up then cosine decay).

    Deterministic for a given ``config.seed``: batches are drawn from a seeded generator.
    """
    params = list(model.parameters()) + (list(tower.parameters()) if tower is not None else [])
    optimiser = torch.optim.AdamW(params, lr=config.learning_rate,
                                  weight_decay=config.weight_decay, betas=(0.9, 0.98))

    def schedule(step: int) -> float:
        if step < config.warmup_steps:
            return (step + 1) / config.warmup_steps
        done = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
        return 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * done))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimiser, schedule)
    gen = torch.Generator().manual_seed(config.seed)
    model.train()
    if tower is not None:
        tower.train()
    losses: list[float] = []
    start = time.perf_counter()
    bar = tqdm(range(config.steps), desc="fit", unit="step", disable=not progress, leave=False)
    for _ in bar:
        rows = torch.randint(0, len(examples), (config.batch_size,), generator=gen)
        loss = code_loss(model, tower, examples.select(rows), layout, config.mask_mode,
                         config.objective)
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, config.grad_clip)
        optimiser.step()
        scheduler.step()
        losses.append(float(loss.detach()))
        if len(losses) % 20 == 0:
            bar.set_postfix(loss=f"{np.mean(losses[-20:]):.3f}")
    model.eval()
    if tower is not None:
        tower.eval()
    return FitResult(losses=tuple(losses), seconds=time.perf_counter() - start)
