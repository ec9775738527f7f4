"""Loading an AOTInductor package from Python without the CPU-ISA probe builds."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import torch

from torch_engine.aoti_loading import loader_environment

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


def test_package_loads_without_isa_probe_builds_and_runs(tmp_path):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    x = torch.randn(5, 8)
    program = torch.export.export(net.eval(), (x,),
                                  dynamic_shapes=({0: torch.export.Dim("batch", max=64)},))
    package = torch._inductor.aoti_compile_and_package(program,
                                                       package_path=str(tmp_path / "mlp.pt2"))
    other = torch.randn(11, 8)
    torch.save({"x": other, "y": net(other).detach()}, tmp_path / "data.pt")
    # In the environment a serving process gets (libstdc++ preloaded where this one differs).
    done = subprocess.run([sys.executable, "-c", _CHILD, package, str(tmp_path / "data.pt")],
                          capture_output=True, text=True, timeout=300,
                          env=loader_environment())
    assert done.returncode == 0 and done.stdout.strip().endswith("OK"), done.stderr[-3000:]
