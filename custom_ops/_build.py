"""Compile the C++ op libraries from source against the installed TF (and torch).

Used by ``setup.py``'s ``build_ext`` step (at install) and nowhere at run time. Loaded by file
path, so it must import only the standard library at module level.

Each library is a list of TF-side sources (compiled with ``tf.sysconfig`` flags, C++17) and,
optionally, torch-side sources (compiled against libtorch's headers, C++20). The two halves are
separate translation units because torch's headers redefine TF's ``LOG``/``CHECK`` macros.
Object files are cached by a hash of source, headers, flags and the toolchain (compiler, Python,
TF and torch versions and builds), so a rebuild after an unrelated change costs nothing and a
cache folder that travelled from another machine is never reused there. The sources of one
library compile in parallel.
"""

# No `from __future__ import annotations`: setup.py execs this file without registering it in
# sys.modules, and dataclasses then cannot resolve string annotations.

import concurrent.futures
import functools
import hashlib
import os
import platform
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class OpLibrary:
    """One shared library: ``name`` is the extension's dotted module name."""

    name: str
    tf_sources: tuple[str, ...]
    torch_sources: tuple[str, ...] = ()
    include_dirs: tuple[str, ...] = field(default_factory=tuple)


def _python_eval(code: str) -> str:
    """Ask the build interpreter (which has TF/torch) for flags, in a child process.

    A child keeps TF and torch out of the setup process (both are heavy and noisy).
    """
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.check_output([sys.executable, "-c", code], env=env, text=True).strip()


# setup.py's `build_ext -j N` builds libraries on several threads: each flag query runs once.
_FLAG_LOCK = threading.Lock()


@functools.cache
def _tf_flags() -> tuple[list[str], list[str], str]:
    out = _python_eval(
        "import tensorflow as tf; print('\\x1f'.join(tf.sysconfig.get_compile_flags()));"
        "print('\\x1f'.join(tf.sysconfig.get_link_flags())); print(tf.__version__, "
        "tf.version.GIT_VERSION)")
    compile_line, link_line, version = out.splitlines()[-3:]
    return compile_line.split("\x1f"), link_line.split("\x1f"), version


def tf_flags() -> tuple[list[str], list[str]]:
    with _FLAG_LOCK:
        compile_flags, link_flags, _ = _tf_flags()
    return compile_flags, link_flags


@functools.cache
def _torch_flags() -> tuple[list[str], list[str], str]:
    out = _python_eval(
        "import os, torch, torch.utils.cpp_extension as ce;"
        "print('\\x1f'.join(ce.include_paths()));"
        "print(os.path.join(os.path.dirname(torch.__file__), 'lib'));"
        "print(int(torch._C._GLIBCXX_USE_CXX11_ABI));"
        "print(torch.__version__, torch.version.git_version, torch.version.cuda);"
        # CUDA's headers (the graph runner needs them): CUDA_HOME's, where a toolkit is found.
        "paths = [];\n"
        "try: paths = [p for p in ce.include_paths('cuda') if os.path.isfile("
        "os.path.join(p, 'cuda_runtime_api.h'))]\n"
        "except Exception: pass\n"
        "print('cuda:' + '\\x1f'.join(paths))")
    includes, libdir, abi, version, cuda_line = out.splitlines()[-5:]
    cuda_includes = cuda_line.removeprefix("cuda:")
    compile_flags = [f"-I{p}" for p in includes.split("\x1f")] + [
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}", "-std=c++20"]
    link_flags = [f"-L{libdir}", "-ltorch", "-ltorch_cpu", "-lc10"]
    if any(Path(libdir).glob("libtorch_cuda.so*")):
        # A CUDA build: load libtorch_cuda with the op even though no symbol of it is named
        # here (the linker's --as-needed would drop it), or torch sees no GPU in a process
        # without Python torch and CUDA packages cannot run.
        link_flags += ["-Wl,--no-as-needed", "-ltorch_cuda", "-Wl,--as-needed"]
        if cuda_includes:
            # With CUDA's headers, TorchCall replays packages as CUDA graphs.
            compile_flags += [*(f"-I{p}" for p in cuda_includes.split("\x1f")),
                              "-DXGR_TORCH_CUDA=1"]
            link_flags += ["-lc10_cuda"]
    return compile_flags, link_flags + [f"-Wl,-rpath,{libdir}"], version


def torch_flags() -> tuple[list[str], list[str]]:
    with _FLAG_LOCK:
        compile_flags, link_flags, _ = _torch_flags()
    return compile_flags, link_flags


@functools.cache
def _toolchain() -> str:
    """What else shapes an object file: compiler, Python, machine and the TF/torch builds."""
    compiler = subprocess.check_output(["g++", "--version"], text=True).splitlines()[0]
    return "|".join([compiler, sys.version, platform.machine(), platform.libc_ver()[1]])


def _digest(paths: list[Path], flags: list[str], versions: str) -> str:
    h = hashlib.sha256("\0".join([*flags, _toolchain(), versions]).encode())
    for p in paths:
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def _compile(src: Path, flags: list[str], versions: str, headers: list[Path], cache: Path,
             log) -> Path:
    obj = cache / f"{src.stem}-{_digest([src, *headers], flags, versions)}.o"
    if obj.exists():
        log(f"  cached  {src}")
        return obj
    log(f"  compile {src}")
    tmp = f"{obj}.{os.getpid()}.{threading.get_ident()}.tmp"
    subprocess.run(["g++", "-c", "-fPIC", "-O2", *flags, str(src), "-o", tmp], check=True)
    os.replace(tmp, obj)  # atomic: a concurrent build never links half an object
    return obj


def build_library(lib: OpLibrary, root: Path, output: Path, cache: Path, log=print) -> None:
    """Compile and link ``lib`` into ``output`` (a .so path), caching objects in ``cache``."""
    cache.mkdir(parents=True, exist_ok=True)
    headers = sorted(root.glob("custom_ops/cc/**/*.h"))
    includes = [f"-I{root}", *(f"-I{root / d}" for d in lib.include_dirs)]
    tf_compile, tf_link = tf_flags()
    tf_version = _tf_flags()[2]
    # TF's own headers call its deprecated error helpers and Eigen's read g++'s
    # interference-size constant: silence those floods, which no source here can fix.
    tf_compile = [*tf_compile, "-Wno-deprecated-declarations", "-Wno-interference-size"]
    jobs = [(root / s, [*tf_compile, *includes, "-DNDEBUG"], tf_version) for s in lib.tf_sources]
    link = list(tf_link)
    if lib.torch_sources:
        th_compile, th_link = torch_flags()
        versions = f"{tf_version}|{_torch_flags()[2]}"
        jobs += [(root / s, [*th_compile, *includes, "-DNDEBUG"], versions)
                 for s in lib.torch_sources]
        link += th_link
    # One g++ per source at once (each is single-threaded; the torch half takes longest).
    workers = max(1, min(len(jobs), os.cpu_count() or 1))
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        objects = list(pool.map(lambda job: _compile(*job, headers, cache, log), jobs))
    output.parent.mkdir(parents=True, exist_ok=True)
    log(f"  link    {output}")
    subprocess.run(["g++", "-shared", "-fPIC", *map(str, objects), "-o", str(output), *link],
                   check=True)


def discover_libraries(root: Path) -> list[OpLibrary]:
    """The op libraries, one per folder of ``custom_ops/cc``.

    ``custom_ops/cc/<lib>/*.cc`` are TF-side sources, ``custom_ops/cc/<lib>/torch/*.cc``
    torch-side ones; the result is the module ``custom_ops._<lib>``.
    """
    libs = []
    for folder in sorted(p for p in (root / "custom_ops" / "cc").iterdir() if p.is_dir()):
        tf_sources = tuple(str(p.relative_to(root)) for p in sorted(folder.glob("*.cc")))
        torch_sources = tuple(str(p.relative_to(root))
                              for p in sorted((folder / "torch").glob("*.cc")))
        if tf_sources:
            libs.append(OpLibrary(f"custom_ops._{folder.name}", tf_sources, torch_sources))
    return libs
