"""The field's library beside ours: faiss's ``ResidualQuantizer`` (faiss-cpu) on the same rows.

It is set up as the same algorithm: Lloyd's k-means per level (``Train_default``) for the same
number of iterations and seed, fitted on the same training rows (every one of them: no
subsampling to 256 points a centroid), then every row encoded (greedily with
``max_beam_size`` 1, or with faiss's beam search when ``beam`` > 1). Its reconstruction error
is measured as ours is (``xgr_catalog.kmeans.level_errors``), so the two sit side by side.
faiss needs ``codebook_size`` a power of two and is imported only here, only when asked for
(it is not installed on the GPU machine).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
from tqdm import tqdm

from xgr_catalog.kmeans import level_errors
from xgr_common.errors import ConfigError, require

FLAG = "--faiss (CatalogBuildConfig.faiss)"


@dataclass(frozen=True)
class FaissResult:
    """faiss's fit and encode times (s), its mean squared residual after each level, the
    distinct paths and most items on one path of its codes (before any cap), its settings."""

    train_s: float
    encode_s: float
    errors: tuple[float, ...]
    num_paths: int
    max_items_per_path: int
    settings: dict

    def to_json(self) -> dict:
        return {"train_s": self.train_s, "encode_s": self.encode_s, "errors": list(self.errors),
                "num_paths": self.num_paths, "max_items_per_path": self.max_items_per_path,
                "settings": self.settings}


def faiss_module():
    """``faiss``, or ``ConfigError`` naming the flag when it is not installed."""
    try:
        import faiss
    except ImportError:
        raise ConfigError(f"{FLAG} needs faiss-cpu, which is not installed here "
                          f"(pip install faiss-cpu==1.15.1, as requirements.txt pins it; there "
                          f"is no faiss on the GPU machine: leave the comparison off there)"
                          ) from None
    return faiss


def faiss_residual_quantizer(embeddings: np.ndarray, train_rows: np.ndarray | None,
                             levels: int, codebook_size: int, iterations: int, seed: int,
                             beam: int = 1, chunk: int = 65_536, progress: bool = True
                             ) -> tuple[FaissResult, np.ndarray]:
    """(``FaissResult``, its codes ``[N, levels]`` int64) of faiss's residual quantiser fitted
    on ``embeddings[train_rows]`` (None: every row) and encoding every row."""
    faiss = faiss_module()
    nbits = codebook_size.bit_length() - 1
    require(codebook_size == 1 << nbits and nbits >= 1, ConfigError,
            f"{FLAG}: faiss's residual quantiser needs codebook_size a power of two, got "
            f"{codebook_size}")
    vectors = np.ascontiguousarray(embeddings, dtype=np.float32)
    dim = vectors.shape[1]
    quantizer = faiss.ResidualQuantizer(dim, levels, nbits)
    quantizer.train_type = faiss.ResidualQuantizer.Train_default
    quantizer.max_beam_size = beam
    quantizer.cp.niter = iterations
    quantizer.cp.seed = seed
    quantizer.cp.max_points_per_centroid = 1 << 30
    quantizer.verbose = False
    sample = vectors if train_rows is None else np.ascontiguousarray(vectors[train_rows])
    start = time.perf_counter()
    quantizer.train(sample)
    train_s = time.perf_counter() - start
    codes = np.empty((vectors.shape[0], levels), dtype=np.int64)
    start = time.perf_counter()
    for first in tqdm(range(0, vectors.shape[0], chunk), desc="faiss residual quantiser (encode)",
                      unit="chunk", disable=not progress):
        packed = quantizer.compute_codes(vectors[first:first + chunk])
        codes[first:first + chunk] = unpack_codes(packed, levels, nbits)
    encode_s = time.perf_counter() - start
    books = faiss.vector_to_array(quantizer.codebooks).reshape(levels, codebook_size, dim)
    errors = level_errors(torch.from_numpy(vectors), torch.from_numpy(books),
                          torch.from_numpy(codes), chunk)
    keys = np.zeros(codes.shape[0], dtype=np.int64)
    for level in range(levels):
        keys = keys * codebook_size + codes[:, level]
    _, per_path = np.unique(keys, return_counts=True)
    settings = {"library": f"faiss {faiss.__version__}", "train_type": "Train_default",
                "max_beam_size": beam, "niter": iterations, "seed": seed,
                "train_rows": int(sample.shape[0]), "threads": faiss.omp_get_max_threads()}
    return FaissResult(train_s=train_s, encode_s=encode_s, errors=errors,
                       num_paths=int(per_path.shape[0]),
                       max_items_per_path=int(per_path.max()), settings=settings), codes


def unpack_codes(packed: np.ndarray, levels: int, nbits: int) -> np.ndarray:
    """faiss's packed codes ``[n, code_size]`` uint8 (each code ``nbits`` wide, least
    significant bit first) -> ``[n, levels]`` int64."""
    if nbits == 8:
        return packed[:, :levels].astype(np.int64)
    bits = np.unpackbits(packed, axis=1, bitorder="little")[:, :levels * nbits]
    weights = (1 << np.arange(nbits, dtype=np.int64))
    return (bits.reshape(-1, levels, nbits).astype(np.int64) * weights).sum(axis=2)
