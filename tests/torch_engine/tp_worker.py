"""One rank of ``test_tensor_parallel.py``: ``python tp_worker.py RANK WORLD PORT OUT``.

Joins a gloo process group on loopback, builds the tiny model (seeded: every rank the same),
keeps its slice (``torch_engine.tensor_parallel.shard_model``), and writes the logits of a
fixed batch and the items of ``Engine.recommend`` on it to ``OUT`` (torch.save)."""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

from tests.torch_engine.engine_worlds import small_world
from torch_engine.catalog import Catalog
from torch_engine.config import EngineConfig
from torch_engine.engine import Engine
from torch_engine.model import Model
from torch_engine.tensor_parallel import shard_model


def inputs():
    gen = torch.Generator().manual_seed(7)
    tokens = torch.randint(300, 600, (3, 20), generator=gen)
    lengths = torch.tensor([20, 13, 7])
    segments = (torch.arange(20) // 4).int().repeat(3, 1)
    return tokens, lengths, segments


def results(model: Model) -> dict:
    tokens, lengths, segments = inputs()
    ids, codes = small_world()
    engine = Engine(model, Catalog.from_arrays(ids, codes), EngineConfig())
    with torch.no_grad():
        logits = model(tokens, segment_ids=segments)
        items, scores = engine.recommend(tokens, lengths, segments, beam_width=8, top_k=6)
    return {"logits": logits, "items": items, "scores": scores}


def main(rank: int, world: int, port: int, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        shard = shard_model(Model.from_preset("tiny", seed=0), rank, world)
        torch.save({"rank": rank, "heads": shard.config.num_heads, **results(shard)}, out)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
