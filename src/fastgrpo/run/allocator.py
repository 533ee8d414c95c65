"""A CPU run keeps freed memory in glibc's heap: each step's tensors reuse pages instead of faulting fresh ones in.

Every optimizer step frees and allocates the same blocks again: the fp32 gradients (0.5 GiB for SmolLM2-135M),
the activations, the head's chunks, the sampler's (rows, V) logits. glibc's defaults return a freed block to the
kernel — blocks above a threshold that starts at 128 KiB are mapped and unmapped one by one, and the heap's top
is trimmed once 2 × that threshold lies free — so the next step's allocation faults every page back in and the
kernel zero-fills it. `keep_freed_memory` sets the two thresholds once per process (`mallopt`, the knobs glibc
reads from MALLOC_MMAP_THRESHOLD_ and MALLOC_TRIM_THRESHOLD_): blocks up to 32 MiB (glibc's largest allowed
threshold) come from the heap and the heap is trimmed only past 2 GiB free. Larger blocks are still mapped.

Measured side by side with the tree before it (Intel Xeon with AMX, 2 threads, docs/benchmarks.md "Freed memory
stays in glibc's heap"): the built-in job's update per rollout 1.46–1.50 → 1.17–1.18 s; the seed configuration's
optimizer step 3.6–4.4 → 3.0–3.3 s; the same peak RSS.

Under gradient checkpointing (memory first) the step's freed memory goes back instead, once per optimizer step
(`return_freed_memory`, glibc's `malloc_trim`, which setup.bf16_working_copy hands the working copy as its
`before_recast`): the bf16 working copy, handed back during backward (model/working_copy.py), is recast after
the step into pages of its own, and first the gradients `zero_grad` freed and what the step's passes left free in
the heap go back; kept, they would sit beside the copy and the peak would move there. Measured side by side with TRL on the seed configuration (AMD EPYC,
docs/benchmarks.md "Gradient checkpointing gives the working copy back"): the checkpointed run's peak RSS
3.33 GiB (session 14) → 2.97 with both, 2.87 once the chunked head's blocks live for one pass too, at the same
update time.

Not here: the device and precision (setup.py, model/precision.py).
"""

from __future__ import annotations

import ctypes
import os
import platform

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
MMAP_THRESHOLD = 32 * 2**20  # glibc refuses more (HEAP_MAX_SIZE / 2 on 64-bit)
TRIM_THRESHOLD = 2**31 - 1  # mallopt takes an int
USER_KNOBS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")


def _glibc() -> bool:
    return platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


def keep_freed_memory() -> bool:
    """Set glibc's mmap and trim thresholds for this process (module docstring); whether they were set.

    Nothing is set, and False returned, where the C library is not glibc (macOS, musl) or where the user chose
    malloc's thresholds already (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_, MALLOC_TOP_PAD_, or a
    GLIBC_TUNABLES entry for malloc): theirs stand. Under a preloaded jemalloc or tcmalloc glibc's
    thresholds are set but unused: that allocator keeps its own policy. Values computed are unchanged, only
    where memory comes from.
    """
    if not _glibc():
        return False
    if any(name in os.environ for name in USER_KNOBS) or "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    libc = ctypes.CDLL(None)  # the process's own C library
    return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))


def return_freed_memory() -> bool:
    """Hand the free memory of glibc's heap back to the kernel now (`malloc_trim(0)`); whether any went back.

    Nothing happens, and False is returned, outside glibc. Values are unchanged; the pages handed back are
    faulted in again, zero-filled, when the heap reuses them.
    """
    return _glibc() and bool(ctypes.CDLL(None).malloc_trim(0))
