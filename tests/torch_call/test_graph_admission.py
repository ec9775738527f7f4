"""Which shape buckets keep a CUDA graph (``graph_admission.h``): the policy is plain C++
bookkeeping, built here with the op build's compiler and driven by traces of shape keys, so
the rule that protects the served path's graphs is checked without a GPU."""

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [ROOT / "custom_ops/cc/torch_call/torch/graph_admission.cc",
           Path(__file__).with_name("graph_admission_driver.cc")]


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    compiler = shutil.which("g++")
    if compiler is None:
        pytest.skip("no g++: the op libraries could not have been built either")
    binary = tmp_path_factory.mktemp("admission") / "driver"
    subprocess.run([compiler, "-std=c++20", "-O1", f"-I{ROOT}", *map(str, SOURCES), "-o",
                    str(binary)], check=True)

    def run(keys, max_graphs, window=0):
        done = subprocess.run([str(binary), str(max_graphs), str(window)],
                              input="".join(f"{k}\n" for k in keys), capture_output=True,
                              text=True, check=True, timeout=60)
        *actions, summary = done.stdout.splitlines()
        _, held, _, tracked = summary.split()
        return actions, int(held), int(tracked)
    return run


def _counts(actions):
    return {kind: sum(a.split()[0] == kind for a in actions)
            for kind in ("capture", "replay", "eager")}


def test_while_there_is_room_each_new_shape_is_captured_once(driver):
    actions, held, _ = driver(["a", "b", "a", "c", "b", "a"], max_graphs=4)
    assert actions == ["capture", "capture", "replay", "capture", "replay", "replay"]
    assert held == 3


def test_a_full_budget_runs_a_shape_seen_once_eagerly_and_keeps_its_graphs(driver):
    actions, held, _ = driver(["a", "b", "a", "b", "c", "a", "b"], max_graphs=2)
    assert actions == ["capture", "capture", "replay", "replay", "eager", "replay", "replay"]
    assert held == 2


def test_a_shape_seen_more_often_than_the_weakest_graph_replaces_it(driver):
    # a is seen three times, b once: c replaces b on its second sighting, never a.
    actions, held, _ = driver(["a", "a", "b", "a", "c", "c", "c", "b"], max_graphs=2)
    assert actions == ["capture", "replay", "capture", "replay", "eager", "capture b",
                       "replay", "eager"]
    assert held == 2


def test_among_equally_seen_graphs_the_least_recently_used_goes(driver):
    # a, b and c are seen twice each, c least recently: d replaces c once seen 3 times.
    actions, _, _ = driver(["a", "b", "c", "c", "b", "a", "d", "d", "d", "d"], max_graphs=3)
    assert actions[-4:] == ["eager", "eager", "capture c", "replay"]


def test_one_off_shapes_never_push_out_the_shapes_that_serve_most_calls(driver):
    """Traffic with far more shapes than graphs: four hot shapes take most calls, and a long
    tail of shapes seen once each. Least-recently-used replacement would capture on every
    tail call and drop hot graphs; here the hot shapes replay, the tail runs eagerly."""
    rng = np.random.default_rng(0)
    keys = []
    for call in range(4000):
        keys.append(f"hot{rng.integers(4)}" if rng.random() < 0.7 else f"tail{call}")
    actions, held, _ = driver(keys, max_graphs=6)
    hot = [a for k, a in zip(keys, actions) if k.startswith("hot")]
    tail = [a for k, a in zip(keys, actions) if k.startswith("tail")]
    assert _counts(hot) == {"capture": 4, "replay": len(hot) - 4, "eager": 0}
    # Only the first tail shapes, while the budget had room, were captured.
    assert _counts(tail) == {"capture": 2, "replay": 0, "eager": len(tail) - 2}
    assert held == 6


def test_counts_age_so_a_new_steady_shape_takes_over_from_one_that_stopped(driver):
    window = 64
    keys = ["old", "other"] * 200 + ["new", "other"] * 200
    actions, _, _ = driver(keys, max_graphs=2, window=window)
    new = [a for k, a in zip(keys, actions) if k == "new"]
    assert new.count("capture old") == 1
    # The old shape's count of 200 halves every window: the new one takes over within a few.
    assert new.index("capture old") < 3 * window
    assert all(a == "replay" for a in new[new.index("capture old") + 1:])


def test_the_shapes_it_remembers_stay_bounded_under_endless_new_shapes(driver):
    window = 128
    _, held, tracked = driver([f"s{i}" for i in range(20000)], max_graphs=4, window=window)
    assert held == 4 and tracked <= 2 * window + 4
