"""Loading an AOTInductor package from Python without the CPU-ISA probe builds, and without
leaving its extraction folder behind."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
import torch

from tests.child_env import child_env
from torch_engine.aoti_loading import loader_environment

# Heavy (AOTInductor packages loaded in child processes): left out of `make test-quick`.
pytestmark = pytest.mark.heavy

# A fresh process: Inductor remembers each ISA's probe result per process.
_CHILD = textwrap.dedent("""
    import sys, torch
    from torch._inductor import cpu_vec_isa
    from torch_engine.aoti_loading import load_package

    def no_probe_builds(*args, **kwargs):
        raise AssertionError("aoti_load_package compiled a CPU-ISA probe")

    cpu_vec_isa.VecISA.check_build = no_probe_builds
    runner = load_package(sys.argv[1])
    data = torch.load(sys.argv[2])
    got = runner(data["x"])
    got = got[0] if isinstance(got, (list, tuple)) else got
    assert torch.allclose(got, data["y"], rtol=1e-5, atol=1e-5), (got, data["y"])
    print("OK")
""")

# A process that uses a package as a server would, one step after another:
#   fail      loads a package whose library is broken: the load raises
#   serve     loads, answers, then drops the model: its files go with it
#   die       loads, answers, prints the library's path, then is killed (SIGKILL)
#   old_torch as die, with a loader that extracts into the temporary directory whatever TMPDIR
#             says, as torch 2.11's does (into /tmp)
#   hold      loads, prints the library's path, answers once stdin says so
_LIFECYCLE_CHILD = textwrap.dedent("""
    import gc, os, signal, sys, tempfile, torch
    from torch_engine.aoti_loading import load_package

    package, broken, data_path, *steps = sys.argv[1:]
    data = torch.load(data_path)
    temp_dir = tempfile.gettempdir()

    def mapped_library():
        with open("/proc/self/maps") as maps:
            [path] = {line.split()[-1] for line in maps if line.rstrip().endswith(".wrapper.so")}
        return path

    def answer(model):
        got = model(data["x"])
        got = got[0] if isinstance(got, (list, tuple)) else got
        assert torch.allclose(got, data["y"], rtol=1e-5, atol=1e-5), (got, data["y"])

    def loaded_as_by_torch_2_11():
        real = torch._C._aoti.AOTIModelPackageLoader

        def loader(*args):
            claim = os.environ["TMPDIR"]
            os.environ["TMPDIR"] = temp_dir
            try:
                return real(*args)
            finally:
                os.environ["TMPDIR"] = claim

        loader.load_metadata_from_package = real.load_metadata_from_package
        torch._C._aoti.AOTIModelPackageLoader = loader
        return load_package(package)

    for step in steps:
        if step == "fail":
            try:
                load_package(broken)
            except RuntimeError as error:
                assert "dlopen" in str(error), error
            else:
                raise AssertionError("a broken package loaded")
        elif step == "serve":
            model = load_package(package)
            answer(model)
            library = mapped_library()
            # In the load's claim where torch honours TMPDIR; torch 2.11 extracts directly
            # into /tmp whatever TMPDIR says (the claim records that folder).
            inside = library.startswith(temp_dir + "/")
            assert inside or os.path.dirname(library).startswith("/tmp/"), library
            assert os.path.isfile(library), library
            del model
            gc.collect()
            assert not os.path.exists(library), library
        elif step in ("die", "old_torch"):
            model = load_package(package) if step == "die" else loaded_as_by_torch_2_11()
            answer(model)
            print(mapped_library(), flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        elif step == "hold":
            model = load_package(package)
            print(mapped_library(), flush=True)
            sys.stdin.readline()
            answer(model)
    print("OK")
""")


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    """A small CPU package (compiled once for the module), a copy whose library is broken, and
    inputs with the eager answer."""
    folder = tmp_path_factory.mktemp("mlp")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    x = torch.randn(5, 8)
    program = torch.export.export(net.eval(), (x,),
                                  dynamic_shapes=({0: torch.export.Dim("batch", max=64)},))
    package = Path(torch._inductor.aoti_compile_and_package(
        program, package_path=str(folder / "mlp.pt2")))
    other = torch.randn(11, 8)
    torch.save({"x": other, "y": net(other).detach()}, folder / "data.pt")
    return package, _with_broken_library(package, folder / "broken.pt2"), folder / "data.pt"


def _with_broken_library(package: Path, out: Path) -> Path:
    with zipfile.ZipFile(package) as source, zipfile.ZipFile(out, "w") as broken:
        for member in source.infolist():
            is_library = member.filename.endswith(".wrapper.so")
            broken.writestr(member, b"not a library" if is_library else source.read(member))
    return out


def _lifecycle_env(temp_dir: Path, inductor_cache: Path) -> dict[str, str]:
    # Inductor's own cache out of the way, so whatever is left in temp_dir is the loads'.
    return loader_environment(child_env(TMPDIR=str(temp_dir),
                                        TORCHINDUCTOR_CACHE_DIR=str(inductor_cache)))


def _lifecycle(mlp, tmp_path: Path, *steps: str, **popen) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _LIFECYCLE_CHILD, *map(str, mlp), *steps],
                            env=_lifecycle_env(tmp_path / "tmp", tmp_path / "inductor_cache"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def _finished(child: subprocess.Popen, stdin: str | None = None) -> tuple[int, str, str]:
    out, err = child.communicate(stdin, timeout=300)
    return child.returncode, out, err


def _left_in(temp_dir: Path) -> list[str]:
    return sorted(str(path.relative_to(temp_dir)) for path in temp_dir.rglob("*"))


def test_loader_environment_preloads_the_compilers_libstdcxx(monkeypatch, tmp_path):
    from torch_engine import aoti_loading
    library = tmp_path / "libstdc++.so.6.0.33"
    library.write_bytes(b"")
    monkeypatch.setattr(aoti_loading, "compiler_libstdcxx", lambda: library)
    env = aoti_loading.loader_environment({"LD_PRELOAD": "/x/libfoo.so", "A": "1"})
    assert env == {"LD_PRELOAD": f"{library}:/x/libfoo.so", "A": "1"}
    # Already first: not repeated. No compiler: the environment is left as it was.
    assert aoti_loading.loader_environment(env) == env
    assert aoti_loading.preloaded(env) and not aoti_loading.preloaded({"A": "1"})
    monkeypatch.setattr(aoti_loading, "compiler_libstdcxx", lambda: None)
    assert aoti_loading.loader_environment({"A": "1"}) == {"A": "1"}
    assert aoti_loading.preloaded({"A": "1"})


def test_package_loads_without_isa_probe_builds_and_runs(mlp):
    package, _, data = mlp
    # In the environment a serving process gets (libstdc++ preloaded where this one differs).
    done = subprocess.run([sys.executable, "-c", _CHILD, str(package), str(data)],
                          capture_output=True, text=True, timeout=300,
                          env=loader_environment())
    assert done.returncode == 0 and done.stdout.strip().endswith("OK"), done.stderr[-3000:]


def test_extraction_folders_go_with_the_model_and_with_a_failed_load(mlp, tmp_path):
    (tmp_path / "tmp").mkdir()
    returncode, out, err = _finished(_lifecycle(mlp, tmp_path, "fail", "serve"))
    assert returncode == 0 and out.strip().endswith("OK"), err[-3000:]
    assert _left_in(tmp_path / "tmp") == []


def test_the_next_load_removes_what_killed_processes_left(mlp, tmp_path):
    temp_dir = tmp_path / "tmp"
    temp_dir.mkdir()
    killed = []
    for step in ("die", "old_torch"):
        returncode, out, err = _finished(_lifecycle(mlp, tmp_path, step))
        assert returncode == -9, err[-3000:]
        killed.append(Path(out.split()[0]))
        assert killed[-1].is_file(), _left_in(temp_dir)  # nothing can remove it before a load
    held = _lifecycle(mlp, tmp_path, "hold", stdin=subprocess.PIPE)
    try:
        held_library = Path(held.stdout.readline().strip())
        assert not any(library.exists() for library in killed), _left_in(temp_dir)
        returncode, out, err = _finished(_lifecycle(mlp, tmp_path, "serve"))
        assert returncode == 0 and out.strip().endswith("OK"), err[-3000:]
        # A living process's files stay: its model may still read them.
        assert held_library.is_file(), _left_in(temp_dir)
        returncode, out, err = _finished(held, "go\n")
        assert returncode == 0 and out.strip().endswith("OK"), err[-3000:]
    finally:
        if held.poll() is None:
            held.kill()
    assert _left_in(temp_dir) == []
