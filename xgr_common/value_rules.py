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

# Rules the host checks before a package runs but the device search does not flag (TorchCall
# reads them from the contract; ``Engine.recommend`` uses the soft prompt as given).
HOST_RULES: tuple[ValueRule, ...] = (
    ValueRule("finite_embeddings", "profile_embeds",
              "profile_embeds must be finite (no NaN or infinity)"),
)

FLAG_COUNT = len(VALUE_RULES)
FLAG_INDEX: dict[str, int] = {rule.name: index for index, rule in enumerate(VALUE_RULES)}


# What TorchCall needs to check each rule on the host before a package runs: the positions
# of the inputs it reads, then its limits (custom_ops/cc/torch_call/torch/value_checks.h).
RULE_PARAMETERS: dict[str, tuple[str, ...]] = {
    "lengths_positive": ("lengths",),
    "lengths_fit": ("lengths", "tokens"),
    "token_range": ("tokens", "lengths", "vocab"),
    "segment_order": ("segments", "lengths"),
    "exclusion_ids": ("exclude",),
    "positions": ("lengths", "embeds", "levels", "max_position"),
    "finite_embeddings": ("embeds",),
}


def contract_lines(parameters: dict[str, int], skip: tuple[str, ...] = (),
                   host: bool = False) -> list[str]:
    """The rules as ``rule`` lines of an engine package's calling contract, in flag order:
    ``rule <name> <argument> <reduction> <key>=<int> ...: <text>``, each with the parameters
    it needs from ``parameters`` (input positions: tokens, lengths, segments, embeds,
    exclude; limits: vocab, levels, max_position). ``skip``: rules the program does not apply
    (segment_order under the causal mask); host: add ``HOST_RULES`` after them. Raises
    KeyError naming a missing parameter."""
    lines = []
    for rule in (*VALUE_RULES, *(HOST_RULES if host else ())):
        if rule.name in skip:
            continue
        missing = [key for key in RULE_PARAMETERS[rule.name] if key not in parameters]
        if missing:
            raise KeyError(f"rule {rule.name} needs the parameters {missing}")
        params = " ".join(f"{key}={int(parameters[key])}" for key in RULE_PARAMETERS[rule.name])
        lines.append(f"rule {rule.name} {rule.argument} {rule.reduction} {params}: {rule.text}")
    return lines
