"""Stand-in checkpoints (``xgr_checkpoint.stand_in``) and their extended copies, made once per
session: qwen2 and qwen3, with a tied and an untied ``lm_head``."""

from __future__ import annotations

import pytest

from xgr_checkpoint.stand_in import make_stand_in
from xgr_checkpoint.vocabulary import VocabularyConfig, extend_vocabulary

KINDS = [("qwen2", True), ("qwen2", False), ("qwen3", True), ("qwen3", False)]
KIND_IDS = [f"{arch}-{'tied' if tied else 'untied'}" for arch, tied in KINDS]
# The layout every extended stand-in gets: Qwen's default sizes (1024 layout tokens).
EXTENSION = VocabularyConfig(seed=7)


@pytest.fixture(scope="session")
def extension() -> VocabularyConfig:
    """The config the ``extended`` checkpoints were made with."""
    return EXTENSION


@pytest.fixture(scope="session")
def stand_ins(tmp_path_factory):
    """(architecture, tied) -> ``StandIn`` of a random-weight hidden-64 checkpoint."""
    root = tmp_path_factory.mktemp("stand_ins")
    return {(arch, tied): make_stand_in(root / f"{arch}-{tied}", arch, tie_word_embeddings=tied,
                                        seed=3)
            for arch, tied in KINDS}


@pytest.fixture(scope="session")
def extended(stand_ins, tmp_path_factory):
    """(architecture, tied) -> ``VocabularyReport`` of that stand-in extended by ``EXTENSION``."""
    root = tmp_path_factory.mktemp("extended")
    return {kind: extend_vocabulary(stand_in.path, root / f"{kind[0]}-{kind[1]}", EXTENSION)
            for kind, stand_in in stand_ins.items()}


@pytest.fixture(params=KINDS, ids=KIND_IDS)
def kind(request) -> tuple[str, bool]:
    """Each (architecture, tied) in turn."""
    return request.param
