"""AOTInductor's C++ wrapper names each size/stride array once (``int_array_N``) and reuses the
name from a cache. In torch 2.11 that cache is keyed by ``id(writeline)``: a bound method, made
anew at each access and freed at once, so two different output buffers (the discarded first
memory-planning pass, a kernel's scope, the run body) can produce the same key. The wrapper then
refers to an array that was declared in another buffer, and a large program fails to compile
(``'int_array_352' was not declared in this scope``), seen exporting qwen3-1.7b with the Triton
attention kernels on CUDA. Later torch keys the cache by the buffer that ``writeline`` belongs
to; this module applies that rule while a package compiles, and keeps each buffer alive in the
cache so that its id cannot be given to another one.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Callable, Iterator

from xgr_export.inductor_patch import method_replaced

_EXPECTED_PARAMETERS = ["self", "int_array", "writeline", "known_statically", "graph"]


def _wrapper_class():
    try:
        from torch._inductor.codegen.cpp_wrapper_cpu import CppWrapperCpu
    except ImportError:   # a torch without Inductor's C++ wrapper: nothing to correct
        return None
    method = CppWrapperCpu.__dict__.get("codegen_int_array_var")
    if method is None or not hasattr(CppWrapperCpu, "_codegen_int_array_var_impl"):
        return None
    if list(inspect.signature(method).parameters) != _EXPECTED_PARAMETERS:
        return None       # a torch whose wrapper changed shape: leave it as it is
    return CppWrapperCpu


def codegen_int_array_var(self, int_array: str, writeline: Callable[..., None],
                          known_statically: bool = False, graph=None) -> str:
    """The name of ``int_array`` as declared through ``writeline``'s own buffer: declared
    there on first use, reused only for that same buffer (and graph)."""
    owner = getattr(writeline, "__self__", writeline)
    cache = self.__dict__.setdefault("_int_array_vars_by_buffer", {})
    key = (int_array, id(owner), known_statically, id(graph) if graph is not None else None)
    if key not in cache:
        var = self._codegen_int_array_var_impl(int_array, writeline, known_statically)
        cache[key] = (var, owner, graph)   # holding owner and graph keeps their ids unique
    return cache[key][0]


@contextlib.contextmanager
def int_arrays_keyed_by_buffer() -> Iterator[bool]:
    """While open, Inductor's C++ wrapper caches array names per output buffer. Yields whether
    the correction applies to this torch (False: its wrapper has another shape)."""
    cls = _wrapper_class()
    if cls is None:
        yield False
        return
    with method_replaced(cls, "codegen_int_array_var", codegen_int_array_var):
        yield True
