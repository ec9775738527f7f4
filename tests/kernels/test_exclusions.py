"""The exclusion kernels (``torch_engine.kernels.exclusions``) against their torch definitions
``beam_search.excluded_rows`` and ``beam_search.exhausted_prefixes``: equal outputs, exactly.

On the CPU the kernels run under Triton's interpreter (the root conftest sets it).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from torch_engine import beam_search as bs
from torch_engine.catalog import Catalog
from torch_engine.errors import InvalidInputError
from torch_engine.kernels.exclusions import (ExclusionTables, excluded_rows,
                                             exhausted_prefixes)
from torch_engine.layout import TokenLayout

REPO = Path(__file__).resolve().parents[2]


def small_catalog(rng: np.random.Generator, items: int, size: int) -> Catalog:
    """Few codes, so that many prefixes hold only a handful of items (easy to exhaust)."""
    codes = rng.integers(0, size, (items, 3))
    ids = rng.choice(items * 5, size=items, replace=False)
    return Catalog.from_arrays(ids, codes, TokenLayout(codebook_size=size))


def exclusions(gen: torch.Generator, catalog: Catalog, batch: int, columns: int,
               whole_prefix: bool) -> torch.Tensor:
    """``[B, X]`` ids: catalog items (repeats included), ids not in the catalog, -1 padding;
    with ``whole_prefix`` the first rows also exclude every item of one full path, so some
    prefixes of each length are exhausted."""
    ids = catalog.item_lookup_ids
    out = ids[torch.randint(0, ids.shape[0], (batch, columns), generator=gen)]
    roll = torch.rand((batch, columns), generator=gen)
    out = torch.where(roll < 0.15, torch.full_like(out, -1), out)
    out = torch.where((roll >= 0.15) & (roll < 0.25), out * 5 + 10**9, out)   # unknown ids
    if whole_prefix:
        for b in range(batch):
            path = int(torch.randint(0, catalog.num_prefixes[-1], (1,), generator=gen))
            lo, hi = int(catalog.path_indptr[path]), int(catalog.path_indptr[path + 1])
            items = catalog.path_items[lo:hi][: columns // 2]
            out[b, : items.shape[0]] = items
    return out


@pytest.mark.parametrize("batch,columns,items,size", [
    (1, 1, 50, 4), (3, 2, 50, 4), (2, 7, 200, 3), (4, 64, 300, 4), (2, 256, 2000, 8)])
@pytest.mark.parametrize("whole_prefix", [False, True])
def test_kernels_equal_the_torch_definitions(batch, columns, items, size, whole_prefix):
    gen = torch.Generator().manual_seed(torch.seed() % 2**31)
    rng = np.random.default_rng(int(torch.randint(0, 2**31, (1,), generator=gen)))
    catalog = small_catalog(rng, items, size)
    tables = ExclusionTables.of(catalog)
    exclude = exclusions(gen, catalog, batch, columns, whole_prefix)
    want_rows = bs.excluded_rows(exclude, catalog)
    got_rows = excluded_rows(exclude, tables)
    assert torch.equal(got_rows, want_rows), f"{got_rows}\n{want_rows}"
    got = exhausted_prefixes(got_rows, tables)
    assert got.shape == (catalog.levels, batch, columns)
    for level in range(catalog.levels):
        want = bs.exhausted_prefixes(want_rows, catalog, level)
        assert torch.equal(got[level], want), f"level {level}\n{got[level]}\n{want}"


def test_a_fully_excluded_path_blocks_its_prefixes():
    """Every item of one prefix of length 1 excluded: that prefix and all its descendants
    are exhausted at their levels; the output names each once per excluded row."""
    codes = np.array([[0, 0, 0], [0, 0, 1], [0, 1, 0], [1, 0, 0], [1, 1, 1]])
    catalog = Catalog.from_arrays(np.arange(5) + 100, codes, TokenLayout(codebook_size=2))
    tables = ExclusionTables.of(catalog)
    rows = excluded_rows(torch.tensor([[102, 101, 100, -1, 7, 100]]), tables)
    assert rows.tolist() == [[0, 1, 2, 5, 5, 5]]
    blocked = exhausted_prefixes(rows, tables)
    # Length 1: prefix (0) holds rows 0-2, all excluded. Length 2: (0,0) rows 0-1, (0,1)
    # row 2. Length 3: the paths (0,0,0), (0,0,1), (0,1,0).
    assert blocked[0].tolist() == [[0, 0, 0, 2, 2, 2]]
    assert blocked[1].tolist() == [[0, 0, 1, 4, 4, 4]]
    assert blocked[2].tolist() == [[0, 1, 2, 5, 5, 5]]


@pytest.mark.parametrize("case,match", [
    ("float", "exclude_items.dtype"), ("rank", r"exclude_items must have shape \[B, X\]"),
    ("empty", "B, X >= 1"), ("wide", "at most 16384 columns"),
    ("strided", "exclude_items must be contiguous")])
def test_bad_exclusions_name_the_argument(case, match):
    catalog = small_catalog(np.random.default_rng(0), 20, 4)
    tables = ExclusionTables.of(catalog)
    bad = {"float": torch.zeros((1, 2)), "rank": torch.zeros(3, dtype=torch.int64),
           "empty": torch.zeros((1, 0), dtype=torch.int64),
           "wide": torch.zeros((1, 16385), dtype=torch.int64),
           "strided": torch.zeros((2, 4), dtype=torch.int64)[:, ::2]}[case]
    with pytest.raises(InvalidInputError, match=match):
        excluded_rows(bad, tables)


# Compiles both kernels for sm_90 without a GPU (Triton's own ptxas) in a fresh process, since
# the interpreter replaces every jit function of this one; prints the resource usage.
_COMPILE = """
import pathlib, subprocess, tempfile, sys
import triton
try:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.backends.nvidia.compiler import CUDABackend  # noqa: F401
except ImportError as error:
    print("SKIP", error); sys.exit(0)
from torch_engine.kernels.exclusions import _excluded_rows_kernel, _exhausted_kernel, _warps
cuobjdump = pathlib.Path(triton.__file__).parent / "backends/nvidia/bin/cuobjdump"


def usage(kernel):
    if not cuobjdump.exists():
        return "no cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(kernel.asm["cubin"])
        cubin.flush()
        dump = subprocess.run([str(cuobjdump), "--dump-resource-usage", cubin.name],
                              capture_output=True, text=True).stdout
    return next(line.strip() for line in dump.splitlines() if "REG:" in line)


target = GPUTarget("cuda", 90, 32)
for block in (2, 1024, 4096):
    # excluded (and a stride) of 1 come as constants: Triton's rule for int arguments == 1.
    one = block == 2
    signature = dict(exclude_ptr="*i64", ids_ptr="*i64", rows_ptr="*i64", out_ptr="*i64",
                     excluded="constexpr" if one else "i32", num_items="i32",
                     BLOCK="constexpr", STEPS="constexpr")
    constants = dict(BLOCK=block, STEPS=24)
    if one:
        constants.update(excluded=1)
    kernel = triton.compile(ASTSource(fn=_excluded_rows_kernel, signature=signature,
                                      constexprs=constants),
                            target=target, options=dict(num_warps=_warps(block)))
    print("COMPILED rows", block, usage(kernel))
    signature = dict(rows_ptr="*i64", indptr_ptr="*i64", starts_ptr="*i64", totals_ptr="*i64",
                     out_ptr="*i64", excluded="constexpr" if one else "i32", num_items="i32",
                     LEVELS="constexpr", BLOCK="constexpr", STEPS="constexpr")
    constants = dict(LEVELS=3, BLOCK=block, STEPS=22)
    if one:
        constants.update(excluded=1)
    kernel = triton.compile(ASTSource(fn=_exhausted_kernel, signature=signature,
                                      constexprs=constants),
                            target=target, options=dict(num_warps=_warps(block)))
    print("COMPILED prefixes", block, usage(kernel))
"""


def test_kernels_compile_for_sm90():
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the gpu tests compile the kernels for it")
    env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", _COMPILE], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    if done.stdout.startswith("SKIP"):
        pytest.skip(f"the CUDA backend of Triton cannot compile here: {done.stdout.strip()}")
    lines = [line for line in done.stdout.splitlines() if line.startswith("COMPILED")]
    assert len(lines) == 6, done.stdout
    for line in lines:
        assert "no cuobjdump" in line or ("STACK:0" in line and "LOCAL:0" in line), line
    print("\n".join(lines))


@pytest.mark.gpu
@pytest.mark.parametrize("columns", [1, 512, 4096])
def test_gpu_kernels_equal_the_torch_definitions(columns):
    gen = torch.Generator().manual_seed(columns)
    rng = np.random.default_rng(columns)
    catalog = small_catalog(rng, 200_000, 64)
    exclude = exclusions(gen, catalog, 8, columns, True).cuda()
    catalog = catalog.to("cuda")
    tables = ExclusionTables.of(catalog)
    rows = excluded_rows(exclude, tables)
    want_rows = bs.excluded_rows(exclude, catalog)
    assert torch.equal(rows, want_rows)
    got = exhausted_prefixes(rows, tables)
    for level in range(catalog.levels):
        assert torch.equal(got[level], bs.exhausted_prefixes(want_rows, catalog, level))
