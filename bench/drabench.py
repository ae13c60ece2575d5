#!/usr/bin/env python3
"""What ``ponytail dra-plugin`` costs: a benchmark script (run as root, not a test).

    .venv/bin/python bench/drabench.py [--gpus N] [--claims N] [--idle-seconds S]

On a fake host of N GPUs, with the tests' stand-in API server and kubelet (tests/support/dra.py):
1. startup: from starting the plugin to its first ResourceSlice on the API server;
2. prepare: each of --claims one-GPU claims prepared through the kubelet's gRPC call (median, p99),
   then unprepared (median);
3. the idle daemon: its resident memory (VmRSS) after the prepares, and its CPU
   (/proc/<pid>/task/*/schedstat) over S idle seconds with the kubelet's health stream open and the
   kernel log a FIFO nobody writes (a read that blocks, as /dev/kmsg's does), as seconds per hour.
Prints one line per figure; bench/RESULTS.md keeps the last run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from support.dra import DRIVER, NODE, DraNode  # noqa: E402
from support.fakehost import FakeHost, gpus  # noqa: E402
from support.kube_api import allocated_claim  # noqa: E402


def cpu_seconds(pid: int) -> float:
    return sum(int((task / "schedstat").read_text().split()[0]) for task in Path(f"/proc/{pid}/task").iterdir()) / 1e9


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def drain(stream: object) -> None:
    import grpc

    try:
        for _ in stream:  # type: ignore[attr-defined]
            pass
    except grpc.RpcError:
        pass  # cancelled at the end


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--claims", type=int, default=200)
    parser.add_argument("--idle-seconds", type=float, default=120.0)
    parser.add_argument("--resync", default="60", help="the plugin's --resync (seconds)")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="drabench-"))
    host = FakeHost(base / "host", gpu_list=gpus(args.gpus))
    node = DraNode(host, base, extra=("--resync", args.resync))
    node.kmsg.unlink()
    os.mkfifo(node.kmsg)
    try:
        started = time.monotonic()
        node.start(register=False)
        while not node.api.slices:
            time.sleep(0.002)
        startup = time.monotonic() - started
        node.kubelet.register()
        assert node.process is not None
        pid = node.process.pid
        prepare, unprepare = [], []
        for i in range(args.claims):
            uid = f"00000000-0000-4000-8000-{i:012x}"
            node.api.add_claim(allocated_claim("bench", f"c{i}", uid, DRIVER, NODE, [f"gpu-{i % args.gpus}"]))
            claim = node.kubelet.claim("bench", uid, f"c{i}")
            t = time.perf_counter()
            response = node.kubelet.prepare(claim)
            prepare.append(time.perf_counter() - t)
            assert not response.claims[uid].error, response.claims[uid].error
            t = time.perf_counter()
            node.kubelet.unprepare(claim)
            unprepare.append(time.perf_counter() - t)
        stream = node.kubelet.health(timeout=args.idle_seconds + 600)
        threading.Thread(target=drain, args=(stream,), daemon=True).start()  # the kubelet keeps it open
        time.sleep(2.0)
        rss = rss_mib(pid)
        before = cpu_seconds(pid)
        time.sleep(args.idle_seconds)
        idle = cpu_seconds(pid) - before
        stream.cancel()
    except BaseException:
        print(node.log(), file=sys.stderr)
        raise
    finally:
        node.close()
    prepare.sort()
    print(f"host: {args.gpus} fake GPUs; {args.claims} one-GPU claims, each prepared and unprepared through the stand-in kubelet")
    print(f"startup to the first ResourceSlice: {startup * 1000:.0f} ms")
    print(f"prepare: median {statistics.median(prepare) * 1000:.1f} ms, p99 {prepare[int(len(prepare) * 0.99) - 1] * 1000:.1f} ms")
    print(f"unprepare: median {statistics.median(unprepare) * 1000:.1f} ms")
    print(f"resident memory after the prepares: {rss:.1f} MiB")
    print(f"idle CPU: {idle:.3f} s in {args.idle_seconds:.0f} s = {idle * 3600 / args.idle_seconds:.2f} s per hour (health stream open, resync every {args.resync} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
