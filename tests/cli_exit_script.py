"""`fastgrpo train` on one of torchrun's processes, then a check that its process group's threads are gone.

    torchrun --standalone --nproc_per_node 2 tests/cli_exit_script.py train --model M --dataset D --reward length ...

Run by tests/test_distributed.py. Exits with `fastgrpo train`'s code; an AssertionError (exit 1) if a gloo thread
(`gloo_tcp_loop`, `pt_gloo_runloop`) is still running when the command returns: it would run into interpreter exit.
"""

import glob
import sys

from fastgrpo.cli import main

if __name__ == "__main__":
    code = main(sys.argv[1:])
    threads = [open(path).read().strip() for path in glob.glob("/proc/self/task/*/comm")]  # Linux: each thread's name
    assert not [name for name in threads if "gloo" in name], threads
    sys.exit(code)
