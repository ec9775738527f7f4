"""Keras masks cross the bridge with their tensors both ways, a move that would lose one is
refused with the reason, and parity compares masks."""

from __future__ import annotations

import ctr_keras3
import pytest
import torch
from torch import nn

from bridge.migration.auto import auto_migrate
from bridge.migration.plan import MigrationPlan, StagePlan
from bridge.parity.pytest_helper import check_parity

FACTORY = "ctr_keras3:attention_history"
TWINS = "bridge.migration.keras_twins"


class PoolingWithoutMask(nn.Module):
    """A hand-written attention pooling whose forward has no ``mask``: it cannot stand in for
    a layer that reads masks."""

    def forward(self, keys, query):
        return keys.mean(1)


class WrongMaskEmbedding(nn.Module):
    """An embedding twin that marks every position as real (the padding mask is wrong)."""

    returns_mask = True

    def __init__(self, table):
        super().__init__()
        self.table = table

    @classmethod
    def from_keras_layer(cls, layer):
        return cls(torch.from_numpy(layer.embeddings.numpy()))

    def forward(self, ids):
        return self.table[ids.long()], torch.ones_like(ids, dtype=torch.bool)


class MaskedMeanPooling(nn.Module):
    """Takes the masks (``forward(..., mask=)``) and uses them: a masked mean of the keys."""

    def forward(self, keys, query, mask=None):
        weights = mask[0].float()[..., None]
        return (keys * weights).sum(1) / weights.sum(1)


def batches(lengths=(6, 9)):
    return ctr_keras3.history_batches(len(lengths), lengths=lengths)


def test_twin_returns_the_embedding_mask_and_parity_compares_it():
    plan = MigrationPlan(FACTORY, (StagePlan("item_embedding", "torch",
                                             module=f"{TWINS}:Embedding"),))
    result = check_parity(plan, batches())
    assert result.passed, result.summary()
    mask_row = next(r for r in result.rows if r.stage == "item_embedding"
                    and r.output == "output.mask")
    assert mask_row.dtype == "bool" and mask_row.passed


def test_a_wrong_mask_fails_parity_at_its_stage():
    plan = MigrationPlan(FACTORY, (StagePlan("item_embedding", "torch",
                                             module="test_masks:WrongMaskEmbedding"),))
    result = check_parity(plan, batches())
    failure = result.first_failure
    assert (failure.stage, failure.output) == ("item_embedding", "output.mask")
    assert "elements differ" in failure.problem


def test_a_module_that_would_drop_a_mask_is_refused_with_the_reason():
    plan = MigrationPlan(FACTORY, (StagePlan("attention_pooling", "torch",
                                             module="test_masks:PoolingWithoutMask"),))
    failure = check_parity(plan, batches()).first_failure
    assert failure.stage == "attention_pooling"
    assert "carry Keras masks that the TF layer reads, but PoolingWithoutMask.forward takes " \
           "no `mask` argument: moving it would lose the mask" in failure.problem


def test_a_module_taking_masks_receives_them():
    seen = []

    class Recording(MaskedMeanPooling):
        def forward(self, keys, query, mask=None):
            seen.append(mask)
            return super().forward(keys, query, mask)
    plan = MigrationPlan(FACTORY, (StagePlan("attention_pooling", "torch",
                                             module="test_masks:MaskedMeanPooling"),))
    from bridge.migration.runner import PlanRunner
    runner = PlanRunner(plan, ".")
    runner.modules["attention_pooling"].forward = Recording().forward
    runner.run(batches((6,))[0])
    (keys_mask, query_mask), = seen
    assert keys_mask.dtype == torch.bool and tuple(keys_mask.shape) == (5, 6)
    assert tuple(query_mask.shape) == (5, 1)


@pytest.mark.heavy
def test_converted_stages_take_and_give_masks(tmp_path):
    model = ctr_keras3.attention_history()
    plan, results = auto_migrate(MigrationPlan(FACTORY), tmp_path, model,
                                 ["item_embedding", "attention_pooling"])
    by_name = {r.name: r for r in results}
    assert by_name["item_embedding"].spec.mask_outputs == (0,)
    assert by_name["attention_pooling"].spec.mask_inputs == (0, 1)
    result = check_parity(plan, batches((6, 9, 3)), plan_dir=tmp_path)
    assert result.passed, result.summary()
