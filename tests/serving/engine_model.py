"""A SavedModel built like an export: its answer comes from a TorchCall engine package kept as
``assets/engine.pt``, which TorchCall loads on the first call, and it carries the export's
warm-up requests (``xgr_export.warmup_requests``).

``score = scale * sum(x, axis=1)`` for ``x`` float32 [B, 4]: a client can tell from the answer
which version served it. A row whose first value is ``FAULT`` makes the engine raise (a
server fault: TorchCall's Internal error, never the caller's). ``truncate`` / ``corrupt``
break a copy's engine file the way a bad deploy does.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import tensorflow as tf
import torch

from custom_ops.torch_call import torch_call
from xgr_common.serving_names import SERVING_SIGNATURE
from xgr_export.torch_package import package_torchscript
from xgr_export.warmup_requests import write_warmup_requests

FAULT = 13.0
ENGINE_FILE = Path("assets") / "engine.pt"


class _Scale(torch.nn.Module):
    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if bool((x[:, 0] == 13.0).any()):
            raise RuntimeError("engine fault on a marked row")
        return x.sum(dim=1) * self.scale


class _EngineModel(tf.Module):
    def __init__(self, package_path: str):
        super().__init__()
        self.engine = tf.saved_model.Asset(package_path)

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
    def serve(self, x):
        (score,) = torch_call(self.engine, [x], [tf.float32], output_shapes=[[None]])
        return {"score": score}


def warmup_inputs(rows: int = 3) -> list[dict[str, np.ndarray]]:
    return [{"x": np.arange(4 * r, dtype=np.float32).reshape(r, 4)} for r in range(1, rows + 1)]


def save_engine_model(path: str | os.PathLike, scale: float) -> Path:
    """Writes the SavedModel of ``scale`` to ``path`` (which must not exist)."""
    with tempfile.TemporaryDirectory(prefix="engine_model_") as tmp:
        package = Path(tmp) / ENGINE_FILE.name
        package_torchscript(_Scale(scale), (torch.ones(2, 4),), package,
                            {(0, 0): ("batch", 1, 4096)}, script=True)
        module = _EngineModel(str(package))
        tf.saved_model.save(module, str(path),
                            signatures={SERVING_SIGNATURE: module.serve.get_concrete_function()})
    write_warmup_requests(path, warmup_inputs())
    return Path(path)


def expected_score(scale: float, x: np.ndarray) -> np.ndarray:
    return (x.sum(axis=1) * scale).astype(np.float32)


def deploy(base: Path, version: int, source: Path, damage=None) -> Path:
    """Copies ``source`` to ``base/version`` the way a deploy should: written beside, damaged
    if asked (``truncate``, ``corrupt``), then renamed into place."""
    staging = base.parent / f".staging-{version}"
    shutil.copytree(source, staging)
    if damage is not None:
        damage(staging / ENGINE_FILE)
    os.rename(staging, base / str(version))
    return base / str(version)


def truncate(path: Path) -> None:
    """Cuts the file to half its size, as an interrupted copy leaves it."""
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(size // 2)


def corrupt(path: Path) -> None:
    """Overwrites the file with random bytes of the same size."""
    size = path.stat().st_size
    path.write_bytes(np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8).tobytes())
