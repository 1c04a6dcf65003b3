"""Our own C++ paged-attention kernels (``paged_attention.cpp`` and its headers), built at set-up.

:func:`build` compiles them with ``torch.utils.cpp_extension`` (a C++ compiler and ninja
needed; about a minute) into ``<hermes home>/kernels/<torch version>-<hash>``, the hash
covering this CPU's instruction-set flags (the code is compiled for this CPU,
``-march=native``) and the compiler flags; the library's name carries a hash of the sources,
so a changed source is never loaded stale. ``make setup`` runs it
(``python -m hermes_async.model.attention.native``). :func:`load` only loads a built library
(requests never build) and registers ``torch.ops.hermes_native.*``; it raises
:class:`BackendUnavailable` with the reason when there is none.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import sys
from pathlib import Path

import torch

from hermes_async.model.attention.base import BackendUnavailable
from hermes_async.model.default_model import hermes_home

SOURCE = Path(__file__).with_name("paged_attention.cpp")  # includes the .h files beside it
CFLAGS = ("-O3", "-march=native", "-fopenmp", "-DNDEBUG")
LDFLAGS = ("-fopenmp",)
BUILD_HINT = "python -m hermes_async.model.attention.native"


def cpu_flags() -> str:
    """The CPU's feature flags as the kernel sees them (``/proc/cpuinfo``), else its name."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return " ".join(sorted(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return f"{platform.machine()} {platform.processor()}"


def _digest(text: str | bytes) -> str:
    data = text.encode() if isinstance(text, str) else text
    return hashlib.sha256(data).hexdigest()[:12]


def build_dir() -> Path:
    """Where the library for this torch, CPU and set of flags lives."""
    key = _digest(cpu_flags() + "|" + " ".join(CFLAGS + LDFLAGS))
    return hermes_home() / "kernels" / f"{torch.__version__}-{key}"


def sources() -> list[Path]:
    """The kernel's source files (the one compiled and the headers it includes)."""
    return sorted([*SOURCE.parent.glob("*.cpp"), *SOURCE.parent.glob("*.h")])


def library_name() -> str:
    return f"hermes_native_{_digest(b''.join(p.read_bytes() for p in sources()))}"


def library_path() -> Path:
    return build_dir() / f"{library_name()}.so"


def loaded() -> bool:
    """Whether ``torch.ops.hermes_native`` is registered in this process."""
    try:
        torch.ops.hermes_native.paged_attention  # noqa: B018 - registered?
    except (AttributeError, RuntimeError):
        return False
    return True


def check_built() -> None:
    """Raise :class:`BackendUnavailable` unless the library for these sources is built (or
    already loaded); loads nothing."""
    if not loaded() and not library_path().is_file():
        raise BackendUnavailable(f"the native kernels are not built for torch "
                                 f"{torch.__version__} on this CPU (run {BUILD_HINT})")


def load() -> None:
    """Register ``torch.ops.hermes_native.*`` from the built library (never builds)."""
    if loaded():
        return
    check_built()
    path = library_path()
    try:
        torch.ops.load_library(str(path))
    except OSError as e:
        raise BackendUnavailable(f"{path} does not load: {e}") from e


def build(verbose: bool = False) -> Path:
    """Compile the kernels unless already built, load them, and return the library's path;
    raises :class:`BackendUnavailable` when there is no compiler or the build fails."""
    path = library_path()
    if path.is_file():
        load()
        return path
    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx) is None:
        raise BackendUnavailable(f"no C++ compiler ({cxx}) to build the native kernels "
                                 f"(install g++, or set CXX)")
    # ninja from a pip install sits next to this interpreter, maybe not on PATH
    env_path = os.environ.get("PATH", "")
    os.environ["PATH"] = os.pathsep.join((str(Path(sys.executable).parent), env_path))
    try:
        if shutil.which("ninja") is None:
            raise BackendUnavailable("ninja is needed to build the native kernels "
                                     "(pip install ninja)")
        from torch.utils.cpp_extension import load as cpp_load

        path.parent.mkdir(parents=True, exist_ok=True)
        cpp_load(library_name(), [str(SOURCE)], extra_cflags=list(CFLAGS),
                 extra_ldflags=list(LDFLAGS), build_directory=str(path.parent),
                 is_python_module=False, verbose=verbose)
    except BackendUnavailable:
        raise
    except Exception as e:  # the compiler's error (RuntimeError, CalledProcessError, ...)
        lines = [ln for ln in str(e).splitlines() if ln.strip()]
        raise BackendUnavailable(f"building the native kernels failed: "
                                 f"{' / '.join(lines[-3:])[:400]}") from e
    finally:
        os.environ["PATH"] = env_path
    if not path.is_file():
        raise BackendUnavailable(f"the build left no {path}")
    for stale in path.parent.glob("hermes_native_*.so"):  # builds of earlier sources
        if stale != path:
            stale.unlink(missing_ok=True)
    load()
    return path
