"""Build the one-pass C kernel (onepass.c) on first use into a cache folder, and load it with ctypes.

The shared library is keyed by the source's hash, the compiler's identity, its flags and the
machine (the flags ask for this CPU's vector instructions), so an edited source, another
compiler or another CPU builds anew; a build is written to a temporary name and renamed, so
processes racing to build never load half a file. BLAS is scipy's: `scipy.linalg.cython_blas`
exports its Fortran-convention `sgemm` as a function pointer through `__pyx_capi__`, a public,
documented interface scipy has kept since 0.16; the kernel gets the pointer, links against no
BLAS itself and uses no torch symbol. Where scipy's BLAS is OpenBLAS, its per-thread thread count
setter is found next to sgemm (dladdr) so that the kernel's own threads do not oversubscribe.

`load()` returns the loaded kernel, or None with the one reason it is unavailable in `reason()`
(no compiler, a failed build, no scipy, not Linux or macOS): the attention then takes today's
torch routes, after one note line on stderr. CC names the compiler (default `cc`).
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from sinklens.cache import cache_dir as sinklens_cache

SOURCE = Path(__file__).with_name("onepass.c")
FLAGS = ("-O3", "-fPIC", "-shared", "-pthread", "-fno-math-errno")
NATIVE = ("-march=native",)  # this CPU's vector units; dropped where the compiler refuses it
BUILD_SECONDS = 120

_state: dict = {}  # "lib" (ctypes.CDLL | None), "reason" (str), "sgemm", "blas_threads": made once per process


def cache_dir() -> Path:
    """The kernels' folder in sinklens' cache ($SINKLENS_CACHE/kernels, else ~/.cache/sinklens/kernels)."""
    return sinklens_cache() / "kernels"


def _compiler() -> list[str]:
    return shlex.split(os.environ.get("CC") or "cc")


def _identity(cc: list[str]) -> str | None:
    """The compiler's version banner, or None when it cannot run."""
    try:
        done = subprocess.run([*cc, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def _cpu() -> str:
    """What -march=native depends on: the CPU's model and feature flags (Linux), else the machine name."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return platform.machine() + line
    except OSError:
        pass
    return platform.machine() + platform.processor()


def _build(cc: list[str], ident: str) -> Path | str:
    """The cached library's path, built if missing; or the reason it could not be built."""
    src = SOURCE.read_bytes()
    for flags in (FLAGS + NATIVE, FLAGS):
        # the command itself too: CC may carry its own flags ("cc -DSL_NO_SHUFFLE"), with the same banner
        key = hashlib.sha256(b"\0".join([src, ident.encode(), " ".join([*cc, *flags]).encode(),
                                         _cpu().encode()])).hexdigest()[:16]
        lib = cache_dir() / f"onepass-{key}.so"
        if lib.exists():
            return lib
        lib.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=lib.parent)
        os.close(fd)
        try:
            done = subprocess.run([*cc, *flags, str(SOURCE), "-o", tmp, "-lm"], capture_output=True, text=True,
                                  timeout=BUILD_SECONDS)
            if done.returncode == 0:
                os.replace(tmp, lib)
                return lib
            error = (done.stderr.strip().splitlines() or ["(no message)"])[-1]
        except (OSError, subprocess.SubprocessError) as e:
            error = str(e)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return f"{' '.join(cc)} failed: {error}"


def _scipy_sgemm() -> int | str:
    """The address of scipy's BLAS sgemm (cython_blas' exported function pointer), or the reason none."""
    try:
        from scipy.linalg import cython_blas
    except ImportError:
        return "scipy is not installed"
    capsule = cython_blas.__pyx_capi__.get("sgemm")
    if capsule is None:
        return "scipy.linalg.cython_blas exports no sgemm"
    api = ctypes.pythonapi
    api.PyCapsule_GetName.restype, api.PyCapsule_GetName.argtypes = ctypes.c_char_p, [ctypes.py_object]
    api.PyCapsule_GetPointer.restype = ctypes.c_void_p
    api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    return api.PyCapsule_GetPointer(capsule, api.PyCapsule_GetName(capsule))


def _blas_threads(sgemm: int) -> int | None:
    """The address of OpenBLAS' openblas_set_num_threads_local in the library holding `sgemm`, or None."""
    class DlInfo(ctypes.Structure):
        _fields_ = [("fname", ctypes.c_char_p), ("fbase", ctypes.c_void_p), ("sname", ctypes.c_char_p),
                    ("saddr", ctypes.c_void_p)]
    try:
        libdl = ctypes.CDLL(None)
        info = DlInfo()
        if not libdl.dladdr(ctypes.c_void_p(sgemm), ctypes.byref(info)) or not info.fname:
            return None
        blas = ctypes.CDLL(info.fname.decode(), mode=getattr(os, "RTLD_NOLOAD", 0) | ctypes.RTLD_GLOBAL)
        return ctypes.cast(blas.openblas_set_num_threads_local, ctypes.c_void_p).value
    except (OSError, AttributeError):
        return None


def load() -> ctypes.CDLL | None:
    """The kernel (built on first use), or None: see `reason()`. Tried once per process."""
    if "lib" in _state:
        return _state["lib"]
    lib, reason = None, ""
    if sys.platform not in ("linux", "darwin"):
        reason = f"no one-pass kernel on {sys.platform}"
    else:
        cc = _compiler()
        ident = _identity(cc)
        sgemm = _scipy_sgemm()
        if ident is None:
            reason = f"no C compiler ({' '.join(cc)}; set CC)"
        elif isinstance(sgemm, str):
            reason = sgemm
        else:
            path = _build(cc, ident)
            if isinstance(path, str):
                reason = path
            else:
                lib = ctypes.CDLL(str(path))
                lib.sl_attention.restype = ctypes.c_int
                _state["sgemm"], _state["blas_threads"] = sgemm, _blas_threads(sgemm)
    _state["lib"], _state["reason"] = lib, reason
    if lib is None:
        print(f"sinklens: capture uses the torch routes ({reason})", file=sys.stderr)
    return lib


def function(name: str, argtypes: list, restype=None):
    """The library's C function `name` with its signature (set at the first call), or None where the
    library does not build (`load`)."""
    lib = load()
    if lib is None:
        return None
    fn = getattr(lib, name)
    if fn.argtypes is None:
        fn.argtypes, fn.restype = argtypes, restype
    return fn


def reason() -> str:
    """Why `load()` gave None ('' when it loaded or was not tried)."""
    return _state.get("reason", "")


def blas() -> tuple[int, int | None]:
    """(sgemm's address, the BLAS' per-thread thread count setter or None), once `load()` succeeded."""
    return _state["sgemm"], _state["blas_threads"]


def reset() -> None:
    """Forget this process' attempt (tests: a changed CC)."""
    _state.clear()
