"""How the API's and the workers' C heap keeps the memory it frees.

A call's arguments and result are copied several times in each process on their way through
(the body, its canonical JSON, the job's msgpack, Redis's protocol; the reply, the decoded input,
the result's JSON, the record): six to eight buffers of the payload's size, allocated and freed
within the call. Left to itself, glibc's malloc gives freed memory back to the kernel as soon as
a little lies free at the top of its heap (its trim threshold follows the largest block freed so
far: a few MiB once payloads are MiB), so the next call's copies land in fresh pages, and each
4 KiB page costs a page fault as it is first written. On the virtual machines measured, those
faults were half of the API's and of a worker's CPU per call at 1 MiB (bench/README.md, "The
cost per byte, and the heap").

``keep_freed_memory`` sets both thresholds once, at the start of ``python -m api`` and ``python
-m carmy_worker``: blocks up to ``MMAP_THRESHOLD`` come from the heap, and up to ``TRIM_THRESHOLD``
of free memory at its top is kept for the next call instead of being handed back. The price is
memory a process keeps after a burst of large calls, at most ``TRIM_THRESHOLD`` more than it
uses. Setting either threshold yourself (``MALLOC_TRIM_THRESHOLD_``, ``MALLOC_MMAP_THRESHOLD_``
or ``GLIBC_TUNABLES``) leaves glibc to you; elsewhere than glibc nothing changes.
"""

from __future__ import annotations

import ctypes
import os
import platform
from collections.abc import Mapping

MIB = 1 << 20
# glibc's largest mmap threshold on 64-bit (its own ceiling for the threshold's adjustment): a
# request body is at most 1 MiB, a result at most CARMY_MAX_RESULT_BYTES.
MMAP_THRESHOLD = 32 * MIB
TRIM_THRESHOLD = 64 * MIB

# mallopt's parameters, from glibc's <malloc.h>.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

_OVERRIDES = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_")


def set_by_user(environ: Mapping[str, str]) -> bool:
    """Whether the environment already tells glibc's malloc its thresholds."""
    tunables = environ.get("GLIBC_TUNABLES", "")
    return any(name in environ for name in _OVERRIDES) or any(
        name in tunables for name in ("malloc.trim_threshold", "malloc.mmap_threshold"))


def keep_freed_memory(environ: Mapping[str, str] = os.environ) -> bool:
    """Raise glibc's trim and mmap thresholds for this process (see the module's docstring).
    True if they were set; False where the user set them, or the C library is not glibc."""
    if platform.libc_ver()[0] != "glibc" or set_by_user(environ):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
