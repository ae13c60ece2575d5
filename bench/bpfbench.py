#!/usr/bin/env python3
"""What the cgroup v2 step costs the hook: a benchmark script (run as root, not a test).

    .venv/bin/python bench/bpfbench.py [--runs N] [--nodes N]

Makes a fresh cgroup on this machine's cgroup2 hierarchy (/sys/fs/cgroup/unified, or
/sys/fs/cgroup on a pure v2 host) for each run, attaches a device program like runc's
(an allow list of runc's default nodes, deny otherwise) and times, in this process, what
the hook does for that cgroup: ``open_devices_cgroup`` (read /proc/<pid>/cgroup and
mountinfo, open the cgroup, list its programs and the inherited ones, read the program's
instructions, load its replacement) and ``allow_devices`` (swap it in with BPF_F_REPLACE).
The ``bpf`` module's import (ctypes is already loaded by the hook) is measured once apart.
Prints the median, quartiles and extremes in milliseconds; the target is 3 ms.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

RUNC_DEFAULTS = ((1, 3), (1, 5), (1, 7), (1, 8), (1, 9), (5, 0), (5, 1), (5, 2), (10, 200), (136, 0))


def runc_like(insn, ops) -> bytes:
    """An allow list laid out as runc does: one block per rule (c MAJOR:MINOR rwm), deny at the end."""
    out = [insn(ops.LDX_W, 2, 1, 0), insn(ops.AND32_K, 2, imm=0xFFFF), insn(ops.LDX_W, 3, 1, 0),
           insn(ops.RSH32_K, 3, imm=16), insn(ops.LDX_W, 4, 1, 4), insn(ops.LDX_W, 5, 1, 8)]
    for major, minor in RUNC_DEFAULTS:
        out += [
            insn(ops.JNE_K, 2, off=7, imm=2),
            insn(ops.MOV32_X, 1, 3), insn(ops.AND32_K, 1, imm=~7), insn(ops.JNE_K, 1, off=4, imm=0),
            insn(ops.JNE_K, 4, off=3, imm=major), insn(ops.JNE_K, 5, off=2, imm=minor),
            insn(ops.MOV64_K, 0, imm=1), insn(ops.EXIT),
        ]
    return b"".join(out) + insn(ops.MOV64_K, 0, imm=0) + insn(ops.EXIT)


IMPORT = """
import time, ctypes, ponytail.apply.executor  # what the hook has loaded before this step
started = time.perf_counter()
import ponytail.apply.bpf, ponytail.apply.cgroup2  # what this step adds
print((time.perf_counter() - started) * 1000)
"""


def _import_ms() -> float:
    """The step's own imports, in a fresh interpreter (with the .pyc files a pip install writes)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    out = subprocess.run([sys.executable, "-c", IMPORT], capture_output=True, text=True, env=env, cwd=REPO, check=True)
    return float(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=41)
    parser.add_argument("--nodes", type=int, default=4, help="injected nodes (4: one GPU with compute)")
    args = parser.parse_args()

    import_ms = statistics.median(_import_ms() for _ in range(21))
    from ponytail.apply import bpf
    from ponytail.apply.cgroup import allow_devices, open_devices_cgroup
    from ponytail.plan import devicefilter as ops
    from ponytail.plan.operations import AllowDevices

    root = Path("/sys/fs/cgroup/unified")
    if not root.is_dir():
        root = Path("/sys/fs/cgroup")
    devices = ((195, 0),) + tuple((195, 255 - i) for i in range(args.nodes - 1))
    op = AllowDevices(devices, "bench")
    program = runc_like(ops.insn, ops)
    times = []
    for _ in range(args.runs):
        path = root / f"ponytail-bench-{uuid.uuid4().hex[:12]}"
        path.mkdir()
        sleeper = subprocess.Popen(["sleep", "60"])
        try:
            (path / "cgroup.procs").write_text(str(sleeper.pid))
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
            prog = bpf.load_device_program(program, "bench_runc")
            bpf.attach_device_program(fd, prog, bpf.BPF_F_ALLOW_MULTI)
            started = time.perf_counter()
            cgroup = open_devices_cgroup(sleeper.pid, op)
            try:
                done = allow_devices(cgroup, op)
            finally:
                cgroup.close()
            times.append((time.perf_counter() - started) * 1000)
            assert done and "atomically" in done[-1], done
            os.close(prog)
            os.close(fd)
        finally:
            sleeper.kill()
            sleeper.wait()
            for _ in range(100):
                try:
                    path.rmdir()
                    break
                except OSError:
                    time.sleep(0.01)
    q = statistics.quantiles(times, n=4)
    print(f"cgroup v2 device program step, {len(program) // 8}-instruction runc-like program, {args.nodes} nodes, {args.runs} runs:")
    print(f"  median {statistics.median(times):.2f} ms, quartiles {q[0]:.2f}-{q[2]:.2f} ms, min-max {min(times):.2f}-{max(times):.2f} ms")
    print(f"  import of ponytail.apply.bpf, .cgroup2 and ponytail.plan.devicefilter (once per hook run, median of 21): {import_ms:.2f} ms")
    total = statistics.median(times) + import_ms
    print(f"  target: the two together <= 3 ms: {'met' if total <= 3 else 'missed'}, {total:.2f} ms")


if __name__ == "__main__":
    main()
