"""A hand-written Torch twin of ``ranker_module.RankerModule.pool`` (plan module
``ranker_twins:RaggedMeanPool``).

The converted ``pool`` holds ``Unique`` and ``NonZero`` (sizes that depend on the data), which
AOTInductor cannot compile; ``searchsorted`` + ``index_add`` keep every size a function of the
input sizes, so this twin exports and serves inside a SavedModel.
"""

from __future__ import annotations

import numpy as np
import torch


class RaggedMeanPool(torch.nn.Module):
    """item_ids int64 [E] (ids into the table), row_splits int64 [B + 1] -> float32 [B, D]:
    the mean of each row's embeddings (0 for an empty row)."""

    def __init__(self, table: np.ndarray):
        super().__init__()
        self.table = torch.nn.Parameter(torch.from_numpy(np.array(table, np.float32)))
        self.id_bounds = {0: int(self.table.shape[0])}   # item_ids index the table

    @classmethod
    def from_keras_layer(cls, layer):   # layer: FunctionStage of RankerModule.pool
        table = next(v for v in layer.function.variables if v.shape.rank == 2)
        return cls(table.numpy())

    def forward(self, item_ids: torch.Tensor, row_splits: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(item_ids.shape[0], device=item_ids.device)
        segments = torch.searchsorted(row_splits[1:], positions, right=True)
        summed = torch.zeros(row_splits.shape[0] - 1, self.table.shape[1],
                             dtype=self.table.dtype, device=item_ids.device)
        summed = summed.index_add(0, segments, self.table[item_ids])
        counts = (row_splits[1:] - row_splits[:-1]).to(self.table.dtype).clamp(min=1.0)
        return summed / counts[:, None]
