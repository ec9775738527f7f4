"""The environment the serving benchmarks give their child processes (``xgr export``,
``xgr serve``): the checkout first, and the caller's own import path kept after it, so a host
whose TensorFlow lives in a folder of its own still finds it in the child."""

import os

from benchmarks.serve_process import ROOT, child_env


def test_the_callers_import_path_is_kept_after_the_checkout(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["/opt/tf_site", "/opt/extra"]))
    env = child_env(TF_CPP_MIN_LOG_LEVEL="2")
    assert env["PYTHONPATH"].split(os.pathsep) == [ROOT, "/opt/tf_site", "/opt/extra"]
    assert env["TF_CPP_MIN_LOG_LEVEL"] == "2"


def test_without_an_import_path_the_checkout_alone(monkeypatch):
    monkeypatch.delenv("PYTHONPATH", raising=False)
    assert child_env()["PYTHONPATH"] == ROOT
