"""C++ TF ops of xgr-bridge and their Python API. Imports TensorFlow, never torch.

Importing this package loads every op library whose sources exist under ``custom_ops/cc/``
(``_feature_ops``; ``_torch_call`` once its sources exist), so a SavedModel that uses the ops
loads after ``import custom_ops``. A library that is not built raises
``xgr_common.errors.OpLibraryError`` naming its file and the build command.

The Torch twins of the feature ops live in ``custom_ops.torch_twins`` (imported on demand);
``custom_ops.registry`` pairs each TF op with its twin and its ONNX node.
"""

from xgr_common.import_order import preload_triton

preload_triton()  # before TensorFlow: see xgr_common/import_order.py

from custom_ops._loader import (BUILD_COMMAND, library_names, library_path,  # noqa: E402
                                library_paths, load_library)

for _name in library_names():
    load_library(_name)
del _name

from custom_ops.catalog_file import read_catalog, write_catalog  # noqa: E402
from custom_ops.feature_ops import (CleanedSequence, CodeTokens, Prompt,  # noqa: E402
                                    PromptV2, SplitHistory, assemble_prompt,
                                    assemble_prompt_v2, clean_sequence, semantic_id_lookup,
                                    split_history)
from custom_ops.semantic_id_table import SemanticIdTable  # noqa: E402

__all__ = [
    "BUILD_COMMAND", "CleanedSequence", "CodeTokens", "Prompt", "PromptV2", "SemanticIdTable",
    "SplitHistory", "assemble_prompt", "assemble_prompt_v2", "clean_sequence", "library_names",
    "library_path", "library_paths", "load_library", "read_catalog", "semantic_id_lookup",
    "split_history", "write_catalog",
]
