"""``xgr evaluate``: a team's model measured offline on its behaviour log, beside two baselines.

What goes in is what ``xgr export`` takes (the checkpoint with its ``xgr_model.json``, the
catalog file, the trained feature graph), read and checked the same way
(``xgr_export.export.team_sources``), plus the log (``xgr_train.logs``). The log is split:

- ``users``: a seeded ``holdout`` share of the users (``user_split``: the users ``xgr train``
  leaves out with the same holdout and seed) is tested on its last ``events_per_user``
  events; the baselines count the other users' events;
- ``time``: train on the past, test on the next day: each user's first event in
  ``[test_from, test_from + test_seconds)`` (default: the start of the log's last UTC day,
  one day) is a request; the baselines count the events before ``test_from`` only.

Each request (the user's events before it as the history, its time, its context) goes through
the in-process pipeline (feature graph -> the engine's constrained beam search -> the
business rules); popularity and item-to-item co-occurrence (``xgr_train.baselines``) rank the
same requests, skip the same history and go through the same rules. Requests whose target is
not in the catalog are skipped and counted. Out: recall@K and NDCG@K (one relevant item per
request: ``1 / log2(rank + 1)``) of the three rankers, as a table, a JSON report and a plot.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import tensorflow as tf

from bridge.pipeline import RecommendPipeline
from tf_frontend.pipeline_spec import PipelineConfig
from tf_frontend.rules import BusinessRules
from xgr_common.errors import ConfigError, require
from xgr_export.config import DTYPES, EngineExportConfig, ExportConfig
from xgr_export.engine_package import check_search_sizes
from xgr_export.export import build_engine, resolve_attention, resolve_selection, team_sources
from xgr_train.baselines import CoOccurrence, popularity
from xgr_train.logs import (BehaviourLog, last_events, read_logs, requests_at, time_split,
                            user_split)
from xgr_world.evaluation import Batches, ndcg_at, popularity_lists, rank_requests, recall_at

DAY = 86400
SPLITS = ("users", "time")
RANKERS = ("model", "popularity", "co-occurrence")
REPORT_FILE = "evaluation.json"
PLOT_FILE = "evaluation.png"


def _positive(name: str, value) -> None:
    require(isinstance(value, int) and not isinstance(value, bool) and value >= 1, ConfigError,
            f"EvaluateConfig.{name} must be a positive int, got {value!r}")


@dataclass(frozen=True)
class EvaluateConfig:
    """One offline evaluation.

    model, catalog, feature_graph: the team's files, as ``xgr export`` takes them; logs: the
    behaviour log (Parquet). out: folder for the JSON report and the plot (None: neither).
    split: "users" (``holdout`` share of the users, drawn with ``seed``; each held-out user's
    last ``events_per_user`` events) or "time" (each user's first event in
    ``[test_from, test_from + test_seconds)``; ``test_from`` None: the start of the log's
    last UTC day).
    ks: the K of recall@K and NDCG@K (each <= top_k). beam_width, top_k: the engine's search;
    batch_size: requests per pipeline call; max_requests: at most this many requests, a seeded
    sample when there are more (None: all). cooccurrence_items: how many of a request's latest
    items the co-occurrence baseline looks after. rules: the business rules every ranker's
    list goes through. device: "cpu" or "cuda[:i]"; dtype: None takes float32 on the CPU,
    bfloat16 on CUDA.
    """

    model: str | os.PathLike
    catalog: str | os.PathLike
    feature_graph: str | os.PathLike
    logs: str | os.PathLike
    out: str | os.PathLike | None = None
    split: str = "users"
    holdout: float = 0.1
    seed: int = 0
    events_per_user: int = 1
    test_from: int | None = None
    test_seconds: int = DAY
    ks: tuple[int, ...] = (1, 5, 10, 20, 50, 100)
    beam_width: int = 128
    top_k: int = 100
    batch_size: int = 64
    max_requests: int | None = 10000
    cooccurrence_items: int = 1
    rules: BusinessRules = field(default_factory=BusinessRules)
    device: str = "cpu"
    dtype: str | None = None

    def __post_init__(self) -> None:
        require(self.split in SPLITS, ConfigError,
                f"EvaluateConfig.split must be one of {SPLITS}, got {self.split!r}")
        if self.split == "users":
            require(isinstance(self.holdout, (int, float)) and 0 < self.holdout < 1,
                    ConfigError, f"EvaluateConfig.holdout must be in (0, 1) for the users "
                    f"split, got {self.holdout!r}")
        require(self.test_from is None or (isinstance(self.test_from, int)
                                           and self.test_from >= 0), ConfigError,
                f"EvaluateConfig.test_from must be unix seconds >= 0, got {self.test_from!r}")
        for name in ("events_per_user", "test_seconds", "beam_width", "top_k", "batch_size",
                     "cooccurrence_items"):
            _positive(name, getattr(self, name))
        if self.max_requests is not None:
            _positive("max_requests", self.max_requests)
        require(isinstance(self.ks, tuple) and len(self.ks) > 0, ConfigError,
                f"EvaluateConfig.ks must be a non-empty tuple of ints, got {self.ks!r}")
        for k in self.ks:
            _positive("ks entry", k)
        require(max(self.ks) <= self.top_k, ConfigError,
                f"EvaluateConfig.ks {self.ks} go beyond top_k {self.top_k}: a list holds "
                f"top_k items (raise top_k or drop the larger K)")
        require(isinstance(self.rules, BusinessRules), ConfigError,
                f"EvaluateConfig.rules must be BusinessRules, got {type(self.rules).__name__}")
        require(self.dtype is None or self.dtype in DTYPES, ConfigError,
                f"EvaluateConfig.dtype must be one of {DTYPES}, got {self.dtype!r}")

    def export_config(self) -> ExportConfig:
        """The same files and search as an ``ExportConfig``: what ``team_sources`` and
        ``build_engine`` read and build (nothing is exported)."""
        return ExportConfig(
            out=str(self.out or "."), model=str(self.model), catalog=str(self.catalog),
            feature_graph=str(self.feature_graph), seed=self.seed, dtype=self.dtype,
            top_n=self.top_k,
            engine=EngineExportConfig(beam_width=self.beam_width, top_k=self.top_k,
                                      max_batch=self.batch_size, device=self.device,
                                      max_request_exclusions=0))


@dataclass(frozen=True)
class TestRequests:
    """A split of the log: the part the baselines count (``train``), and the test requests as
    (user rows, event indices) of the whole log; ``split``: what was cut, for the report."""

    train: BehaviourLog
    rows: np.ndarray
    events: np.ndarray
    split: dict


def split_log(log: BehaviourLog, config: EvaluateConfig) -> TestRequests:
    """The training part and the test requests of ``config.split`` (see the module doc)."""
    if config.split == "users":
        train_rows, held = user_split(log, config.holdout, config.seed)
        mask = np.zeros(len(log.users), bool)
        mask[train_rows] = True
        train = log.keep(np.repeat(mask, np.diff(log.splits)))
        rows, events = last_events(log, held, config.events_per_user)
        split = {"kind": "users", "holdout": config.holdout, "seed": config.seed,
                 "held_out_users": int(len(held)), "events_per_user": config.events_per_user}
    else:
        start = (config.test_from if config.test_from is not None
                 else int(log.times.max()) // DAY * DAY)
        train, rows, events = time_split(log, start)
        within = log.times[events] < start + config.test_seconds
        rows, events = rows[within], events[within]
        split = {"kind": "time", "test_from": start, "test_until": start + config.test_seconds}
        require(train.events > 0, ConfigError,
                f"the time split at {start} leaves no events before it to count the baselines "
                f"on (the log spans {int(log.times.min())} .. {int(log.times.max())})")
    require(train.events > 0, ConfigError,
            "the users split leaves no training users to count the baselines on")
    require(len(rows) > 0, ConfigError,
            f"the {config.split} split of {config.logs} gives no test request (a request needs "
            f"an earlier event of its user for its history)")
    return TestRequests(train, rows, events, split)


@dataclass(frozen=True)
class EvaluationReport:
    """recall@K and NDCG@K (``recall[ranker][k]``, ``ndcg[ranker][k]``) of ``RANKERS`` on
    ``requests`` test requests. candidates: the split's requests; outside_catalog: those
    skipped because their target is not in the catalog; capped: those left out by
    ``max_requests``; train_events: the events the baselines counted; ms_per_request: the
    pipeline's mean wall time per request (its first batch left out); files: what was
    written (name -> path)."""

    split: dict
    requests: int
    candidates: int
    outside_catalog: int
    capped: int
    train_events: int
    ks: tuple[int, ...]
    recall: dict[str, dict[int, float]]
    ndcg: dict[str, dict[int, float]]
    ms_per_request: float
    seconds: float
    device: str
    files: dict[str, str] = field(default_factory=dict)

    def table(self) -> str:
        """The figures as text: one row per K, recall and NDCG of each ranker."""
        headers = ["K", *(f"recall {r}" for r in RANKERS), *(f"NDCG {r}" for r in RANKERS)]
        rows = [[str(k), *(f"{self.recall[r][k]:.4f}" for r in RANKERS),
                 *(f"{self.ndcg[r][k]:.4f}" for r in RANKERS)] for k in self.ks]
        widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(headers)]
        lines = ["  ".join(h.rjust(w) for h, w in zip(headers, widths)),
                 "  ".join("-" * w for w in widths)]
        lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in rows]
        how = (f"users split: {self.split['held_out_users']} held-out users "
               f"(holdout {self.split['holdout']}, seed {self.split['seed']})"
               if self.split["kind"] == "users" else
               f"time split: test on [{self.split['test_from']}, {self.split['test_until']})")
        return "\n".join([
            f"{how}; {self.requests} requests evaluated ({self.outside_catalog} skipped: target "
            f"outside the catalog; {self.capped} left out by max_requests); baselines counted "
            f"on {self.train_events} training events", *lines])

    def to_json(self) -> dict:
        return {"split": self.split, "requests": self.requests, "candidates": self.candidates,
                "outside_catalog": self.outside_catalog, "capped": self.capped,
                "train_events": self.train_events, "ks": list(self.ks),
                "recall": {r: {str(k): v for k, v in m.items()} for r, m in self.recall.items()},
                "ndcg": {r: {str(k): v for k, v in m.items()} for r, m in self.ndcg.items()},
                "ms_per_request": self.ms_per_request, "seconds": self.seconds,
                "device": self.device, "files": self.files}


def evaluate_logs(config: EvaluateConfig, progress: bool = True) -> EvaluationReport:
    """Reads and checks the team's files and the log, splits the log, ranks every test
    request with the model and the two baselines under the same rules and measures them;
    with ``config.out``, writes the JSON report and the plot there."""
    start = time.perf_counter()
    export = config.export_config()
    sources = team_sources(export)
    log = read_logs(config.logs)
    test = split_log(log, config)
    targets = log.items[test.events]
    known = np.isin(targets, sources.item_ids)
    keep = np.flatnonzero(known)
    capped = 0
    if config.max_requests is not None and len(keep) > config.max_requests:
        capped = len(keep) - config.max_requests
        rng = np.random.default_rng(config.seed)
        keep = np.sort(rng.choice(keep, config.max_requests, replace=False))
    require(len(keep) > 0, ConfigError,
            f"none of the {len(targets)} test requests of {config.logs} has its target in the "
            f"catalog {config.catalog}: are they the same items?")
    rows, events = test.rows[keep], test.events[keep]

    ranking = popularity(test.train, sources.item_ids)
    following = CoOccurrence.of(test.train, sources.item_ids, ranking, config.cooccurrence_items)
    engine = build_engine(export, sources, resolve_attention("auto", config.device),
                          resolve_selection(config.device))
    check_search_sizes(engine, export.engine)
    pipeline = RecommendPipeline.for_engine(
        sources.graph, engine, config.beam_width, config.top_k,
        PipelineConfig(top_n=config.top_k, rules=config.rules),
        catalog=(sources.item_ids, sources.item_codes), prefill_mask=sources.prefill_mask)

    size = config.batch_size
    batches = Batches(-(-len(rows) // size), lambda index: _features(
        log, rows[index * size:(index + 1) * size], events[index * size:(index + 1) * size]))

    def popular(history, features, top_k):
        return popularity_lists(ranking, history, top_k)[0]

    def cooccurring(history, features, top_k):
        return following.lists(_histories(features), history, top_k)

    lists = rank_requests(pipeline, batches,
                          {"popularity": popular, "co-occurrence": cooccurring},
                          _progress if progress else None)

    targets = log.items[events]
    ranked = {"model": lists.model_items, **lists.baselines}
    recall = {name: {k: recall_at(ranked[name], targets, k) for k in config.ks}
              for name in RANKERS}
    ndcg = {name: {k: ndcg_at(ranked[name], targets, k) for k in config.ks} for name in RANKERS}
    # The first batch pays one-time costs (graph tracing, allocator growth): leave it out.
    timed, first = (lists.timings[1:], min(size, len(events))) if len(lists.timings) > 1 \
        else (lists.timings, 0)
    ms_per_request = sum(t.total for t in timed) / (len(events) - first)
    report = EvaluationReport(
        split=test.split, requests=int(len(events)), candidates=int(len(known)),
        outside_catalog=int((~known).sum()), capped=int(capped),
        train_events=int(test.train.events), ks=tuple(config.ks), recall=recall, ndcg=ndcg,
        ms_per_request=ms_per_request, seconds=time.perf_counter() - start,
        device=str(engine.device))
    if config.out is not None:
        report = write_outputs(report, config.out)
    return report


def _progress(batches):
    from tqdm.auto import tqdm

    return tqdm(batches, desc="evaluate", unit="batch", leave=False)


def _features(log: BehaviourLog, rows: np.ndarray, events: np.ndarray) -> dict:
    """The feature graph's input tensors of the requests (rows, events) of ``log``."""
    features = requests_at(log, rows, events).features
    return {name: tf.constant(value, tf.string if name == "country" else tf.int64)
            for name, value in features.items()}


def _histories(features: dict) -> list[np.ndarray]:
    """Each request's history (item ids, oldest first) from its features."""
    items = features["history_items"].numpy()
    splits = features["history_splits"].numpy()
    return [items[splits[b]:splits[b + 1]] for b in range(len(splits) - 1)]


def write_outputs(report: EvaluationReport, out: str | os.PathLike) -> EvaluationReport:
    """The JSON report and the plot (recall@K and NDCG@K against K for each ranker) in
    ``out`` (created); returns ``report`` with ``files`` naming them."""
    import dataclasses

    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    plot = write_plot(report, folder / PLOT_FILE)
    path = folder / REPORT_FILE
    report = dataclasses.replace(report, files={"report": str(path), "plot": str(plot)})
    path.write_text(json.dumps(report.to_json(), indent=2))
    return report


def write_plot(report: EvaluationReport, path: Path) -> Path:
    """recall@K and NDCG@K against K, one line per ranker, side by side, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(10, 4))
    ks = list(report.ks)
    for axis, (title, values) in zip(axes, (("recall@K", report.recall),
                                            ("NDCG@K", report.ndcg))):
        for name in RANKERS:
            axis.plot(ks, [values[name][k] for k in ks], marker="o", label=name)
        axis.set_xscale("log" if len(ks) > 1 and ks[-1] / ks[0] >= 10 else "linear")
        axis.set_xticks(ks, [str(k) for k in ks])
        axis.set_xlabel("K")
        axis.set_title(title)
        axis.grid(alpha=0.3)
    axes[0].legend()
    figure.suptitle(f"{report.requests} requests, {report.split['kind']} split")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path
