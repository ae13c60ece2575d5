"""Soak: many hook runs at once into stand-in containers, some sharing one rootfs
directory, with random SIGKILLs, a GPU whose driver information file flaps, and a driver
that changes under the runs: two GPUs trading minors (same driver), libcuda replaced by
another build of the same name (CUDA 11.0 or 12.4), libcuda rewritten in place by the other
build of the same size with its mtime restored (cp, then touch -r: only the ctime says so),
libcuda gone for a moment while a backup of an older driver's (libcuda.so.535.104.05.bak,
CUDA 10.2) lies beside it, and the probe cache files replaced by corrupted ones (root's
0600 files of 6 bytes, a tuple header counting 1.2 billion items: every trust check passes).

    sudo .venv/bin/python bench/soak.py [--runs 500] [--concurrency 16] [--kill-rate 0.2]

Counts, and exits 1 unless all are zero:
- wrong GPUs: a GPU node of another GPU than the container asked for, mounted in it
  (for the GPUs that trade minors: a minor the GPU did not have while a run into that
  container was going on);
- silent failures: a run that exited 0 while its container cannot use its GPU (the
  node, libcuda.so.1 by SONAME: a program in the container checks), loads another
  driver's libcuda (the .bak) or, when it requires CUDA >= 12.0, an 11.0 build (at the
  end, or libcuda was an 11.0 build for the whole run); or a failure that is not one line
  starting "ponytail: error:" (a traceback, an internal error, a run killed by memory); a
  blank line in the run log (runs appending at once);
- leaks: mounts left in this mount namespace, processes or descriptors left on the
  fake host or the rootfs directories, temporary files in the rootfs directories or
  in the fake host's cache directory (its [cache] dir).
Then ponytail guard under pid reuse (bench/soak_guard.py; --guard-rounds, 0 to leave it out).
tests/integration/test_faults.py runs a shorter soak; the README (Reliability) has the numbers of a full one.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from support.fakehost import FakeHost, gpus, make_rootfs  # noqa: E402


@dataclass
class Container:
    """A process in its own mount namespace, standing in for a container at prestart."""

    name: str
    rootfs: Path
    bundle: Path
    index: int  # the GPU it asks for
    minor: int  # that GPU's minor
    requires_cuda: bool = False  # NVIDIA_REQUIRE_CUDA=cuda>=12.0
    process: subprocess.Popen | None = None
    codes: list[int] = field(default_factory=list)
    windows: list[tuple[float, float]] = field(default_factory=list)  # (start, end) of each run into it
    retired: list[subprocess.Popen] = field(default_factory=list)  # earlier processes, replaced as an engine restarts a container
    lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> None:
        self.process = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sleep", "3600"], start_new_session=True)
        _wait_for_namespace(self.process.pid)

    def restart(self, process: subprocess.Popen) -> None:
        """A new container in place of ``process`` (unless that was done already): what an
        operator does when a run says 'start the container again'."""
        with self.lock:
            if self.process is process:
                self.retired.append(process)
                self.codes, self.windows = [], []
                self.start()

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid


@dataclass
class Report:
    runs: int = 0
    succeeded: int = 0
    failed: int = 0  # one clear line, exit 1 or 2
    killed: int = 0
    wrong_gpus: list[str] = field(default_factory=list)
    silent_failures: list[str] = field(default_factory=list)
    leaks: list[str] = field(default_factory=list)
    failure_kinds: dict[str, int] = field(default_factory=dict)
    changes: dict[str, int] = field(default_factory=dict)  # the driver's changes made meanwhile, by kind
    seconds: float = 0.0

    @property
    def clean(self) -> bool:
        return not (self.wrong_gpus or self.silent_failures or self.leaks)

    def summary(self) -> str:
        kinds = "; ".join(f"{n}x {k}" for k, n in sorted(self.failure_kinds.items(), key=lambda kv: -kv[1]))
        return (
            f"{self.runs} runs in {self.seconds:.1f} s: {self.succeeded} succeeded, {self.failed} failed with one line, "
            f"{self.killed} SIGKILLed; wrong GPUs {len(self.wrong_gpus)}, silent failures {len(self.silent_failures)}, "
            f"leaks {len(self.leaks)}" + (f"\nfailures: {kinds}" if kinds else "")
            + (f"\ndriver changes: {', '.join(f'{n}x {k}' for k, n in sorted(self.changes.items()))}" if self.changes else "")
        )


def soak(
    base: Path, ponytail: str, runs: int, concurrency: int, kill_rate: float, seed: int = 1, flap: bool = True, churn: bool = True
) -> Report:
    rng = random.Random(seed)  # noqa: S311 - a repeatable schedule of kills, not a secret
    host = FakeHost(base / "host", gpu_list=gpus(4, minors=[3, 1, 0, 2]))
    driver = Churn(host, random.Random(seed + 1)) if churn else None  # noqa: S311 - a repeatable schedule of driver changes
    config = host.write_config()
    template = make_rootfs(base / "template", programs=("cudacheck.c",))
    containers = _containers(base, host, template, rng, count=24, shared_by=3)
    mounts_before = _own_mounts(base)
    report = Report()
    stop = threading.Event()
    flapper = threading.Thread(target=_flap, args=(host, stop), daemon=True) if flap else None
    churner = threading.Thread(target=driver.run, args=(stop,), daemon=True) if driver else None
    started = time.monotonic()
    try:
        for c in containers:
            c.start()
        if flapper:
            flapper.start()
        if churner:
            churner.start()
        jobs = [(rng.choice(containers), rng.random() < kill_rate, rng.uniform(0.0, 0.15)) for _ in range(runs)]
        with ThreadPoolExecutor(concurrency) as pool:
            for (c, _, _), (code, error) in zip(jobs, pool.map(lambda job: _run(ponytail, config, *job), jobs), strict=True):
                _count(report, c, code, error)
        stop.set()
        if flapper:
            flapper.join()
        if churner:
            churner.join()
        for c in containers:
            _check_container(report, host, c, driver)
    finally:
        stop.set()
        for c in containers:
            for process in [*c.retired, c.process]:
                if process is not None:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
    report.seconds = time.monotonic() - started
    report.changes = dict(driver.counts) if driver else {}
    blank = host.log.read_text(errors="replace").split("\n")[:-1].count("") if host.log.exists() else 0
    if blank:  # runs appending at once: a record half-way written taken for a torn one
        report.silent_failures.append(f"the log has {blank} blank line(s)")
    _check_leaks(report, host, containers, mounts_before)
    return report


def _containers(base: Path, host: FakeHost, template: Path, rng: random.Random, count: int, shared_by: int) -> list[Container]:
    containers = []
    for i in range(count):
        rootfs = base / f"rootfs{i // shared_by}"
        if not rootfs.exists():
            shutil.copytree(template, rootfs, symlinks=True)
        index = rng.randrange(len(host.gpu_list))
        env = ["PATH=/bin", f"NVIDIA_VISIBLE_DEVICES={index}"] + (["NVIDIA_REQUIRE_CUDA=cuda>=12.0"] if i % 2 else [])
        bundle = base / f"bundle{i}"
        bundle.mkdir()
        spec = {"ociVersion": "1.0.2", "root": {"path": str(rootfs)}, "process": {"args": ["sh"], "env": env, "cwd": "/"}}
        (bundle / "config.json").write_text(json.dumps(spec))
        containers.append(Container(f"soak-{i}", rootfs, bundle, index, host.gpu_list[index].minor, bool(i % 2)))
    return containers


def _wait_for_namespace(pid: int) -> None:
    for _ in range(500):
        try:
            if os.readlink(f"/proc/{pid}/ns/mnt") != os.readlink("/proc/self/ns/mnt"):
                return
        except FileNotFoundError:
            pass
        time.sleep(0.01)
    raise RuntimeError(f"process {pid} never entered its own mount namespace")


def _flap(host: FakeHost, stop: threading.Event) -> None:
    """The information file of the GPU at index 0 goes away and comes back, again and again."""
    info = host.proc / "driver/nvidia/gpus" / host.gpu_list[0].bus_id / "information"
    away = info.with_name("information.away")
    while not stop.wait(0.03):
        info.rename(away)
        time.sleep(0.01)
        away.rename(info)


class Churn:
    """A driver changing under the runs, one change every 0.5-1.5 s: GPUs 2 and 3 trade minors
    (their information files rewritten, each atomically: between the two a minor is
    briefly doubled), libcuda.so.550.54.15 replaced by another build of that name (CUDA
    11.0, then 12.4 again), rewritten in place by the other build with its mtime restored,
    or gone for 10 ms while libcuda.so.535.104.05.bak (CUDA 10.2) stays; or the probe cache
    files corrupted. Remembers when each GPU had which minor and libcuda which CUDA, to
    judge a mounted node and a run's exit afterwards."""

    TRADING = (2, 3)
    CORRUPT_CACHE = b"(" + (1_200_000_000).to_bytes(4, "little") + b"N"  # marshal would allocate 9.6 GB

    def __init__(self, host: FakeHost, rng: random.Random) -> None:
        from support.fakehost import compile_library

        self.host, self.rng = host, rng
        self.libdir = host.driver / host.lib_dir.lstrip("/")
        self.libcuda = self.libdir / f"libcuda.so.{host.driver_version}"
        name = self.libcuda.name
        self.builds = {c: compile_library("fake_libcuda.c", "libcuda.so.1", name, host.driver_version, c) for c in (12040, 11000)}
        backup = compile_library("fake_libcuda.c", "libcuda.so.1", "libcuda.so.535.104.05", "535.104.05", 10020)
        shutil.copy(backup, self.libdir / "libcuda.so.535.104.05.bak")
        if len({p.stat().st_size for p in self.builds.values()}) != 1:
            raise RuntimeError("the two libcuda builds differ in size: an in-place rewrite would change the size too")
        self.minors = {i: host.gpu_list[i].minor for i in self.TRADING}
        self.history: list[tuple[float, float, dict[int, int]]] = [(0.0, 0.0, dict(self.minors))]  # (began, done, minors)
        self.cuda = 12040  # what libcuda.so.550.54.15 is now
        self.cuda_history: list[tuple[float, float, int]] = [(0.0, 0.0, self.cuda)]  # (began, done, CUDA)
        self.counts: dict[str, int] = {}

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(self.rng.uniform(0.5, 1.5)):
            action = self.rng.choice(("trade", "build", "rewrite", "hide", "corrupt"))
            self.counts[action] = self.counts.get(action, 0) + 1
            if action == "trade":
                began = time.monotonic()
                a, b = self.TRADING
                self.minors = {a: self.minors[b], b: self.minors[a]}
                for i in self.TRADING:
                    self._set_minor(i, self.minors[i])
                self.history.append((began, time.monotonic(), dict(self.minors)))
            elif action == "build":
                self._install(self.rng.choice(sorted(self.builds)))
            elif action == "rewrite":
                self._rewrite_in_place(11000 if self.cuda == 12040 else 12040)
            elif action == "corrupt":
                self._corrupt_caches()
            else:
                away = self.libcuda.with_name("libcuda.away")
                self.libcuda.rename(away)
                time.sleep(0.01)
                away.rename(self.libcuda)
        self._install(12040)

    def _rewrite_in_place(self, cuda: int) -> None:
        """The same inode, size and mtime, the other build's bytes (cp over it, then touch -r)."""
        began = time.monotonic()
        before = self.libcuda.stat()
        with open(self.libcuda, "r+b") as f:
            f.write(self.builds[cuda].read_bytes())
        os.utime(self.libcuda, ns=(before.st_atime_ns, before.st_mtime_ns))
        self.cuda = cuda
        self.cuda_history.append((began, time.monotonic(), cuda))

    def _corrupt_caches(self) -> None:
        """Every probe cache file replaced (renamed over) by a root-owned 0600 file of 6 bytes."""
        for cache in (self.host.base / "cache").glob("probe-*.cache"):
            bad = cache.with_name(".corrupt")
            bad.write_bytes(self.CORRUPT_CACHE)
            bad.chmod(0o600)
            bad.rename(cache)
    def _set_minor(self, index: int, minor: int) -> None:
        info = self.host.proc / "driver/nvidia/gpus" / self.host.gpu_list[index].bus_id / "information"
        lines = [f"Device Minor: \t {minor}" if line.startswith("Device Minor:") else line for line in info.read_text().splitlines()]
        new = info.with_name("information.new")
        new.write_text("\n".join(lines) + "\n")
        new.rename(info)

    def _install(self, cuda: int) -> None:
        if self.cuda != 12040:  # the inode that goes keeps 12.4 for the containers that have it mounted
            self._rewrite_in_place(12040)
        began = time.monotonic()
        new = self.libcuda.with_name("libcuda.new")
        shutil.copy(self.builds[cuda], new)
        new.rename(self.libcuda)
        self.cuda = cuda
        self.cuda_history.append((began, time.monotonic(), cuda))

    def cudas_during(self, start: float, end: float) -> set[int]:
        """Every CUDA version libcuda had while the run from ``start`` to ``end`` was going on."""
        found = set()
        for k, (began, _, cuda) in enumerate(self.cuda_history):
            until = self.cuda_history[k + 1][1] if k + 1 < len(self.cuda_history) else float("inf")
            if start <= until and began <= end:
                found.add(cuda)
        return found

    def minors_during(self, index: int, windows: list[tuple[float, float]]) -> set[int]:
        """Every minor GPU ``index`` had while one of ``windows`` was going on."""
        found = set()
        for k, (began, _, minors) in enumerate(self.history):
            until = self.history[k + 1][1] if k + 1 < len(self.history) else float("inf")  # current until the next change is done
            if any(start <= until and began <= end for start, end in windows):
                found.add(minors[index])
        return found


def _run(ponytail: str, config: Path, c: Container, kill: bool, delay: float) -> tuple[int, str]:
    process = c.process
    assert process is not None
    state = json.dumps({"ociVersion": "1.0.2", "id": c.name, "status": "creating", "pid": process.pid, "bundle": str(c.bundle)})
    started = time.monotonic()
    run = subprocess.Popen(
        [ponytail, "-config", str(config)], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    if kill:
        timer = threading.Timer(delay, lambda: run.poll() is None and run.send_signal(signal.SIGKILL))
        timer.start()
    _, err = run.communicate(state.encode(), timeout=120)
    if kill:
        timer.cancel()
    error = err.decode(errors="replace")
    with c.lock:
        if c.process is process:  # a run into an earlier container says nothing about this one
            c.windows.append((started, time.monotonic()))
            c.codes.append(run.returncode)
    if "start the container again" in error:
        c.restart(process)
    return run.returncode, error


def _count(report: Report, c: Container, code: int, error: str) -> None:
    report.runs += 1
    if code == -signal.SIGKILL:
        report.killed += 1
    elif code == 0:
        report.succeeded += 1
    elif code in (1, 2) and error.startswith("ponytail: error: ") and error.count("\n") == 1 and "internal error" not in error:
        report.failed += 1
        kind = error[len("ponytail: error: "):].replace(str(c.rootfs.parent), "...").split(": ")[0][:90]
        report.failure_kinds[kind] = report.failure_kinds.get(kind, 0) + 1
    else:
        report.silent_failures.append(f"{c.name}: exit {code}: {error[:300]!r}")


def _check_container(report: Report, host: FakeHost, c: Container, churn: Churn | None = None) -> None:
    """Only its own GPU's node may be mounted in it (for a GPU trading minors, a minor it had
    during a run into it); and when a run said it was done, a program in it must find
    libcuda.so.1 of the running driver (12.4, or the 11.0 build where CUDA 12 is not
    required) and open that node."""
    with open(f"/proc/{c.pid}/mountinfo") as f:
        points = [line.split()[4] for line in f]
    prefix = f"{c.rootfs}/dev/nvidia"
    gpu_nodes = {p[len(prefix):] for p in points if p.startswith(prefix) and p[len(prefix):].isdigit()}
    allowed = churn.minors_during(c.index, c.windows) if churn and c.index in churn.TRADING else {c.minor}
    for minor in sorted(gpu_nodes - {str(m) for m in allowed}):
        report.wrong_gpus.append(f"{c.name} asked for GPU {c.index} (minor {sorted(allowed)}) and has /dev/nvidia{minor}")
    report.silent_failures += [f"{c.name}: {p} is mounted" for p in points if p.startswith(str(c.rootfs)) and ".bak" in p]
    if churn and c.requires_cuda:  # a run that exited 0 while libcuda was CUDA 11.0 throughout
        for code, (start, end) in zip(c.codes, c.windows, strict=True):
            if code == 0 and 12040 not in churn.cudas_during(start, end):
                report.silent_failures.append(f"{c.name}: a run requiring CUDA >= 12.0 exited 0 while libcuda was CUDA 11.0")
    if 0 not in c.codes:
        return
    minor = sorted(int(m) for m in gpu_nodes)[-1] if gpu_nodes else c.minor
    check = subprocess.run(
        ["nsenter", "-t", str(c.pid), "-m", "chroot", str(c.rootfs), "/usr/local/bin/cudacheck", f"/dev/nvidia{minor}"],
        capture_output=True, text=True, timeout=60,
    )
    versions = ("12040",) if c.requires_cuda or not churn else ("12040", "11000")
    if check.stdout.splitlines() not in ([f"cuDriverGetVersion {v}", f"open /dev/nvidia{minor} ENXIO"] for v in versions):
        report.silent_failures.append(f"{c.name}: a run exited 0, but in the container: {check.stdout!r} {check.stderr[:200]!r}")


def _own_mounts(base: Path) -> list[str]:
    """Mount points under ``base`` in this (the host's) mount namespace."""
    with open("/proc/self/mountinfo") as f:
        return sorted(p for p in (line.split()[4] for line in f) if p.startswith(str(base)))


def _check_leaks(report: Report, host: FakeHost, containers: list[Container], mounts_before: list[str]) -> None:
    mounts_after = _own_mounts(host.base.parent)
    if mounts_after != mounts_before:
        report.leaks.append(f"mounts in this mount namespace: {sorted(set(mounts_after) - set(mounts_before))[:5]}")
    watched = [str(host.base)] + sorted({str(c.rootfs) for c in containers})
    for _ in range(100):  # a killed process takes a moment to go
        holders = _holders(watched)
        if not holders:
            break
        time.sleep(0.05)
    report.leaks += holders
    for rootfs in sorted({c.rootfs for c in containers}):
        for path in rootfs.rglob("*"):
            if "ponytail-new" in path.name or path.name.endswith("~"):
                report.leaks.append(f"left in the rootfs: {path}")
    run_dir = host.base / "cache"  # the fake host's [cache] dir, where the runs keep their caches and records
    if run_dir.is_dir():
        # the caches themselves (cuda-version.json, probe-*.cache); a temporary file is a leak
        caches = [p for p in run_dir.iterdir() if p.name == "cuda-version.json" or p.match("probe-*.cache")]
        records = run_dir / "containers"  # ponytail guard's records: one <id>.json per GPU container, pruned by the guard
        report.leaks += [f"left in {run_dir}: {p.name}" for p in run_dir.iterdir() if p not in caches and p != records]
        if records.is_dir():
            report.leaks += [f"left in {records}: {p.name}" for p in records.iterdir() if not p.name.endswith(".json") or p.name.startswith(".")]


def _holders(paths: list[str]) -> list[str]:
    """Processes (not this one) with a descriptor, a mapping or a working directory under ``paths``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            names = [os.readlink(f"/proc/{entry}/fd/{fd}") for fd in os.listdir(f"/proc/{entry}/fd")]
            names.append(os.readlink(f"/proc/{entry}/cwd"))
            with open(f"/proc/{entry}/maps") as f:
                names += [line.split()[-1] for line in f if "/" in line]
        except OSError:
            continue
        for name in names:
            if any(name.startswith(p) for p in paths):
                found.append(f"process {entry} holds {name}")
                break
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--kill-rate", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--command", default=str(Path(sys.executable).parent / "ponytail"), help="the ponytail command")
    parser.add_argument("--guard-rounds", type=int, default=40, help="rounds of the guard under pid reuse (bench/soak_guard.py)")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="ponytail-soak-"))
    try:
        report = soak(base, args.command, args.runs, args.concurrency, args.kill_rate, args.seed)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(report.summary())
    for line in report.wrong_gpus + report.silent_failures + report.leaks:
        print("  " + line)
    guard = True
    if args.guard_rounds > 0:
        from soak_guard import run as guard_under_pid_reuse

        guard = guard_under_pid_reuse(args.command, args.guard_rounds, seed=args.seed)
    return 0 if report.clean and guard else 1


if __name__ == "__main__":
    sys.exit(main())
