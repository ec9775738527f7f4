"""The environment every multi-GPU program of the project runs under, and gives its children.

NVLink multicast (NCCL's NVLS algorithms, torch's symmetric-memory multicast, NVSHMEM's NVLS)
is kept off: the hosts this project runs on do not support it reliably, and a collective that
picks it can hang or fault a whole process group. ``NO_MULTICAST`` holds the variables that turn
it off; ``without_multicast`` returns an environment with them set (over any other value)."""

from __future__ import annotations

import os
from typing import Mapping

NO_MULTICAST: Mapping[str, str] = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


def without_multicast(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) with NVLink multicast turned off."""
    return {**(os.environ if env is None else env), **NO_MULTICAST}
