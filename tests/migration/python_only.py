"""A Torch stage that only Python can run (plan module ``python_only:NumpyInteraction``): its
``forward`` leaves torch for NumPy, so ``torch.export`` cannot trace it and a served export
must refuse it by name."""

from __future__ import annotations

import numpy as np
import torch


class NumpyInteraction(torch.nn.Module):
    """The FM interaction [B, F, D] -> [B, 1], computed in NumPy."""

    def forward(self, v: torch.Tensor) -> torch.Tensor:
        x = v.detach().numpy()
        pairs = 0.5 * ((x.sum(1) ** 2) - (x ** 2).sum(1)).sum(1, keepdims=True)
        return torch.from_numpy(np.ascontiguousarray(pairs, np.float32))
