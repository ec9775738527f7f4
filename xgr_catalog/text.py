"""Item texts -> embeddings through a sentence-transformers model the user has on disk.

Optional: ``sentence-transformers`` is imported only here, only when ``--text_model`` is given,
and nothing is downloaded (the model loads with ``local_files_only``).
"""

from __future__ import annotations

import os

import numpy as np

from xgr_common.errors import ConfigError, require

FLAG = "--text_model (CatalogBuildConfig.text_model)"


def encode_texts(texts: list[str], model_path: str, device: str = "cpu",
                 batch_size: int = 256, progress: bool = True) -> np.ndarray:
    """float32 ``[len(texts), d]``: ``texts`` encoded by the sentence-transformers model saved
    in the folder ``model_path``, on ``device``. ``ConfigError`` naming the flag when the
    package is missing or the folder holds no loadable model."""
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        raise ConfigError(f"{FLAG} needs the sentence-transformers package, which is not "
                          f"installed here (pip install sentence-transformers); or encode the "
                          f"texts elsewhere and give their vectors (--embedding_column, or "
                          f"an .npy)") from None
    require(os.path.isdir(model_path), ConfigError,
            f"{FLAG}: {model_path!r} is not a folder; give a sentence-transformers model "
            f"saved on disk (SentenceTransformer.save)")
    try:
        model = SentenceTransformer(model_path, device=str(device), local_files_only=True)
    except (OSError, ValueError, RuntimeError) as error:
        raise ConfigError(f"{FLAG}: {model_path!r} does not load as a sentence-transformers "
                          f"model ({error})") from None
    vectors = model.encode(texts, batch_size=batch_size, show_progress_bar=progress,
                           convert_to_numpy=True)
    return np.asarray(vectors, dtype=np.float32).reshape(len(texts), -1)
