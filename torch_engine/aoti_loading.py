"""Loading an AOTInductor package from Python (``torch._inductor.aoti_load_package``) without
Inductor's CPU-ISA build probe.

Before it loads a package, Inductor compares the package's recorded CPU vector ISA with this
machine's, and finds this machine's by compiling and ``dlopen``-ing a probe C++ file for each
ISA the CPU flags allow (AMX, AVX512-VNNI, AVX512, AVX2), once per process. On a GPU serving
host that took so long per fresh process that a Python process serving a package seemed to hang
before its first call. The comparison only
logs a warning on a mismatch, and the package's code is already compiled, so the probes are
skipped (``cpp.vec_isa_ok = False``: no vector ISA is claimed for this machine, which costs the
one "Device information mismatch for AOTI_CPU_ISA" warning). Claiming the ISAs from the CPU
flags instead (``True``) still builds probes for their sub-features (AVX512-BF16, VNNI, AMX).
TorchCall's C++ loader never runs the probe.

A second trap on the same host: a package's wrapper library carries its own static copy of the
C++ runtime of the compiler that built it (``ldd`` lists no ``libstdc++``), and its
``std::regex`` (parsing the device string while the model is built) ended in SIGSEGV inside
``std::codecvt`` while the process's own C++ objects came from the shared ``libstdc++`` that
torch's libraries map: the two copies disagree on the locale facets. A process started with
the compiler's own ``libstdc++.so`` preloaded loads and runs the same package: preloaded, the
shared library comes first in the global symbol scope and interposes the wrapper's exported
C++ runtime symbols, so one copy serves both. Mapping the same file later (as torch's
libraries do, outside the global scope) does not, so the preload is needed even when that file
is the compiler's.
``loader_environment`` gives that environment for a process that will load packages (it cannot
be changed in a running process); ``preloaded`` tells whether this process started with it.

Extraction folders: a load unpacks the package into a fresh temporary folder (torch 2.13:
``$TMPDIR/aotinductor_XXXXXX``; torch 2.11: ``/tmp/XXXXXX`` whatever ``TMPDIR`` says), a few
MB each. The loader removes it when it is destroyed, so a process that ends without destroying
it (SIGTERM, SIGKILL, a crash, ``os._exit``) leaves it behind, and a failed load
leaves two (torch retries once). A CUDA model reads its kernel binaries from it at its first
call, so it cannot go right after the load. ``load_package`` gives each load a private folder
``xgr-aoti-*`` in the temporary directory, ``flock``-ed while the model lives, and torch extracts
into it (``TMPDIR`` points there during the load; where torch ignores ``TMPDIR``, the folder it
used is read from ``/proc/self/maps`` and recorded there). The folder goes when the model is
garbage-collected or the interpreter exits, at once when the load fails, and otherwise at the
next ``load_package`` of any process, which removes every such folder that no living process
holds locked. Where torch ignores ``TMPDIR``, a failed load maps nothing, so its folders
cannot be told from other processes' and stay behind.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import stat
import subprocess
import tempfile
import threading
import weakref
from pathlib import Path

_CLAIM_PREFIX = "xgr-aoti-"
# Inside a claim: the folders a torch that ignores TMPDIR extracted into, one a line.
_ELSEWHERE_RECORD = "extracted-elsewhere"
# In every path a package's libraries are mapped from: <folder>/<archive>/data/aotinductor/...
_ARCHIVE_MARK = "/data/aotinductor/"
# TMPDIR is process-wide, and a load is told from another by the libraries it maps: loads in
# this process take turns, so none extracts into another's claim or takes its mappings. (A child
# process another thread starts during a load inherits the claim as its TMPDIR.)
_LOADING = threading.Lock()


def load_package(path: str | Path, device_index: int | None = None,
                 run_single_threaded: bool = False):
    """``torch._inductor.aoti_load_package(path)`` without the CPU-ISA probe builds; returns
    the package's callable. ``run_single_threaded``: one runner without the container's
    CUDA-event queries, as a CUDA graph capture of its calls needs. The folder the package is
    extracted into goes with the callable (see the module docstring)."""
    import torch._inductor

    kwargs = {} if device_index is None else {"device_index": device_index}
    if run_single_threaded:
        kwargs["run_single_threaded"] = True
    _remove_orphaned_claims()
    claim = _Claim.take()
    try:
        with _LOADING:
            mapped_before = _mapped_extractions()
            with _temp_dir(claim.folder), torch._inductor.config.patch({"cpp.vec_isa_ok": False}):
                model = torch._inductor.aoti_load_package(str(path), **kwargs)
            claim.record_elsewhere(_extracted_elsewhere(_mapped_extractions() - mapped_before,
                                                        Path(path)))
        # On the loader, not on the callable: copies of the callable share the loader's files.
        weakref.finalize(model.loader, claim.release)
    except BaseException:
        claim.release()
        raise
    return model


class _Claim:
    """A private folder in the temporary directory that one load extracts into, ``flock``-ed
    while its model lives: a later sweep tells it from one a dead process left."""

    def __init__(self, folder: Path, lock: int):
        self.folder = folder
        self._lock = lock
        self._elsewhere: list[Path] = []

    @classmethod
    def take(cls) -> "_Claim":
        # Made and locked under a name sweeps skip, then renamed (the lock stays with the
        # open folder): a sweep never finds a claim unlocked while its process lives.
        staging = Path(tempfile.mkdtemp(prefix="." + _CLAIM_PREFIX))
        lock = os.open(staging, os.O_RDONLY | os.O_DIRECTORY)
        fcntl.flock(lock, fcntl.LOCK_EX)
        folder = staging.with_name(staging.name[1:])
        os.rename(staging, folder)
        return cls(folder, lock)

    def record_elsewhere(self, folders: list[Path]) -> None:
        """Remembers extraction folders outside the claim, for ``release`` and for a sweep
        after this process dies."""
        self._elsewhere = folders
        if folders:
            (self.folder / _ELSEWHERE_RECORD).write_text("".join(f"{f}\n" for f in folders))

    def release(self) -> None:
        for folder in self._elsewhere:
            shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(self.folder, ignore_errors=True)
        os.close(self._lock)


@contextlib.contextmanager
def _temp_dir(folder: Path):
    """``TMPDIR`` set to ``folder``: where torch's C++ loader (``temp_directory_path``) extracts.
    Python's ``tempfile`` keeps the directory it chose before (``_Claim.take`` made it choose)."""
    previous = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(folder)
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = previous


def _mapped_extractions() -> set[Path]:
    """The folders this process maps AOTInductor package libraries from; empty where
    ``/proc/self/maps`` cannot be read."""
    try:
        with open("/proc/self/maps") as maps:
            lines = maps.read().splitlines()
    except OSError:
        return set()
    folders = set()
    for line in lines:
        fields = line.split(maxsplit=5)  # address, perms, offset, device, inode, path
        if len(fields) == 6 and _ARCHIVE_MARK in fields[5]:
            folders.add(Path(fields[5].split(_ARCHIVE_MARK)[0]).parent)
    return folders


def _temp_roots() -> set[Path]:
    return {Path(os.path.realpath(tempfile.gettempdir())), Path("/tmp")}


def _extracted_elsewhere(new_folders: set[Path], package: Path) -> list[Path]:
    """Of the folders a load started mapping libraries from, those a torch that ignores
    ``TMPDIR`` extracted into: directly in a temporary directory, and not holding the package
    itself (an unpacked package is loaded where it lies)."""
    package = Path(os.path.realpath(package))
    return sorted(folder for folder in new_folders
                  if folder.parent in _temp_roots()
                  and folder != package and folder not in package.parents)


def _recorded_elsewhere(claim: Path) -> list[Path]:
    """The folders ``claim`` records, kept only where they still look like what was recorded:
    a folder of this user's, not a link, directly in a temporary directory."""
    try:
        lines = (claim / _ELSEWHERE_RECORD).read_text().splitlines()
    except OSError:
        return []
    folders = [Path(line) for line in lines if line]
    return [folder for folder in folders
            if folder.is_absolute() and folder.parent in _temp_roots() and _is_own_folder(folder)]


def _is_own_folder(path: Path) -> bool:
    """Whether ``path`` is a folder (not a link to one) of this process's user."""
    try:
        status = path.lstat()
    except OSError:
        return False
    return stat.S_ISDIR(status.st_mode) and status.st_uid == os.getuid()


def _remove_orphaned_claims() -> None:
    """Removes the claims (and what they record) of loads whose process ended without
    removing them: those no living process holds locked."""
    for claim in Path(tempfile.gettempdir()).glob(_CLAIM_PREFIX + "*"):
        _remove_if_orphaned(claim)


def _remove_if_orphaned(claim: Path) -> None:
    try:
        lock = os.open(claim, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return  # removed meanwhile, or a file or a link: not a claim
    try:
        if os.fstat(lock).st_uid != os.getuid():
            return
        try:
            # flock, not lockf: its locks belong to the open folder, not to the process, so a
            # live claim of this very process is seen as held too.
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return  # held: its model is alive (or the folder cannot be locked: left alone)
        for folder in _recorded_elsewhere(claim):
            shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(claim, ignore_errors=True)
    finally:
        os.close(lock)


def compiler_libstdcxx() -> Path | None:
    """The shared ``libstdc++`` of the C++ compiler Inductor builds packages with (``g++``, else
    ``c++``), resolved; None when there is no compiler or it names no such file."""
    compiler = shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        return None
    try:
        found = subprocess.run([compiler, "-print-file-name=libstdc++.so"], capture_output=True,
                               text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    path = Path(found)
    return path.resolve() if path.is_absolute() and path.exists() else None


def loader_environment(base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) for a child process that loads
    AOTInductor packages with ``load_package``: ``LD_PRELOAD`` starts with the compiler's
    ``libstdc++`` (see the module docstring); unchanged where no compiler is found."""
    env = dict(os.environ if base is None else base)
    library = compiler_libstdcxx()
    if library is None:
        return env
    preload = [str(library), *filter(None, env.get("LD_PRELOAD", "").split(":"))]
    env["LD_PRELOAD"] = ":".join(dict.fromkeys(preload))
    return env


def preloaded(env: dict[str, str] | None = None) -> bool:
    """Whether ``env`` (default: this process's environment) already holds what
    ``loader_environment`` adds: nothing to restart a process for."""
    env = dict(os.environ if env is None else env)
    return loader_environment(env) == env
