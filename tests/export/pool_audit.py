"""Reads a cached package's compiled program (the AOTInductor wrapper source inside the
``.pt2``) for buffers sized by the prompt-KV pool.

A miss writes the suffix's keys and values into the pool, an input the program mutates. When
the compiler cannot update that input in place it allocates a buffer of the whole pool, writes
it, and copies it back: a pool of 20 GiB then needs 40 GiB and more beside the model, and every
miss moves the pool twice. The program must allocate nothing whose size depends on the pool's
page count.
"""

from __future__ import annotations

import re
import zipfile
from pathlib import Path


def wrapper_source(package: Path) -> str:
    """The C++ wrapper AOTInductor generated for ``package``'s program."""
    with zipfile.ZipFile(package) as archive:
        names = [n for n in archive.namelist() if n.endswith(".wrapper.cpp")]
        assert len(names) == 1, names
        return archive.read(names[0]).decode()


def pool_sized_allocations(source: str) -> list[str]:
    """The allocation calls of ``source`` whose size involves the pool's page count (the
    third dimension of the program's last input, the pool)."""
    inputs = re.findall(r'inputs_info_\[(\d+)\]\.name = "(\w+)";', source)
    assert inputs, "no inputs in the wrapper"
    pool = max(inputs, key=lambda item: int(item[0]))[1]
    symbols = set(re.findall(rf"int64_t (s\d+) = {pool}_size\[2\];", source))
    assert symbols, f"the pool input {pool} has no symbolic page count in the wrapper"
    for _ in range(8):           # aliases: `int64_t s97 = s96;`
        more = {a for a, b in re.findall(r"int64_t (s\d+) = (s\d+);", source) if b in symbols}
        if more <= symbols:
            break
        symbols |= more
    pattern = re.compile(r"\b(" + "|".join(sorted(symbols)) + r")\b")
    arrays = {name for name, body in re.findall(r"int64_t (int_array_\d+)\[\] = \{([^}]*)\}",
                                                source) if pattern.search(body)}
    return [line.strip() for line in source.splitlines()
            if "empty_strided(" in line
            and any(re.search(rf"\b{a}\b", line) for a in arrays)]
