"""run/allocator.py: after `keep_freed_memory` a freed 16 MiB tensor stays in the process (no page faults next time).

Each case runs in its own Python process (malloc's thresholds are per process): it allocates and touches a
16 MiB tensor, frees it and reports how much of it left the resident set. glibc's default maps a block of that
size on its own and unmaps it when freed (the whole 16 MiB leave); kept, it stays in the heap for the next one.
A user's own MALLOC_* setting stands; a trainer on a CPU sets the thresholds (setup.build_accelerator).
`return_freed_memory` (malloc_trim) hands a kept block back on demand.
"""

import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")

PROBE = """
import sys, torch
from fastgrpo.run.allocator import keep_freed_memory

def rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20

kept = keep_freed_memory() if sys.argv[1].startswith("keep") else None
block = torch.ones(4 * 2**20)  # 16 MiB, every page touched
before = rss_mib()
del block
print(kept, round(before - rss_mib()))  # MiB returned to the kernel by the free
if sys.argv[1] == "keep-then-return":
    from fastgrpo.run.allocator import return_freed_memory
    after_free = rss_mib()
    print(return_freed_memory(), round(after_free - rss_mib()))  # MiB returned by the trim
"""


def probe(mode: str, **env) -> tuple[str, int]:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True,
                         env={**os.environ, **env}, timeout=120).stdout.split()
    return out[0], int(out[1])


def test_default_returns_a_freed_block_and_kept_does_not():
    assert probe("default") == ("None", 16)  # glibc unmaps it: the next step would fault 16 MiB in again
    assert probe("keep") == ("True", 0)


def test_a_kept_block_goes_back_when_asked():
    out = subprocess.run([sys.executable, "-c", PROBE, "keep-then-return"], capture_output=True, text=True, check=True, timeout=120).stdout.split()
    assert out[:3] == ["True", "0", "True"] and int(out[3]) >= 16  # kept by the free; handed back (with any other free page)


def test_a_users_own_malloc_setting_stands():
    assert probe("keep", MALLOC_TRIM_THRESHOLD_="131072") == ("False", 16)  # theirs: trim at 128 KiB, map from 128 KiB
    assert probe("keep", GLIBC_TUNABLES="glibc.malloc.mmap_threshold=131072")[0] == "False"


def test_a_cpu_trainer_keeps_freed_memory(tmp_path):
    script = PROBE.replace('kept = keep_freed_memory() if sys.argv[1].startswith("keep") else None', (
        "from fastgrpo import GRPOConfig\n"
        "from fastgrpo.run.setup import build_accelerator\n"
        f"build_accelerator(GRPOConfig(output_dir={str(tmp_path)!r}, report_to=[]))\n"
        "kept = 'trainer'"
    ))
    out = subprocess.run([sys.executable, "-c", script, "-"], capture_output=True, text=True, check=True, timeout=300).stdout.split()
    assert out[-2:] == ["trainer", "0"]
