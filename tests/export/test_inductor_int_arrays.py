"""The correction to AOTInductor's array-name cache: one name per (array, output buffer), never
a name declared in another buffer, and the wrapper left as it was afterwards."""

import pytest

torch = pytest.importorskip("torch")

from torch._inductor.utils import IndentedBuffer  # noqa: E402

from xgr_export.inductor_int_arrays import (codegen_int_array_var,  # noqa: E402
                                            int_arrays_keyed_by_buffer)


class _Wrapper:
    """The part of Inductor's C++ wrapper that the cached method uses."""

    def __init__(self):
        self.declared = 0

    def _codegen_int_array_var_impl(self, int_array, writeline, known_statically):
        self.declared += 1
        name = f"int_array_{self.declared}"
        writeline(f"const int64_t {name}[] = {int_array};")
        return name


def test_each_buffer_gets_its_own_declaration():
    wrapper, body, scope = _Wrapper(), IndentedBuffer(), IndentedBuffer()
    first = codegen_int_array_var(wrapper, "{1, 2}", body.writeline)
    # A bound method is made anew at each access: the same buffer still gets one name.
    assert codegen_int_array_var(wrapper, "{1, 2}", body.writeline) == first
    other = codegen_int_array_var(wrapper, "{1, 2}", scope.writeline)
    assert other != first
    assert f"{other}[]" in scope.getvalue() and f"{first}[]" in body.getvalue()


def test_a_dropped_buffer_cannot_lend_its_name_to_a_new_one():
    wrapper = _Wrapper()
    names = set()
    for _ in range(50):   # a freed buffer's memory (and id) goes to the next one at once
        buffer = IndentedBuffer()
        names.add(codegen_int_array_var(wrapper, "{4}", buffer.writeline))
        del buffer
    assert len(names) == 50


def test_the_wrapper_is_restored_after_the_compile():
    from torch._inductor.codegen.cpp_wrapper_cpu import CppWrapperCpu

    original = CppWrapperCpu.__dict__["codegen_int_array_var"]
    with int_arrays_keyed_by_buffer() as applied:
        assert applied, "this torch's wrapper changed shape: review the correction"
        assert CppWrapperCpu.__dict__["codegen_int_array_var"] is codegen_int_array_var
    assert CppWrapperCpu.__dict__["codegen_int_array_var"] is original


@pytest.mark.heavy
def test_an_aoti_package_compiles_and_runs_under_the_correction(tmp_path):
    class Strided(torch.nn.Module):
        def forward(self, x):   # views and fresh buffers: sizes and strides as int arrays
            y = (x * 2).transpose(0, 1).contiguous()
            return y[1:].sum(0) + x.t()[1:].amax(0)

    x = torch.randn(6, 5)
    program = torch.export.export(Strided(), (x,))
    with int_arrays_keyed_by_buffer():
        path = torch._inductor.aoti_compile_and_package(
            program, package_path=str(tmp_path / "m.pt2"))
    runner = torch._inductor.aoti_load_package(path)
    torch.testing.assert_close(runner(x), Strided()(x))
