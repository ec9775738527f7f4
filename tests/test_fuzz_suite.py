"""The fuzz suite: hypothesis-made hostile inputs for the server's gRPC and REST decoders,
for TorchCall with a real exported engine package (the tiny engine's export) and for the
DLPack bridge, and the bridge's buffer-lifetime cases, in one child
process (``tests/fuzz_suite.py``), so an abort kills the child, is counted, and never takes
the test session. Aborts must be 0; each surface must both accept and refuse cases.

The lifetime cases are the issue's: a torch buffer of 4 KB (freed memory reused: silent
garbage once) or 64 MB (unmapped: SIGSEGV once) handed to TF, then resized past its size, its
storage resized to nothing, or replaced, then dropped. TF must read the original values. The
raw-DLPack controls, which show the hazard is real, run last because they may kill the child.
"""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.child_env import child_env

# Heavy (one child process with its own TensorFlow and torch): not in `make test-quick`.
pytestmark = pytest.mark.heavy

SCRIPT = Path(__file__).with_name("fuzz_suite.py")
EXAMPLES = 200   # per surface; deterministic (derandomised hypothesis)
SIZES = (4096, 64 * 1024 * 1024)
LIFETIME = [f"resize:{case}:{size}" for size in SIZES for case in ("resize", "storage_resize", "set")]
CONTROLS = [f"raw:resize:{size}" for size in SIZES]
SURFACES = ("grpc", "rest", "torch_call", "dlpack")


@pytest.fixture(scope="module")
def child(tiny_engine_export, tmp_path_factory):
    saved_model, _, report = tiny_engine_export
    signature = tmp_path_factory.mktemp("fuzz") / "engine_signature.txt"
    signature.write_text(report["engine_signature"])
    torch_call = f"torch_call:{saved_model / 'assets' / 'engine.pt2'}:{signature}"
    checks = [torch_call if s == "torch_call" else s for s in SURFACES]
    done = subprocess.run([sys.executable, "-W", "ignore", str(SCRIPT), *checks, *LIFETIME,
                           *CONTROLS], capture_output=True, text=True, timeout=600,
                          env=child_env(TF_CPP_MIN_LOG_LEVEL="3", XGR_FUZZ_EXAMPLES=str(EXAMPLES)))
    surfaces = {name: dict(item.split("=") for item in counts.split())
                for name, counts in re.findall(r"^surface (\w+) (.*)$", done.stdout, re.M)}
    lifetime = {" ".join(line.split()[:3]): line.split()[3:] for line in done.stdout.splitlines()
                if line.startswith(("resize ", "raw "))}
    print(f"fuzz suite: {surfaces}; child exit code {done.returncode}")
    return done, surfaces, lifetime


def _failed(done) -> str:
    return f"child exited {done.returncode}:\n{done.stdout}\n{done.stderr[-4000:]}"


@pytest.mark.parametrize("surface", SURFACES)
def test_each_surface_ran_every_case_without_an_abort(child, surface):
    done, surfaces, _ = child
    assert surface in surfaces, _failed(done)   # missing: the child died in or before it
    counts = {k: int(v) for k, v in surfaces[surface].items()}
    assert counts["cases"] >= EXAMPLES, counts
    # Both outcomes occur: the cases reach the checks past the parsers, not only the parsers.
    outcomes = ("crossed", "refused") if surface == "dlpack" else ("accepted", "refused")
    assert all(counts[o] > 0 for o in outcomes), counts


@pytest.mark.parametrize("check", LIFETIME)
def test_the_tf_view_survives_what_torch_does_next(child, check):
    done, _, lifetime = child
    kind, case, size = check.split(":")
    assert f"{kind} {case} {size}" in lifetime, _failed(done)
    verdict, refused = lifetime[f"{kind} {case} {size}"]
    assert verdict == "ok"
    # Reallocating the storage is refused; replacing it (set_) is allowed and harmless.
    assert refused == ("refused=0" if case == "set" else "refused=1")


def test_raw_dlpack_shows_the_hazard_the_bridge_removes(child):
    done, _, lifetime = child
    for check in CONTROLS:
        _, case, size = check.split(":")
        verdict = lifetime.get(f"raw {case} {size}")
        # Either TF read garbage, or the child died reading freed memory.
        assert (verdict is not None and verdict[0] == "wrong") or (
            verdict is None and done.returncode < 0), (check, _failed(done))


def test_the_child_ended_cleanly_but_for_the_controls(child):
    done, _, lifetime = child
    assert done.returncode == 0 or (done.returncode < 0 and len(lifetime) >= len(LIFETIME)), \
        _failed(done)
