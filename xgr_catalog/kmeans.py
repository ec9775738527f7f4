"""Residual k-means: item embeddings ``[N, d]`` -> semantic-ID code paths ``[N, levels]``.

Level 0 clusters the embeddings; each further level clusters what the previous levels' centroids
left unexplained (the residual), so a path is a coarse-to-fine description of the item. Items
with near-identical embeddings may share a path (``xgr_catalog.collisions`` caps how many).

In torch, on any device: every pass over the rows goes in chunks of ``KMeansConfig.chunk``
rows, so memory beyond the rows themselves is a few chunk-sized buffers and the residuals are
recomputed per chunk from the codes instead of being stored. On CUDA the rows move to the
device once when they fit in under half its free memory, and stream from the host chunk by
chunk otherwise. Centroid sums are a one-hot matrix product on CUDA (no float atomics) and
accumulate in float64, so one seed gives the same codes on one device and library version.

``fit_codebooks`` learns the codebooks on the training rows (all, or a seeded sample of
``train_sample`` rows); ``encode`` assigns every row greedily level by level;
``residual_kmeans`` does both and hands NumPy back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from tqdm import tqdm

from xgr_common.errors import ConfigError, InvalidInputError, require

SEED_SAMPLE_PER_CODE = 64     # k-means++ seeds are drawn from at most 64 k rows
DEVICE_SHARE = 0.5            # rows move to a CUDA device when they take under half its free memory
FINITE_CHECK_ROWS = 1 << 20
TRIAL_ITERATIONS = 5          # Lloyd iterations each start gets before the better one goes on


@dataclass(frozen=True)
class KMeansConfig:
    """levels x codebook_size codes; Lloyd iterations per level; rows per chunk; the seed;
    ``train_sample``: rows the codebooks are fitted on (None: all; every row is encoded);
    ``progress``: tqdm bars on stderr."""

    levels: int = 3
    codebook_size: int = 256
    iterations: int = 20
    chunk: int = 65_536
    seed: int = 0
    train_sample: int | None = None
    progress: bool = True

    def __post_init__(self) -> None:
        for name in ("levels", "codebook_size", "iterations", "chunk"):
            value = getattr(self, name)
            require(isinstance(value, int) and value >= 1, ConfigError,
                    f"KMeansConfig.{name} must be a positive int, got {value!r}")
        require(isinstance(self.seed, int), ConfigError,
                f"KMeansConfig.seed must be an int, got {self.seed!r}")
        require(self.train_sample is None or (isinstance(self.train_sample, int)
                                              and self.train_sample >= 1), ConfigError,
                f"KMeansConfig.train_sample must be None or a positive int, got "
                f"{self.train_sample!r}")


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


@dataclass(frozen=True)
class Encoding:
    """What ``encode`` returns, as tensors on the rows' device: ``codes [N, levels]`` int64,
    ``item_errors [N]`` float32 (each row's squared residual norm after the last level) and
    ``errors`` (the mean squared residual norm after each level)."""

    codes: torch.Tensor
    item_errors: torch.Tensor
    errors: tuple[float, ...]


def checked_points(embeddings) -> torch.Tensor:
    """``embeddings`` (NumPy or tensor) as a float32 tensor ``[N, d]`` where it lives (a NumPy
    float32 array is shared, not copied); ``InvalidInputError`` for a bad shape, dtype or a
    NaN / inf."""
    if isinstance(embeddings, torch.Tensor):
        points = embeddings
    else:
        array = np.asarray(embeddings)
        require(array.dtype.kind in "fiub", InvalidInputError,
                f"embeddings must be floating point, got dtype {array.dtype}")
        points = torch.from_numpy(array)
    require(points.dim() == 2 and points.shape[0] >= 1 and points.shape[1] >= 1,
            InvalidInputError, f"embeddings must be [N, d] with N, d >= 1, got "
            f"{tuple(points.shape)}")
    require(points.is_floating_point(), InvalidInputError,
            f"embeddings must be floating point, got {points.dtype}")
    for start in range(0, points.shape[0], FINITE_CHECK_ROWS):   # bounded temporaries
        require(bool(torch.isfinite(points[start:start + FINITE_CHECK_ROWS]).all()),
                InvalidInputError, "embeddings must be finite (no NaN or inf)")
    return points.float()


def resolve_device(device: torch.device | str | None) -> torch.device:
    """``device`` as a ``torch.device`` (None: the CPU); ``ConfigError`` for an unknown name
    or a CUDA device this machine lacks."""
    try:
        resolved = torch.device("cpu" if device is None else device)
    except (RuntimeError, TypeError) as error:
        raise ConfigError(f"unknown device {device!r} ({error}); use cpu, cuda or "
                          f"cuda:N") from None
    if resolved.type == "cuda":
        require(torch.cuda.is_available(), ConfigError,
                f"device {device!r}: torch sees no CUDA device on this machine")
        index = resolved.index if resolved.index is not None else torch.cuda.current_device()
        require(index < torch.cuda.device_count(), ConfigError,
                f"device {device!r}: this machine has {torch.cuda.device_count()} CUDA devices")
        resolved = torch.device("cuda", index)
    return resolved


def placed(points: torch.Tensor, device: torch.device) -> torch.Tensor:
    """The rows where passes read them: on ``device`` when they fit under ``DEVICE_SHARE`` of
    its free memory (or it is the CPU), else left where they are and streamed chunk by
    chunk."""
    if points.device == device:
        return points
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        if points.numel() * points.element_size() > DEVICE_SHARE * free:
            return points
    return points.to(device)


def partial_residual(block: torch.Tensor, codebooks: torch.Tensor, codes: torch.Tensor,
                     upto: int) -> torch.Tensor:
    """``block [m, d]`` minus its centroids of levels ``0 .. upto-1`` (``codes [m, >= upto]``
    on the codebooks' device): the residual that level ``upto`` encodes."""
    residual = block.clone() if upto else block
    for level in range(upto):
        residual -= codebooks[level][codes[:, level]]
    return residual


def _nearest(residual: torch.Tensor, centroids: torch.Tensor, norms: torch.Tensor
             ) -> torch.Tensor:
    """Nearest centroid ``[m]`` int64 of each row: |x - c|^2 = |x|^2 - 2 x.c + |c|^2, and |x|^2
    does not change the argmin."""
    # min(...).indices, not argmin: twice as fast on the CPU, the same first index on ties.
    return torch.addmm(norms[None, :], residual, centroids.T, alpha=-2.0).min(dim=1).indices


def _kmeans_plus_plus(sample: torch.Tensor, k: int, gen: torch.Generator) -> torch.Tensor:
    """Greedy k-means++ seeds ``[k, d]`` from the rows of ``sample``.

    Each step draws ``2 + log k`` candidates with probability proportional to their squared
    distance from the seeds so far and keeps the one that lowers the total distance most
    (the variant scikit-learn uses; plain k-means++ more often splits one true cluster).
    """
    trials = 2 + int(math.log(k))
    seeds = [sample[int(torch.randint(sample.shape[0], (1,), generator=gen))]]
    nearest = ((sample - seeds[0]) ** 2).sum(dim=1)
    sample_norms = (sample * sample).sum(dim=1)
    for _ in range(1, k):
        weights = nearest.cpu().double()
        if float(weights.sum()) > 0:
            picks = torch.multinomial(weights, trials, replacement=True, generator=gen)
        else:
            picks = torch.randint(sample.shape[0], (trials,), generator=gen)
        candidates = sample[picks.to(sample.device)]                       # [trials, d]
        # [trials, n] squared distances as one matrix product (cdist is 5x slower here)
        dist = torch.addmm(sample_norms[None, :] + sample_norms[picks.to(sample.device)][:, None],
                           candidates, sample.T, alpha=-2.0).clamp_(min=0.0)
        totals = torch.minimum(nearest[None, :], dist).sum(dim=1)
        best = int(totals.argmin())
        seeds.append(candidates[best])
        nearest = torch.minimum(nearest, dist[best])
    return torch.stack(seeds)


class _Rows:
    """The training rows with their codes so far: chunked passes, residuals of any rows."""

    def __init__(self, points: torch.Tensor, levels: int, device: torch.device, chunk: int):
        self.points, self.device, self.chunk = points, device, chunk
        self.codes = torch.zeros((points.shape[0], levels), dtype=torch.int64,
                                 device=points.device)

    def __len__(self) -> int:
        return self.points.shape[0]

    def chunks(self, codebooks: torch.Tensor, level: int):
        """(start, stop, residual of those rows at ``level``) on the device, chunk by chunk."""
        for start in range(0, len(self), self.chunk):
            stop = min(start + self.chunk, len(self))
            block = self.points[start:stop].to(self.device)
            codes = self.codes[start:stop].to(self.device)
            yield start, stop, partial_residual(block, codebooks, codes, level)

    def residuals(self, index: torch.Tensor, codebooks: torch.Tensor, level: int) -> torch.Tensor:
        index = index.to(self.points.device)
        return partial_residual(self.points[index].to(self.device), codebooks,
                                self.codes[index].to(self.device), level)


def _lloyd(rows: _Rows, codebooks: torch.Tensor, level: int, config: KMeansConfig,
           gen: torch.Generator, progress: tqdm, uniform_rows: torch.Tensor) -> torch.Tensor:
    """Level ``level``'s centroids ``[k, d]`` by Lloyd's iterations from the better of two
    starts: k-means++ seeds and the residuals of the uniformly drawn rows ``uniform_rows``
    (the same rows at every level, as faiss's residual quantiser draws them).

    Neither start wins everywhere: k-means++ finds well-separated clusters that uniform seeds
    miss (two seeds in one cluster, none in another), but on blob-like residuals it seeds the
    outliers and ends 2-3% worse. Each start runs ``TRIAL_ITERATIONS``; the one with the lower
    k-means objective goes on for the rest of ``config.iterations``.
    """
    n, k = len(rows), config.codebook_size
    sample = torch.randperm(n, generator=gen)[:SEED_SAMPLE_PER_CODE * k]
    starts = (_kmeans_plus_plus(rows.residuals(sample, codebooks, level), k, gen),
              rows.residuals(uniform_rows, codebooks, level))
    trial = min(TRIAL_ITERATIONS, config.iterations)
    tried = [_iterate(rows, codebooks, level, start, trial, gen, progress) for start in starts]
    centroids, _ = min(tried, key=lambda pair: pair[1])
    centroids, _ = _iterate(rows, codebooks, level, centroids, config.iterations - trial, gen,
                            progress)
    return centroids


def _iterate(rows: _Rows, codebooks: torch.Tensor, level: int, centroids: torch.Tensor,
             steps: int, gen: torch.Generator, progress: tqdm) -> tuple[torch.Tensor, float]:
    """``steps`` Lloyd iterations from ``centroids``: (the centroids, the k-means objective of
    the last assignment). An empty cluster is re-seeded from a random row's residual."""
    n, k = len(rows), centroids.shape[0]
    one_hot = rows.device.type == "cuda"
    objective = float("inf")
    for _ in range(steps):
        sums = torch.zeros((k, centroids.shape[1]), dtype=torch.float64, device=rows.device)
        counts = torch.zeros(k, dtype=torch.int64, device=rows.device)
        total = torch.zeros((), dtype=torch.float64, device=rows.device)
        norms = (centroids * centroids).sum(dim=1)
        for _, _, residual in rows.chunks(codebooks, level):
            partial, labels = torch.addmm(norms[None, :], residual, centroids.T,
                                          alpha=-2.0).min(dim=1)
            total += partial.sum(dtype=torch.float64) + (residual * residual).sum(
                dtype=torch.float64)
            if one_hot:   # a matrix product: no float atomics, the same sums every run
                hot = torch.zeros((residual.shape[0], k), dtype=residual.dtype,
                                  device=rows.device)
                hot.scatter_(1, labels[:, None], 1.0)
                sums += (hot.T @ residual).double()
            else:   # sums of one chunk in float32 (3x faster than float64), then float64
                sums += torch.zeros_like(centroids).index_add_(0, labels, residual).double()
            counts += torch.bincount(labels, minlength=k)
        reseed = torch.randint(n, (k,), generator=gen)
        empty = counts == 0
        updated = (sums / counts.clamp(min=1)[:, None]).float()
        if bool(empty.any()):
            updated = torch.where(empty[:, None], rows.residuals(reseed, codebooks, level),
                                  updated)
        centroids = updated
        objective = float(total)
        progress.update(1)
    return centroids, objective


def training_rows(count: int, config: KMeansConfig, gen: torch.Generator | None = None
                  ) -> torch.Tensor | None:
    """The sorted rows ``[train_sample]`` int64 the codebooks are fitted on, drawn with
    ``config.seed`` (``gen``, when given, is that seed's generator and advances); None when
    every row is."""
    if config.train_sample is None or config.train_sample >= count:
        return None
    gen = gen if gen is not None else torch.Generator().manual_seed(config.seed)
    return torch.randperm(count, generator=gen)[:config.train_sample].sort().values


def fit_codebooks(points: torch.Tensor, config: KMeansConfig,
                  device: torch.device | str | None = None) -> torch.Tensor:
    """Codebooks ``[levels, codebook_size, d]`` float32 on ``device``, fitted level by level
    on ``points`` (checked ``[N, d]`` float32, see ``checked_points``), or on a seeded sample
    of ``config.train_sample`` of its rows."""
    device = resolve_device(device)
    gen = torch.Generator().manual_seed(config.seed)
    chosen = training_rows(points.shape[0], config, gen)
    if chosen is not None:
        points = points[chosen.to(points.device)]
    rows = _Rows(placed(points, device), config.levels, device, config.chunk)
    codebooks = torch.zeros((config.levels, config.codebook_size, points.shape[1]),
                            dtype=torch.float32, device=device)
    uniform_rows = torch.randperm(len(rows), generator=gen)[:config.codebook_size]
    if uniform_rows.shape[0] < config.codebook_size:   # fewer rows than codes: some repeat
        uniform_rows = uniform_rows[torch.arange(config.codebook_size) % uniform_rows.shape[0]]
    passes = config.iterations + min(TRIAL_ITERATIONS, config.iterations) + 1
    with tqdm(total=config.levels * passes, desc="residual k-means (fit)",
              unit="pass", disable=not config.progress) as progress:
        for level in range(config.levels):
            codebooks[level] = _lloyd(rows, codebooks, level, config, gen, progress,
                                      uniform_rows)
            norms = (codebooks[level] * codebooks[level]).sum(dim=1)
            for start, stop, residual in rows.chunks(codebooks, level):
                rows.codes[start:stop, level] = _nearest(residual, codebooks[level], norms
                                                         ).to(rows.codes.device)
            progress.update(1)
    return codebooks


def encode(points: torch.Tensor, codebooks: torch.Tensor, chunk: int = 65_536,
           progress: bool = True) -> Encoding:
    """Every row of ``points [N, d]`` coded greedily level by level against ``codebooks``
    (on their device); the results live where ``points`` were placed (see ``placed``)."""
    device = codebooks.device
    points = placed(points, device)
    home = points.device
    count, levels = points.shape[0], codebooks.shape[0]
    codes = torch.empty((count, levels), dtype=torch.int64, device=home)
    item_errors = torch.empty(count, dtype=torch.float32, device=home)
    totals = torch.zeros(levels, dtype=torch.float64, device=device)
    norms = (codebooks * codebooks).sum(dim=2)
    with tqdm(total=count, desc="residual k-means (encode)", unit="row", unit_scale=True,
              disable=not progress) as bar:
        for start in range(0, count, chunk):
            stop = min(start + chunk, count)
            residual = points[start:stop].to(device).clone()
            for level in range(levels):
                labels = _nearest(residual, codebooks[level], norms[level])
                residual -= codebooks[level][labels]
                codes[start:stop, level] = labels.to(home)
                totals[level] += (residual * residual).sum(dtype=torch.float64)
            item_errors[start:stop] = (residual * residual).sum(dim=1).to(home)
            bar.update(stop - start)
    errors = tuple(float(total) / count for total in totals.cpu())
    return Encoding(codes=codes, item_errors=item_errors, errors=errors)


def level_errors(points: torch.Tensor, codebooks: torch.Tensor, codes: torch.Tensor,
                 chunk: int = 65_536) -> tuple[float, ...]:
    """Mean squared residual norm of ``points`` after each level of the given ``codes
    [N, levels]`` (any codes, not only the nearest: a capped path, another library's)."""
    device = codebooks.device
    totals = torch.zeros(codebooks.shape[0], dtype=torch.float64, device=device)
    for start in range(0, points.shape[0], chunk):
        residual = points[start:start + chunk].to(device).clone()
        block = codes[start:start + chunk].to(device=device, dtype=torch.int64)
        for level in range(codebooks.shape[0]):
            residual -= codebooks[level][block[:, level]]
            totals[level] += (residual * residual).sum(dtype=torch.float64)
    return tuple(float(total) / points.shape[0] for total in totals.cpu())


def residual_kmeans(embeddings, config: KMeansConfig = KMeansConfig(),
                    device: torch.device | str | None = None) -> ResidualCodes:
    """Code paths of ``embeddings [N, d]`` (NumPy or tensor, float): ``fit_codebooks`` then
    ``encode``, on ``device`` (default the CPU); shows tqdm bars unless
    ``config.progress`` is off."""
    points = checked_points(embeddings)
    codebooks = fit_codebooks(points, config, device)
    coded = encode(points, codebooks, config.chunk, config.progress)
    return ResidualCodes(codes=coded.codes.to(torch.int32).cpu().numpy(),
                         codebooks=codebooks.cpu().numpy(), errors=coded.errors)
