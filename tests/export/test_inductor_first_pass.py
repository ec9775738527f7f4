"""The synchronised first pass of a CUDA package's compile: Inductor's Python pass writes a
device synchronisation after every kernel, its C++ pass (the package) none, and Inductor is
left as it was afterwards."""

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
