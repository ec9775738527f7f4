"""Tensor parallelism on two CPU processes (gloo): each rank's slice of the tiny model gives
the single-process model's logits and, through ``Engine.recommend``, its items."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.child_env import child_env
from tests.torch_engine.tp_worker import results
from torch_engine.model import Model
from torch_engine.tensor_parallel import shard_config
from xgr_common.errors import ConfigError
from xgr_common.tolerances import tolerance_for

HERE = Path(__file__).resolve().parent
FP32 = tolerance_for(torch.float32)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.heavy
def test_two_ranks_give_the_single_process_results(tmp_path):
    port, world = _free_port(), 2
    ranks = [subprocess.Popen([sys.executable, str(HERE / "tp_worker.py"), str(rank),
                               str(world), str(port), str(tmp_path / f"rank{rank}.pt")],
                              env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for rank in range(world)]
    for process in ranks:
        _, err = process.communicate(timeout=300)
        assert process.returncode == 0, err[-3000:]
    want = results(Model.from_preset("tiny", seed=0))
    for rank in range(world):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        assert got["heads"] == 2                     # half of the tiny model's 4 query heads
        torch.testing.assert_close(got["logits"], want["logits"], atol=FP32.atol,
                                   rtol=FP32.rtol)
        assert torch.equal(got["items"], want["items"])
        torch.testing.assert_close(got["scores"], want["scores"], atol=FP32.atol,
                                   rtol=FP32.rtol)


def test_a_world_that_does_not_divide_the_heads_is_refused():
    config = Model.from_preset("tiny", seed=0).config      # 4 query heads, 2 KV heads
    assert shard_config(config, 2).num_kv_heads == 1
    with pytest.raises(ConfigError, match="num_kv_heads .2. divisible by 4"):
        shard_config(config, 4)


def test_a_slice_keeps_the_fused_products_but_not_the_layer_kernels():
    """The layer kernels fold the output projection and the residual add into one launch,
    which would skip the all-reduce between them."""
    from torch_engine.tensor_parallel import shard_model

    shard = shard_model(Model.from_preset("tiny", seed=0), 0, 2)
    shard.fuse_projections(kernels=True)
    assert all(layer.fused is not None and not layer.fused.kernels
               for layer in shard.model.layers)
    whole = Model.from_preset("tiny", seed=0)
    whole.fuse_projections(kernels=True)
    assert all(layer.fused.kernels for layer in whole.model.layers)
