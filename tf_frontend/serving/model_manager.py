"""TF Serving's file-system version policy for one model: serve the newest version.

``<model_base_path>/<N>/saved_model.pb`` is version ``N``. A poll (every
``file_system_poll_wait_seconds``) loads a newer version next to the serving one, warms it
up, swaps it in atomically, and only then unloads the old one after its in-flight requests
finished: no request is dropped across a version change. A version that fails to load is
reported with its error and retried only when its files change; the old version keeps serving.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading

from xgr_common.errors import ServingError
from tf_frontend.serving.config import ServerConfig
from tf_frontend.serving.servable import ServableVersion
from tf_frontend.serving.warmup import run_warmup

LOG = logging.getLogger("xgr.serving")


@dataclasses.dataclass(frozen=True)
class VersionStatus:
    """TF Serving's ModelVersionStatus: state is LOADING, AVAILABLE, UNLOADING or END."""

    version: int
    state: str
    error: str = ""


def _fingerprint(path: str) -> tuple[int, float]:
    """Changes whenever a file under ``path`` is added, removed or rewritten."""
    count, newest = 0, 0.0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                newest = max(newest, os.stat(os.path.join(root, name)).st_mtime)
            except OSError:
                continue
            count += 1
    return count, newest


class ModelManager:
    def __init__(self, config: ServerConfig, observe_batch=lambda rows: None):
        self._config = config
        self._observe_batch = observe_batch
        self._lock = threading.Lock()
        self._serving: dict[int, ServableVersion] = {}
        self._status: dict[int, VersionStatus] = {}
        self._failed: dict[int, tuple[int, float]] = {}
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

    def poll_once(self) -> None:
        versions = self.ready_versions()
        if not versions:
            return
        newest = max(versions)
        path = os.path.join(self._config.model_base_path, str(newest))
        with self._lock:
            if newest in self._serving:
                return
        fingerprint = _fingerprint(path)
        if self._failed.get(newest) == fingerprint:
            return
        self._set_status(newest, "LOADING")
        LOG.info("loading model version", extra={"model": self.name, "version": newest})
        try:
            loaded = ServableVersion(self.name, newest, path, self._config.batching,
                                     self._config.max_history_events, self._observe_batch,
                                     self._config.max_request_rows)
            warmed = run_warmup(loaded)
        except Exception as e:  # any load failure is reported, never fatal to the server
            self._failed[newest] = fingerprint
            self._set_status(newest, "END", f"{type(e).__name__}: {e}")
            LOG.error("model version failed to load",
                      extra={"model": self.name, "version": newest, "error": str(e)})
            return
        with self._lock:
            retired = list(self._serving.values())
            self._serving = {newest: loaded}
            self._status[newest] = VersionStatus(newest, "AVAILABLE")
            for old in retired:
                self._status[old.version] = VersionStatus(old.version, "UNLOADING")
        LOG.info("model version available",
                 extra={"model": self.name, "version": newest, "warmup_requests": warmed,
                        "signatures": sorted(loaded.signatures)})
        for old in retired:
            old.unload(self._config.shutdown_grace_seconds)
            self._set_status(old.version, "END")
            LOG.info("model version unloaded", extra={"model": self.name, "version": old.version})

    def _set_status(self, version: int, state: str, error: str = "") -> None:
        with self._lock:
            self._status[version] = VersionStatus(version, state, error)

    def _poll_loop(self) -> None:
        while not self._stop.wait(self._config.file_system_poll_wait_seconds):
            try:
                self.poll_once()
            except Exception as e:  # the poller must outlive any one bad scan
                LOG.error("version poll failed", extra={"model": self.name, "error": str(e)})

    def start(self) -> None:
        self.poll_once()
        if self._config.file_system_poll_wait_seconds > 0:
            self._poller = threading.Thread(target=self._poll_loop, name="version-poller",
                                            daemon=True)
            self._poller.start()

    def stop(self) -> None:
        self._stop.set()
        if self._poller is not None:
            self._poller.join()
        with self._lock:
            serving, self._serving = list(self._serving.values()), {}
        for version in serving:
            version.unload(self._config.shutdown_grace_seconds)
            self._set_status(version.version, "END")

    # -- lookups ------------------------------------------------------------------------------
    def check_name(self, name: str) -> None:
        if name != self.name:
            raise ServingError(f"model {name!r} not found; this server serves {self.name!r}")

    def get(self, name: str, version: int | None) -> ServableVersion:
        """The serving version (newest when ``version`` is None); ServingError -> 404."""
        self.check_name(name)
        with self._lock:
            if version is None and self._serving:
                return self._serving[max(self._serving)]
            if version in self._serving:
                return self._serving[version]
            available = sorted(self._serving)
        if version is None:
            raise ServingError(f"model {name!r} has no available version yet")
        raise ServingError(f"model {name!r} version {version} is not available; "
                           f"available versions: {available}")

    def statuses(self, name: str, version: int | None) -> list[VersionStatus]:
        self.check_name(name)
        with self._lock:
            if version is None and self._status:
                return [self._status[v] for v in sorted(self._status, reverse=True)]
            if version in self._status:
                return [self._status[version]]
        if version is None:
            raise ServingError(f"no version of model {name!r} found under "
                               f"{self._config.model_base_path}")
        raise ServingError(f"model {name!r} version {version} not found")

    def healthy(self) -> bool:
        with self._lock:
            return bool(self._serving)
