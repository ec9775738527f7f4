"""The synchronised first pass of a CUDA package's compile: Inductor's Python pass writes a
device synchronisation after every kernel, its C++ pass (the package) none, and Inductor is
left as it was afterwards."""

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from torch._inductor.codegen.simd import SIMDScheduling  # noqa: E402
from torch._inductor.utils import IndentedBuffer  # noqa: E402
from torch._inductor.virtualized import V  # noqa: E402

from xgr_export.inductor_first_pass import synchronised_first_pass  # noqa: E402


class _Ops:
    @staticmethod
    def synchronize() -> str:
        return "torch.cuda.synchronize()"


class _Graph:
    """The part of Inductor's graph that ``codegen_sync`` reads."""

    def __init__(self, cpp_wrapper: bool):
        self.cpp_wrapper = cpp_wrapper
        self.wrapper_code = IndentedBuffer()
        self.device_ops = _Ops()


def _written(cpp_wrapper: bool) -> str:
    graph = _Graph(cpp_wrapper)
    with V.set_graph_handler(graph):
        SIMDScheduling.codegen_sync(object.__new__(SIMDScheduling))
    return graph.wrapper_code.getvalue()


def test_only_the_python_pass_synchronises():
    import torch._inductor.config as inductor_config

    with synchronised_first_pass() as applied:
        assert applied
        assert inductor_config.triton.debug_sync_kernel
        assert _written(cpp_wrapper=False).strip() == "torch.cuda.synchronize()"
        assert _written(cpp_wrapper=True) == ""


def test_inductor_is_restored_afterwards():
    import torch._inductor.config as inductor_config

    original = SIMDScheduling.__dict__["codegen_sync"]
    with pytest.raises(RuntimeError):
        with synchronised_first_pass():
            raise RuntimeError("a failed compile")
    assert SIMDScheduling.__dict__["codegen_sync"] is original
    assert not inductor_config.triton.debug_sync_kernel
    # Inductor's own rule again: the synchronisation in either wrapper.
    assert _written(cpp_wrapper=True).strip() == "torch.cuda.synchronize()"


def test_a_cuda_compile_runs_its_first_pass_on_the_real_inputs_without_grad():
    import torch._inductor.config as inductor_config

    from xgr_export.inductor_first_pass import REAL_INPUT_FIRST_PASS, cuda_first_pass

    with cuda_first_pass("cuda:0") as configs:
        assert configs == REAL_INPUT_FIRST_PASS == {"triton.autotune_at_compile_time": False}
        assert not torch.is_grad_enabled()
        assert inductor_config.triton.debug_sync_kernel
    assert torch.is_grad_enabled() and not inductor_config.triton.debug_sync_kernel
    with cuda_first_pass("cpu") as configs:
        assert configs == {} and torch.is_grad_enabled()
        assert not inductor_config.triton.debug_sync_kernel


def test_package_aoti_hands_the_cuda_settings_to_the_compile(tmp_path, monkeypatch):
    """What ``package_aoti`` gives AOTInductor for a CUDA package: the real-input first pass,
    in no-grad mode, beside the contract's metadata; for a CPU package the metadata alone."""
    from xgr_export import torch_package

    seen = []

    def compile_and_package(program, package_path, inductor_configs):
        seen.append((dict(inductor_configs), torch.is_grad_enabled()))
        Path(package_path).write_bytes(b"package")
        return package_path

    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", compile_and_package)
    program = torch.export.export(torch.nn.Linear(4, 2), (torch.randn(3, 4),))
    for device in ("cuda:0", "cpu"):
        torch_package.package_aoti(program, tmp_path / f"{device[:3]}.pt2", device=device)
    (cuda, cuda_grad), (cpu, cpu_grad) = seen
    assert cuda["triton.autotune_at_compile_time"] is False and not cuda_grad
    assert "aot_inductor.metadata" in cuda
    assert set(cpu) == {"aot_inductor.metadata"} and cpu_grad
