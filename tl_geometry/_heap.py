"""The C heap under a run: large tensors straight from the system, so that a run's peak stays flat batch after batch.

glibc's ``malloc`` (the allocator PyTorch's CPU tensors come from on Linux)
gives a block above its mmap threshold a mapping of its own, returned to the
system when the block is freed, and a smaller one a place in its heap, which
keeps what is freed for later requests. The threshold starts at 128 KiB and
moves: each time a mapped block is freed, it rises to that block's size (up
to 32 MiB). So once the first batch of a run has freed its large tensors (a
layer's eager attention pattern, 9 MiB on 4 x 256 SmolLM2 windows), every
later tensor below that size comes from the heap, where the free space left
between live blocks cannot serve the next, larger requests and the heap grows
instead: the peak of the second batch stood about 100 MiB above the first's,
then stayed there (the model's bare eager forward pass rose the same way,
tl_geometry's analysis or not). Pinning the threshold where it starts keeps
every large tensor out of the heap in every batch.

`pin_mmap_threshold` does that once per process, on glibc only, and not where
the user chose a threshold for the process (``MALLOC_MMAP_THRESHOLD_`` or the
``glibc.malloc.mmap_threshold`` tunable), whose choice stands.
"""

import ctypes
import functools
import os
import platform

M_MMAP_THRESHOLD = -3  # mallopt's parameter number for the mmap threshold (glibc's malloc.h)
PINNED_MMAP_THRESHOLD = 128 * 1024  # glibc's own starting value: blocks from 128 KiB up get their own mapping


def user_chose_threshold(environ: dict[str, str] | os._Environ = os.environ) -> bool:
    """Whether the process was started with its own mmap threshold (glibc's environment variable or tunable)."""
    return "MALLOC_MMAP_THRESHOLD_" in environ or "glibc.malloc.mmap_threshold" in environ.get("GLIBC_TUNABLES", "")


@functools.cache
def pin_mmap_threshold() -> bool:
    """Fix glibc's mmap threshold at 128 KiB for this process (once); whether it was fixed here.

    Nothing happens (False) off glibc (macOS, musl: their allocators keep no such threshold) or where the
    user chose a threshold when starting the process. Setting it is for the whole process and lasts: glibc
    then stops moving it for every later allocation too, which costs the mapping of each large block afresh
    (measured: no time difference a run could show beside the load of a shared machine).
    """
    if user_chose_threshold() or platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the process's own C library
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, PINNED_MMAP_THRESHOLD))
