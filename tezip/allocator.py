"""How the process's C allocator hands out tezip's large buffers (glibc only).

Coding a window allocates buffers of megabytes (codes, contexts, symbols, the rANS
words, the reconstruction, the bytes written) and frees them before the next window.
glibc maps blocks above its mmap threshold afresh, and gives the top of its heap back to
the system once more than its trim threshold is free there; both thresholds follow the
largest mapped block freed so far. So, depending on what the process freed before, each
compression touched new pages: 300-860 page faults a compression of the shared stacks
loaded from .npy files in a fresh process, and 3,100 on smoke_phiflow (4 MiB of float32)
in another order of calls, 8.9 ms of system time in a 33 ms encoding.

``configure`` pins both: blocks up to ``MMAP_THRESHOLD`` come from the heap, and up to
``TRIM_THRESHOLD`` of free memory stays at its top (both within glibc's own ranges: its
dynamic threshold reaches 32 MiB by itself). The cost is freed memory kept by the
process, up to ``TRIM_THRESHOLD`` per heap (glibc has one per thread that allocates): a
break-test measured 45-50 MiB more after coding a 128 MiB stack with one thread, about 74
MiB more with eight. It is applied once, when tezip's codec is imported, and not at all where
the user chose: ``TEZIP_MALLOC=system``, or glibc's own settings in the environment
(``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``, ``MALLOC_TOP_PAD_``,
``MALLOC_MMAP_MAX_``, or ``GLIBC_TUNABLES`` with malloc tunables)."""

from __future__ import annotations

import ctypes
import os
import threading

MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 64 << 20
_M_TRIM_THRESHOLD = -1       # glibc's mallopt parameters (malloc.h)
_M_MMAP_THRESHOLD = -3
_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_",
        "MALLOC_MMAP_MAX_")

_LOCK = threading.Lock()
_STATE: list[str] = []


def _reason_not(env: os._Environ | dict) -> str | None:
    """Why the allocator is left as it is, or None."""
    if env.get("TEZIP_MALLOC", "").strip().lower() == "system":
        return "TEZIP_MALLOC=system"
    set_here = [k for k in _ENV if k in env]
    if "malloc" in env.get("GLIBC_TUNABLES", ""):
        set_here.append("GLIBC_TUNABLES")
    if set_here:
        return f"set in the environment ({', '.join(set_here)})"
    try:
        libc = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError, AttributeError):
        libc = ""
    if not libc.startswith("glibc"):
        return "not glibc"
    return None


def configure(env: os._Environ | dict | None = None) -> str:
    """Apply the settings above once per process; returns what was done ("tuned", or why
    not), the same on every call."""
    with _LOCK:
        if not _STATE:
            why = _reason_not(os.environ if env is None else env)
            if why is None:
                try:
                    libc = ctypes.CDLL("libc.so.6")
                    ok = (libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
                          and libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1)
                    why = "tuned" if ok else "mallopt refused the settings"
                except (OSError, AttributeError):
                    why = "libc.so.6 not loadable"
            _STATE.append(why)
        return _STATE[0]
