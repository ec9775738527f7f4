"""Shared test set-up: the Triton interpreter on machines without a GPU, the gpu marker,
test modules that need TensorFlow skipped where it is not installed (the GPU machine), and the
session fixtures that build in a child process (the quick fit, the tiny engine's export)."""

import importlib.util
import json
import os

# Must be decided before triton is first imported anywhere in the test process.
if not os.environ.get("CUDA_VISIBLE_DEVICES") == "" and os.path.exists("/dev/nvidia0"):
    pass
else:
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402

from xgr_common.import_order import preload_triton  # noqa: E402

# Tests import TensorFlow and Triton in one process; TF first would abort on the triton import.
preload_triton()


_HAS_TF = importlib.util.find_spec("tensorflow") is not None
_NO_TF = "TensorFlow is not installed here: this module runs where `make test` runs"


# Top-level packages that exist only beside TensorFlow.
_TF_PACKAGES = {"tensorflow", "tensorflow_serving", "tf_keras", "keras", "tf2onnx"}


def _needs_tf(error: BaseException) -> bool:
    cause = error.__cause__
    return (isinstance(cause, ModuleNotFoundError)
            and (cause.name or "").split(".")[0] in _TF_PACKAGES)


class _ModuleSkippedWithoutTF(pytest.Module):
    """A test module whose import fails only for want of TensorFlow is skipped, not an error,
    so ``make test-gpu`` collects the engine and kernel tests on a machine without TF."""

    def _getobj(self):
        try:
            return super()._getobj()
        except self.CollectError as error:
            if _needs_tf(error):
                pytest.skip(_NO_TF, allow_module_level=True)
            raise


def pytest_pycollect_makemodule(module_path, parent):
    if _HAS_TF or module_path.name == "conftest.py":
        return None
    return _ModuleSkippedWithoutTF.from_parent(parent, path=module_path)


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


# Session fixtures of costly builds: the quick demo fit (``tests/pipeline``), the TorchCall
# test packages, AOTInductor among them (``tests/torch_call``), the tiny engine's export and
# the tiny cached package. A test that uses one is heavy: ``make test-quick`` leaves it out.
HEAVY_FIXTURES = frozenset({"quick_run", "packages", "cuda_packages", "tiny_engine_export",
                            "tiny_cached_package"})


# `make test` runs on two workers (pytest-xdist, ``--dist loadgroup``). A session fixture is
# built once per worker, so the tests of each costly one form one group, which one worker
# runs; every other test is grouped by its module (a module's fixtures are built once too).
SHARED_BUILDS = (*sorted(HEAVY_FIXTURES), "engine_models", "stand_ins")


def _worker_group(item) -> str:
    names = getattr(item, "fixturenames", ())
    return next((name for name in SHARED_BUILDS if name in names), item.nodeid.split("::")[0])


@pytest.hookimpl(tryfirst=True)  # before ``-m`` selects by marker
def pytest_collection_modifyitems(config, items):
    for item in items:
        if HEAVY_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.heavy)
        item.add_marker(pytest.mark.xdist_group(_worker_group(item)))
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device; runs with `make test-gpu` on the GPU machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook, called in the controller
def pytest_xdist_node_collection_finished(node, ids):
    """Under ``--dist loadgroup`` pytest-xdist tags each node id with its group; where a pytest
    release stores node ids so that the tag is lost, every costly build would run on both
    workers (and past CI's time limits): stop with the reason instead."""
    if node.config.getoption("dist") == "loadgroup" and ids and not any("@" in i for i in ids):
        pytest.exit(f"pytest-xdist's --dist loadgroup does not group tests under pytest "
                    f"{pytest.__version__}: install the pytest pinned in requirements.txt",
                    returncode=pytest.ExitCode.USAGE_ERROR)


@pytest.fixture(scope="session")
def tiny_engine_export(tmp_path_factory):
    """(SavedModel folder, stdout, JSON report) of the session's one export of the tiny
    engine (``tests/tiny_export.py``)."""
    from tests.tiny_export import export_tiny

    return export_tiny(tmp_path_factory.mktemp("tiny_engine_export"))


@pytest.fixture(scope="session")
def tiny_cached_package(tmp_path_factory):
    """The session's one CPU package of a tiny version 2 model with the prompt-KV cache
    (``tests/export/tiny_cached.py``), its engine and spec."""
    from tests.export.tiny_cached import export_tiny_cached

    return export_tiny_cached(tmp_path_factory.mktemp("tiny_cached"), "cpu")


@pytest.fixture(scope="session")
def quick_run(tmp_path_factory):
    """(cache dir, stdout, JSON report) of ``xgr demo --quick`` on its 300 held-out users: the
    session's one quick fit. It runs in a child process because torch's optimiser imports
    Triton, which aborts a process that imported TensorFlow first (this one may have)."""
    from tests.pipeline.conftest import run_xgr

    cache = tmp_path_factory.mktemp("xgr_cache")
    report = cache / "report.json"
    proc = run_xgr("demo", "--quick", f"--cache_dir={cache}", f"--report_json={report}",
                   "--users=300", "--batch_size=100", "--show_users=2", "--recall_at=10,50",
                   timeout=1200)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return cache, proc.stdout, json.loads(report.read_text())


@pytest.fixture(scope="session")
def quick_model(quick_run):
    """The quick fit, loaded from the cache the demo wrote."""
    from xgr_world import default_model

    fitted = default_model.fit_or_load(default_model.QUICK, quick_run[0], progress=False)
    assert fitted.loaded
    return fitted
