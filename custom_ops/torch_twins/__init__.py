"""Torch twins of the C++ feature ops: same semantics, same validation, pure torch.

Imported on demand (``custom_ops/__init__`` never imports torch). Each twin raises
``xgr_common.errors.InvalidInputError`` naming the argument where the TF op raises
``InvalidArgumentError``; ``custom_ops.registry`` pairs each TF op with its twin.
"""

from custom_ops.torch_twins.assemble_prompt import Prompt, assemble_prompt
from custom_ops.torch_twins.assemble_prompt_v2 import PromptV2, assemble_prompt_v2
from custom_ops.torch_twins.clean_sequence import CleanedSequence, clean_sequence
from custom_ops.torch_twins.semantic_ids import CodeTokens, TorchSemanticIdTable, semantic_id_lookup
from custom_ops.torch_twins.split_history import SplitHistory, split_history

__all__ = ["CleanedSequence", "CodeTokens", "Prompt", "PromptV2", "SplitHistory",
           "TorchSemanticIdTable", "assemble_prompt", "assemble_prompt_v2", "clean_sequence",
           "semantic_id_lookup", "split_history"]
