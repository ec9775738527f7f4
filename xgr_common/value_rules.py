"""The value rules of a search's inputs, as one table.

Shapes and dtypes are checked on the host before any work; these rules are on values, so they
are computed on the device (``torch_engine.reference.input_rules``, one Triton launch on
CUDA) into a flag vector of ``len(VALUE_RULES)`` int64 entries, one per rule in this order,
and read once per batch. Every reader takes the rules from here: the engine's verdict (which
rule broke, in this order), the exported program (which sanitises by them), and the calling
contract written into an engine package (``rules:`` lines a C++ runtime can read).

Pure Python: no torch, no TF.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ValueRule:
    """One rule. name: a stable identifier (the package contract names rules by it);
    argument: the input it constrains; text: the rule as stated to a caller; reduction:
    how its flag is computed over a batch: ``any`` (non-zero when some row breaks it) or
    ``max`` (the largest value, compared with a limit only the engine knows)."""

    name: str
    argument: str
    text: str
    reduction: str = "any"


VALUE_RULES: tuple[ValueRule, ...] = (
    ValueRule("lengths_positive", "lengths", "lengths must be >= 1 (empty history)"),
    ValueRule("lengths_fit", "lengths", "lengths must be <= token_ids.shape[1]"),
    ValueRule("token_range", "token_ids",
              "token_ids must lie in [0, vocab_size) within each length"),
    ValueRule("segment_order", "segment_ids",
              "segment_ids must be >= 0 and non-decreasing along each row within its length"),
    ValueRule("exclusion_ids", "exclude_items",
              "exclude_items must hold item ids >= 0 or -1 as padding"),
    ValueRule("positions", "lengths",
              "prompt plus generated codes (soft tokens + max(lengths) + levels - 1 "
              "positions) must not exceed the model's max_position", reduction="max"),
)

FLAG_COUNT = len(VALUE_RULES)
FLAG_INDEX: dict[str, int] = {rule.name: index for index, rule in enumerate(VALUE_RULES)}


def contract_lines() -> list[str]:
    """The rules as ``rules:`` lines of an engine package's calling contract, in flag order:
    ``rule <name> <argument> <reduction>: <text>``."""
    return [f"rule {r.name} {r.argument} {r.reduction}: {r.text}" for r in VALUE_RULES]
