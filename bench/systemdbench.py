"""What telling systemd about a hook's GPU nodes adds to a start (ponytail.apply.systemdbus): on a host where
systemd runs (a booted node: tests/support/bootednode.py), for a transient scope made with ``systemd-run
--scope``, the time of ``connect`` + ``add_device_allow`` for 4 nodes (one GPU: the GPU, nvidiactl, nvidia-uvm,
nvidia-uvm-tools), each in a fresh process (libsystemd's dlopen included, as in the hook), and in one process
after the first (the call alone). Prints the medians in milliseconds.

Usage (as root, in the node): python3 bench/systemdbench.py [--runs N]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

ONE = """
import sys, time
t = time.perf_counter()
from ponytail.apply.systemdbus import add_device_allow, connect
fd = connect()
add_device_allow(fd, sys.argv[1], sys.argv[2:])
print((time.perf_counter() - t) * 1000)
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    unit = f"ponytail-bench-{int(time.time())}.scope"
    sleeper = subprocess.Popen(["systemd-run", "--scope", f"--unit={unit}", "--quiet", "sleep", "600"])
    try:
        time.sleep(1.0)
        nodes = ["/dev/null", "/dev/zero", "/dev/full", "/dev/random"]  # 4 device paths, as for one GPU
        fresh = [float(subprocess.run([sys.executable, "-c", ONE, unit, *nodes], capture_output=True, text=True, check=True).stdout)
                 for _ in range(args.runs)]
        from ponytail.apply.systemdbus import add_device_allow, connect

        warm = []
        for _ in range(args.runs):
            t = time.perf_counter()
            fd = connect()
            assert fd is not None, "no systemd here"
            add_device_allow(fd, unit, nodes)
            warm.append((time.perf_counter() - t) * 1000)
        print(f"fresh process (dlopen libsystemd, connect, SetUnitProperties): median {statistics.median(fresh):.2f} ms "
              f"(min {min(fresh):.2f}, max {max(fresh):.2f}, {args.runs} runs)")
        print(f"warm (connect, SetUnitProperties): median {statistics.median(warm):.2f} ms (min {min(warm):.2f}, max {max(warm):.2f})")
    finally:
        sleeper.terminate()
        sleeper.wait(10)


if __name__ == "__main__":
    main()
