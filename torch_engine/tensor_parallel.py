"""Tensor parallelism for a model that does not fit the latency budget on one GPU: each of
``world`` ranks holds a slice of every layer's heads and MLP columns, and the engine runs the
whole search on every rank over its slice.

Megatron's split of a layer: the query, key and value projections and the gate and up
projections are column-parallel (each rank computes its heads / its MLP columns from the full
input, no communication); the output and down projections are row-parallel (each rank
multiplies its slice, then one all-reduce sums the slices: one all-reduce per block half).
Embeddings, norms and the LM head stay whole on every rank, so each rank computes the same
logits and the same beam search, and each returns the same items. The attention kernels run
unchanged on each rank's heads (the group of query heads per KV head is the model's).

``shard_model(model, rank, world, group)`` gives rank ``rank``'s model: a ``Model`` whose
config holds its share of the heads and columns. Run it in ``torch.distributed`` worker
processes (NCCL on GPUs, gloo on CPUs), one per rank, each with its own ``Engine``; the layer
kernels that fold the output projection into one launch are left off (the all-reduce must sit
between the product and the residual add).
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from torch_engine.model import Model
from xgr_common.errors import ConfigError, require


class RowParallelLinear(nn.Linear):
    """``nn.Linear`` over this rank's slice of the input features; the slices' products are
    summed across ``group`` (one all-reduce), the bias added once after."""

    reduces = True   # the layer kernels that skip this module's forward are left off

    def __init__(self, in_features: int, out_features: int, bias: bool, group) -> None:
        super().__init__(in_features, out_features, bias=bias)
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.linear(x, self.weight)
        dist.all_reduce(out, group=self.group)
        return out if self.bias is None else out + self.bias


def shard_config(config, world: int):
    """The config of one rank's slice: ``1 / world`` of the query and KV heads and of the MLP
    columns (each must divide evenly)."""
    require(isinstance(world, int) and world >= 1, ConfigError,
            f"tensor-parallel world must be a positive int, got {world!r}")
    for name in ("num_heads", "num_kv_heads", "intermediate_size"):
        require(getattr(config, name) % world == 0, ConfigError,
                f"tensor parallelism over {world} ranks needs ModelConfig.{name} "
                f"({getattr(config, name)}) divisible by {world}")
    return replace(config, num_heads=config.num_heads // world,
                   num_kv_heads=config.num_kv_heads // world,
                   intermediate_size=config.intermediate_size // world)


def _rows(weight: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    size = weight.shape[0] // world
    return weight[rank * size:(rank + 1) * size]


def _columns(weight: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    size = weight.shape[1] // world
    return weight[:, rank * size:(rank + 1) * size]


def shard_model(model: Model, rank: int, world: int, group=None) -> Model:
    """Rank ``rank``'s slice of ``model`` (left unchanged), on its device and dtype; the
    row-parallel projections all-reduce over ``group`` (default: the whole world)."""
    require(0 <= rank < world, ConfigError, f"rank {rank} must lie in [0, {world})")
    config = shard_config(model.config, world)
    param = next(model.parameters())
    with torch.device("meta"):
        shard = Model(config)
    shard = shard.to_empty(device=param.device).to(param.dtype)
    with torch.no_grad():
        shard.model.embed_tokens.weight.copy_(model.model.embed_tokens.weight)
        shard.model.norm.weight.copy_(model.model.norm.weight)
        if not config.tie_word_embeddings:
            shard.lm_head.weight.copy_(model.lm_head.weight)
        for whole, part in zip(model.model.layers, shard.model.layers):
            for name in ("q_proj", "k_proj", "v_proj"):
                source, target = getattr(whole.self_attn, name), getattr(part.self_attn, name)
                target.weight.copy_(_rows(source.weight, rank, world))
                if source.bias is not None:
                    target.bias.copy_(_rows(source.bias, rank, world))
            for name in ("gate_proj", "up_proj"):
                getattr(part.mlp, name).weight.copy_(
                    _rows(getattr(whole.mlp, name).weight, rank, world))
            for norm in ("input_layernorm", "post_attention_layernorm"):
                getattr(part, norm).weight.copy_(getattr(whole, norm).weight)
            if config.qk_norm:
                part.self_attn.q_norm.weight.copy_(whole.self_attn.q_norm.weight)
                part.self_attn.k_norm.weight.copy_(whole.self_attn.k_norm.weight)
            part.self_attn.o_proj = _row_parallel(whole.self_attn.o_proj, rank, world, group)
            part.mlp.down_proj = _row_parallel(whole.mlp.down_proj, rank, world, group)
    if config.tie_word_embeddings:
        shard.lm_head.weight = shard.model.embed_tokens.weight
    return shard.eval()


def _row_parallel(linear: nn.Linear, rank: int, world: int, group) -> RowParallelLinear:
    out = RowParallelLinear(linear.in_features // world, linear.out_features,
                            linear.bias is not None, group)
    out = out.to(device=linear.weight.device, dtype=linear.weight.dtype)
    with torch.no_grad():
        out.weight.copy_(_columns(linear.weight, rank, world))
        if linear.bias is not None:
            out.bias.copy_(linear.bias)
    return out
