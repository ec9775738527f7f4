"""TF Serving's file-system version policy for one model: serve the newest version that works.

``<model_base_path>/<N>/saved_model.pb`` is version ``N``. Each poll (every
``file_system_poll_wait_seconds``) looks at the folders on disk, newest first:

* a version newer than the serving one is loaded next to it and warmed up (its
  ``assets.extra/tf_serving_warmup_requests`` replayed); only when every warm-up request was
  answered is it swapped in, and the old one unloads after its in-flight requests finished:
  no request is dropped across a version change;
* a version that fails to load or to warm up stays out: its status is END with the error, an
  ERROR log line and ``/healthz`` say so, the serving version keeps serving, and the failed one
  is retried only when its files change. It never blocks an older or newer good version;
* when the serving version's folder is removed, the newest remaining version that loads takes
  over (loaded first, so requests keep being answered), and the removed one unloads; with none
  left the model stops serving.

A version is never downgraded while its folder exists: an older folder appearing is ignored.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import threading
import time
from typing import Callable, Iterator

from xgr_common.errors import NotFoundError, UnavailableError
from tf_frontend.serving.config import ServerConfig
from tf_frontend.serving.public_text import full_detail, public_text
from tf_frontend.serving.servable import ServableVersion, VersionRetired
from tf_frontend.serving.warmup import run_warmup, warm_batch_sizes

LOG = logging.getLogger("xgr.serving")


@dataclasses.dataclass(frozen=True)
class VersionStatus:
    """TF Serving's ModelVersionStatus: state is LOADING, AVAILABLE, UNLOADING or END; ``error``
    (what failed, without server paths) is set for a version that failed to load."""

    version: int
    state: str
    error: str = ""


def _fingerprint(path: str) -> tuple[int, float, int]:
    """Changes whenever a file under ``path`` is added, removed or rewritten."""
    count, newest, size = 0, 0.0, 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                info = os.stat(os.path.join(root, name))
            except OSError:
                continue
            newest, size, count = max(newest, info.st_mtime), size + info.st_size, count + 1
    return count, newest, size


class ModelManager:
    def __init__(self, config: ServerConfig,
                 observe_batch: Callable[[int, float], None] = lambda rows, seconds: None,
                 observe_drop: Callable[[str], None] = lambda reason: None,
                 observe_pending: Callable[[int], None] = lambda delta: None):
        self._config = config
        self._observe_batch, self._observe_drop = observe_batch, observe_drop
        self._observe_pending = observe_pending
        self._lock = threading.Lock()
        self._serving: ServableVersion | None = None
        self._status: dict[int, VersionStatus] = {}
        self._failed: dict[int, tuple[int, float, int]] = {}   # version -> fingerprint it failed with
        self._poll_lock = threading.Lock()   # one poll at a time (poller thread, start, tests)
        self._stop = threading.Event()
        self._poller: threading.Thread | None = None

    @property
    def name(self) -> str:
        return self._config.model_name

    def ready_versions(self) -> list[int]:
        """Complete version directories (numeric name, ``saved_model.pb`` present)."""
        base = self._config.model_base_path
        try:
            entries = os.listdir(base)
        except OSError as e:
            LOG.warning("cannot list model base path", extra={"path": base, "error": str(e)})
            return []
        return sorted(int(e) for e in entries if e.isdigit()
                      and os.path.exists(os.path.join(base, e, "saved_model.pb")))

    def _path(self, version: int) -> str:
        return os.path.join(self._config.model_base_path, str(version))

    # -- the policy ---------------------------------------------------------------------------
    def poll_once(self) -> None:
        """One scan: load, swap or unload as the folders on disk ask (see the module doc)."""
        with self._poll_lock:
            on_disk = self.ready_versions()
            self._forget_removed(on_disk)
            with self._lock:
                serving = self._serving
            serving_number = serving.version if serving is not None else None
            for number in sorted(on_disk, reverse=True):
                if self._stop.is_set() or number == serving_number:
                    break
                if serving_number in on_disk and number < serving_number:
                    break       # never downgrade a version whose folder is still there
                if self._failed_unchanged(number):
                    continue
                loaded = self._load(number)
                if loaded is not None:
                    self._swap_in(loaded)
                    return
            if serving is not None and serving_number not in on_disk:
                self._retire(serving, replacement=None)

    def _failed_unchanged(self, number: int) -> bool:
        failed = self._failed.get(number)
        return failed is not None and failed == _fingerprint(self._path(number))

    def _forget_removed(self, on_disk: list[int]) -> None:
        """A failed version whose folder is gone is no longer a deploy problem to report."""
        for number in [n for n in self._failed if n not in on_disk]:
            del self._failed[number]
            with self._lock:
                self._status.pop(number, None)

    def _load(self, number: int) -> ServableVersion | None:
        path = self._path(number)
        fingerprint = _fingerprint(path)
        self._set_status(number, "LOADING")
        LOG.info("loading model version", extra={"model": self.name, "version": number})
        started = time.perf_counter()
        loaded = None
        try:
            loaded = ServableVersion(self.name, number, path, self._config.batching,
                                     observe_batch=self._observe_batch,
                                     limits=self._config.limits, observe_drop=self._observe_drop,
                                     observe_pending=self._observe_pending)
            warmed = run_warmup(loaded)
            batching = self._config.batching
            warm_batch_sizes(loaded, self._config.warmup_batches,
                             batching.max_batch_size if batching is not None else None)
        except Exception as e:  # any load failure is reported, never fatal to the server
            if loaded is not None:
                loaded.unload(time.monotonic())
            self._failed[number] = fingerprint
            error = public_text(f"{type(e).__name__}: {e}")
            self._set_status(number, "END", error)
            with self._lock:
                serving = self._serving.version if self._serving is not None else None
            LOG.error("model version failed to load; it is not served",
                      extra={"model": self.name, "version": number, "error": full_detail(e),
                             "serving_version": serving})
            return None
        self._failed.pop(number, None)
        LOG.info("model version loaded and warmed up",
                 extra={"model": self.name, "version": number, "warmup_requests": warmed,
                        "seconds": round(time.perf_counter() - started, 3)})
        return loaded

    def _swap_in(self, loaded: ServableVersion) -> None:
        with self._lock:
            retired, self._serving = self._serving, loaded
            self._status[loaded.version] = VersionStatus(loaded.version, "AVAILABLE")
        LOG.info("model version available",
                 extra={"model": self.name, "version": loaded.version,
                        "signatures": sorted(loaded.signatures),
                        "replaces": retired.version if retired is not None else None})
        if retired is not None:
            self._retire(retired, replacement=loaded)

    def _retire(self, old: ServableVersion, replacement: ServableVersion | None) -> None:
        with self._lock:
            if self._serving is old:
                self._serving = None
            self._status[old.version] = VersionStatus(old.version, "UNLOADING")
        if replacement is None:
            LOG.warning("the serving version's folder was removed and no other version loads; "
                        "the model is not served",
                        extra={"model": self.name, "version": old.version})
        old.unload(time.monotonic() + self._config.shutdown_grace_seconds)
        self._set_status(old.version, "END")
        LOG.info("model version unloaded", extra={"model": self.name, "version": old.version})

    def _set_status(self, version: int, state: str, error: str = "") -> None:
        with self._lock:
            self._status[version] = VersionStatus(version, state, error)

    # -- life cycle ---------------------------------------------------------------------------
    def _poll_loop(self) -> None:
        while not self._stop.wait(self._config.file_system_poll_wait_seconds):
            try:
                self.poll_once()
            except Exception as e:  # the poller must outlive any one bad scan
                LOG.error("version poll failed", extra={"model": self.name,
                                                        "error": full_detail(e)})

    def start(self) -> None:
        self.poll_once()
        if self._config.file_system_poll_wait_seconds > 0:
            self._poller = threading.Thread(target=self._poll_loop, name="version-poller",
                                            daemon=True)
            self._poller.start()

    def stop(self, deadline: float | None = None) -> None:
        """Stops polling and unloads the serving version, waiting until ``deadline``
        (``time.monotonic``; default: the shutdown grace) for its requests. A load under way
        is not waited for past the deadline (the poller is a daemon thread)."""
        deadline = deadline if deadline is not None else (
            time.monotonic() + self._config.shutdown_grace_seconds)
        self._stop.set()
        if self._poller is not None:
            self._poller.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            serving, self._serving = self._serving, None
        if serving is not None:
            serving.unload(deadline, collect=False)
            self._set_status(serving.version, "END")

    # -- lookups ------------------------------------------------------------------------------
    def check_name(self, name: str) -> None:
        if name != self.name:
            raise NotFoundError(f"model {name!r} not found; this server serves {self.name!r}")

    def get(self, name: str, version: int | None) -> ServableVersion:
        """The serving version (the one asked for, or any when ``version`` is None):
        NotFoundError (404) for another model or version, UnavailableError (503) when no
        version loads although some exist."""
        self.check_name(name)
        with self._lock:
            serving = self._serving
            failed = sorted(v for v, s in self._status.items() if s.error)
        if serving is not None and version in (None, serving.version):
            return serving
        if serving is None and failed:
            raise UnavailableError(f"model {name!r} has no available version: version(s) "
                                   f"{failed} failed to load (see the model status)")
        if version is None:
            raise NotFoundError(f"model {name!r} has no available version yet")
        available = [serving.version] if serving is not None else []
        raise NotFoundError(f"model {name!r} version {version} is not available; "
                            f"available versions: {available}")

    @contextlib.contextmanager
    def admitted(self, name: str, version: int | None) -> Iterator[ServableVersion]:
        """The serving version, with one place in its request queue held for the block. A
        version retired between lookup and admission is looked up again, so a request that
        races a version swap is served by the new version instead of failing."""
        for _ in range(3):
            serving = self.get(name, version)
            place = contextlib.ExitStack()
            try:
                place.enter_context(serving.admit())
            except VersionRetired:
                continue
            with place:
                yield serving
            return
        raise UnavailableError(f"model {name!r} is changing versions; retry")

    def statuses(self, name: str, version: int | None) -> list[VersionStatus]:
        self.check_name(name)
        with self._lock:
            if version is None and self._status:
                return [self._status[v] for v in sorted(self._status, reverse=True)]
            if version in self._status:
                return [self._status[version]]
        if version is None:
            raise NotFoundError(f"no version of model {name!r} found under its base path")
        raise NotFoundError(f"model {name!r} version {version} not found")

    def health(self) -> tuple[bool, dict]:
        """(serving, body of ``/healthz``). A newer version that failed to load is reported
        next to the serving one: the server still serves, but the deploy did not happen."""
        with self._lock:
            serving = self._serving
            failed = [s for v, s in sorted(self._status.items()) if s.error and
                      (serving is None or v > serving.version)]
        body: dict = {"status": "SERVING" if serving is not None else "NOT_SERVING"}
        if failed:
            body["serving_version"] = serving.version if serving is not None else None
            body["failed_versions"] = [{"version": s.version, "error": s.error} for s in failed]
        return serving is not None, body

    def healthy(self) -> bool:
        return self.health()[0]
