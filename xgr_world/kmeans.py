"""Residual k-means: item embeddings ``[N, d]`` -> semantic-ID code paths ``[N, levels]``.

Level 0 clusters the embeddings; each further level clusters what the previous levels' centroids
left unexplained (the residual), so a path is a coarse-to-fine description of the item. Items
with near-identical embeddings may share a path; ``Catalog`` accepts that.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from tqdm import tqdm

from xgr_common.errors import ConfigError, InvalidInputError, require


@dataclass(frozen=True)
class KMeansConfig:
    """levels x codebook_size codes; Lloyd iterations per level; assignment chunk rows."""

    levels: int = 3
    codebook_size: int = 256
    iterations: int = 20
    chunk: int = 65_536
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("levels", "codebook_size", "iterations", "chunk"):
            value = getattr(self, name)
            require(isinstance(value, int) and value >= 1, ConfigError,
                    f"KMeansConfig.{name} must be a positive int, got {value!r}")


@dataclass(frozen=True)
class ResidualCodes:
    """codes: ``[N, levels]`` int32; codebooks: ``[levels, codebook_size, d]`` float32;
    errors: mean squared residual norm after each level (non-increasing in expectation)."""

    codes: np.ndarray
    codebooks: np.ndarray
    errors: tuple[float, ...]

    def reconstruct(self) -> np.ndarray:
        """``[N, d]`` sum of each item's centroids over the levels."""
        levels = range(self.codebooks.shape[0])
        return sum(self.codebooks[level][self.codes[:, level]] for level in levels)


def _assign(points: torch.Tensor, centroids: torch.Tensor, chunk: int) -> torch.Tensor:
    """Nearest centroid ``[N]`` int64 of each point, in chunks of rows to bound memory."""
    norms = (centroids * centroids).sum(dim=1)
    out = []
    for start in range(0, points.shape[0], chunk):
        block = points[start:start + chunk]
        # |x - c|^2 = |x|^2 - 2 x.c + |c|^2; |x|^2 does not change the argmin.
        out.append((norms[None, :] - 2.0 * block @ centroids.T).argmin(dim=1))
    return torch.cat(out)


def _kmeans_plus_plus(points: torch.Tensor, k: int, gen: torch.Generator) -> torch.Tensor:
    """Greedy k-means++ seeds ``[k, d]`` from a random sample of at most 64 k points.

    Each step draws ``2 + log k`` candidates with probability proportional to their squared
    distance from the seeds so far and keeps the one that lowers the total distance most
    (the variant scikit-learn uses; plain k-means++ more often splits one true cluster).
    """
    n = points.shape[0]
    sample = points[torch.randperm(n, generator=gen)[:64 * k].to(points.device)]
    trials = 2 + int(math.log(k))
    seeds = [sample[int(torch.randint(sample.shape[0], (1,), generator=gen))]]
    nearest = ((sample - seeds[0]) ** 2).sum(dim=1)
    for _ in range(1, k):
        weights = nearest.cpu().double()
        if float(weights.sum()) > 0:
            picks = torch.multinomial(weights, trials, replacement=True, generator=gen)
        else:
            picks = torch.randint(sample.shape[0], (trials,), generator=gen)
        candidates = sample[picks.to(points.device)]                       # [trials, d]
        dist = torch.cdist(candidates, sample) ** 2                        # [trials, n]
        totals = torch.minimum(nearest[None, :], dist).sum(dim=1)
        best = int(totals.argmin())
        seeds.append(candidates[best])
        nearest = torch.minimum(nearest, dist[best])
    return torch.stack(seeds)


def _kmeans(points: torch.Tensor, k: int, config: KMeansConfig, gen: torch.Generator,
            progress: tqdm) -> tuple[torch.Tensor, torch.Tensor]:
    """Lloyd's k-means from k-means++ seeds; empty clusters are re-seeded from random points."""
    n = points.shape[0]
    centroids = _kmeans_plus_plus(points, k, gen)
    for _ in range(config.iterations):
        labels = _assign(points, centroids, config.chunk)
        sums = torch.zeros_like(centroids).index_add_(0, labels, points)
        counts = torch.bincount(labels, minlength=k).to(points.dtype)
        empty = counts == 0
        reseed = points[torch.randint(n, (k,), generator=gen).to(points.device)]
        centroids = torch.where(empty[:, None], reseed, sums / counts.clamp(min=1)[:, None])
        progress.update(1)
    return centroids, _assign(points, centroids, config.chunk)


def residual_kmeans(embeddings, config: KMeansConfig = KMeansConfig(),
                    device: torch.device | str | None = None) -> ResidualCodes:
    """Code paths of ``embeddings [N, d]`` (NumPy or tensor, float); shows a tqdm bar."""
    points = torch.as_tensor(np.asarray(embeddings) if not isinstance(embeddings, torch.Tensor)
                             else embeddings)
    require(points.dim() == 2 and points.shape[0] >= 1 and points.shape[1] >= 1,
            InvalidInputError, f"embeddings must be [N, d] with N, d >= 1, got "
            f"{tuple(points.shape)}")
    require(points.is_floating_point(), InvalidInputError,
            f"embeddings must be floating point, got {points.dtype}")
    require(bool(torch.isfinite(points).all()), InvalidInputError,
            "embeddings must be finite (no NaN or inf)")
    residual = points.to(device=device, dtype=torch.float32).clone()
    gen = torch.Generator().manual_seed(config.seed)
    codes, books, errors = [], [], []
    with tqdm(total=config.levels * config.iterations, desc="residual k-means",
              unit="iter") as progress:
        for _ in range(config.levels):
            centroids, labels = _kmeans(residual, config.codebook_size, config, gen, progress)
            residual -= centroids[labels]
            codes.append(labels.to(torch.int32).cpu())
            books.append(centroids.cpu())
            errors.append(float((residual * residual).sum(dim=1).mean()))
    return ResidualCodes(codes=torch.stack(codes, dim=1).numpy(),
                         codebooks=torch.stack(books).numpy(), errors=tuple(errors))
