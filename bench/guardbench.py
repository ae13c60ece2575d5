#!/usr/bin/env python3
"""What ``ponytail guard`` costs: a benchmark script (run as root, not a test).

    .venv/bin/python bench/guardbench.py [--containers N] [--seconds S]

1. The hook's share: ``record_container`` (read /proc/<pid>/cgroup and /proc/<pid>/stat, write one
   0600 record with the atomic writer) timed in this process, and the import of the two modules
   it adds to a hook run (ponytail.apply.containerrecord, ponytail.fs.atomic) in a fresh interpreter.
2. The daemon: N stand-in containers (a sleeping process each, in a cgroup v1 devices cgroup of its
   own with the GPU's rules allowed), recorded (under /run, a tmpfs, as /run/ponytail); the guard daemon started on them with a test event
   source (a FIFO) and a 1 s safety interval. Its CPU (/proc/<pid>/task/*/schedstat, ns) is read
   over S seconds of passes only, then over 20 events written to the FIFO: CPU per pass, per event
   (dev-char-links, then a pass), and per hour when idle at the default [guard] interval.
Prints one line per figure; bench/RESULTS.md keeps the last run.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
PONYTAIL = str(REPO / ".venv/bin/ponytail")
DEVICES = Path("/sys/fs/cgroup/devices")
GPU = (("c", 195, 0, "/dev/nvidia0"), ("c", 195, 255, "/dev/nvidiactl"), ("c", 511, 0, "/dev/nvidia-uvm"))


def cpu_seconds(pid: int) -> float:
    """The process's time on a CPU (its threads' sum), in ns precision: /proc/<pid>/schedstat's first field."""
    return sum(int((task / "schedstat").read_text().split()[0]) for task in Path(f"/proc/{pid}/task").iterdir()) / 1e9


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--containers", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args()
    from ponytail.apply.containerrecord import record_container
    from ponytail.config import Config

    base = Path(tempfile.mkdtemp(prefix="guardbench-", dir="/run"))  # a tmpfs, as /run/ponytail is
    records = base / "records"
    config = base / "config.toml"
    config.write_text(f'[guard]\nrecords = "{records}"\n[log]\nfile = "{base}/log"\n[host]\nproc_root = "{base}/proc"\ndev_root = "{base}/dev"\n')
    (base / "proc/driver/nvidia").mkdir(parents=True)
    (base / "proc/driver/nvidia/version").write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n")
    (base / "proc/devices").write_text("Character devices:\n195 nvidia-frontend\n511 nvidia-uvm\n")
    (base / "dev").mkdir()
    sleepers, cgroups = [], []
    try:
        for i in range(args.containers):
            cgroup = DEVICES / f"guardbench-{os.getpid()}-{i}"
            cgroup.mkdir()
            cgroups.append(cgroup)
            proc = subprocess.Popen(["sleep", "3600"])
            (cgroup / "cgroup.procs").write_text(str(proc.pid))
            sleepers.append(proc)
        times = []
        for proc in sleepers:
            start = time.perf_counter()
            record_container(str(records), f"bench-{proc.pid}", proc.pid, "hook", GPU, "550.54.15")
            times.append((time.perf_counter() - start) * 1000)
        print(f"hook: record_container {statistics.median(times):.3f} ms median ({len(times)} records, min {min(times):.3f}, max {max(times):.3f})")
        imports = []
        import py_compile  # as an install has them: compiled (PYTHONDONTWRITEBYTECODE may be set here)

        for module in ("ponytail/apply/containerrecord.py", "ponytail/fs/atomic.py"):
            py_compile.compile(str(REPO / module), invalidation_mode=py_compile.PycInvalidationMode.TIMESTAMP)
        for _ in range(10):
            out = subprocess.run([sys.executable, "-X", "importtime", "-c", "import ponytail.lite.plainjson, ponytail.fs.trust; "
                                  "import ponytail.apply.containerrecord, ponytail.fs.atomic"], capture_output=True, text=True, cwd=REPO).stderr
            imports.append(sum(int(line.split("|")[0].split(":")[1]) for line in out.splitlines()
                               if line.rstrip().endswith(("ponytail.apply.containerrecord", "ponytail.fs.atomic"))) / 1000)
        print(f"hook: importing containerrecord + fs.atomic {statistics.median(imports):.3f} ms median (self time, 10 fresh interpreters)")
        del Config

        fifo = base / "events"
        os.mkfifo(fifo)
        daemon = subprocess.Popen([PONYTAIL, "guard", "--config", str(config), "--events", str(fifo), "--interval", "1"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(3)  # started and a first pass made
        before, passes_before = cpu_seconds(daemon.pid), (base / "log").read_text().count(" pass (")
        time.sleep(args.seconds)
        after, passes_after = cpu_seconds(daemon.pid), (base / "log").read_text().count(" pass (")
        passes = passes_after - passes_before
        per_pass = (after - before) / max(passes, 1)
        print(f"daemon: {passes} passes over {args.containers} containers in {args.seconds:g} s: {per_pass * 1000:.2f} ms CPU per pass")
        for interval in (300.0, 60.0):
            print(f"daemon: idle at interval {interval:g} s: {per_pass * 3600 / interval:.2f} s CPU per hour")
        daemon.send_signal(signal.SIGTERM)
        daemon.wait()
        daemon = subprocess.Popen([PONYTAIL, "guard", "--config", str(config), "--events", str(fifo), "--interval", "600"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(3)
        before = cpu_seconds(daemon.pid)
        events = 20
        with open(fifo, "w") as f:
            for _ in range(events):
                f.write("add module nvidia\n")
                f.flush()
                time.sleep(0.6)  # apart from each other: each is its own burst
        time.sleep(1)
        spent = cpu_seconds(daemon.pid) - before
        print(f"daemon: {events} events: {spent / events * 1000:.2f} ms CPU per event (dev-char-links, then a pass; no CDI spec)")
        daemon.send_signal(signal.SIGTERM)
        daemon.wait()
    finally:
        for proc in sleepers:
            proc.kill()
            proc.wait()
        import shutil

        shutil.rmtree(base, ignore_errors=True)
        for cgroup in cgroups:
            for _ in range(50):
                try:
                    cgroup.rmdir()
                    break
                except OSError:
                    time.sleep(0.05)
    return 0


if __name__ == "__main__":
    sys.exit(main())
