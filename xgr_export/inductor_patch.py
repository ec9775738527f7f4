"""Inductor corrections are applied only while a package compiles: one method of an Inductor
class replaced, the original put back however the compile ends."""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator


@contextlib.contextmanager
def method_replaced(cls: type, name: str, function: Callable) -> Iterator[None]:
    """While open, ``cls.<name>`` is ``function``; the class's own method afterwards."""
    original = cls.__dict__[name]
    setattr(cls, name, function)
    try:
        yield
    finally:
        setattr(cls, name, original)
