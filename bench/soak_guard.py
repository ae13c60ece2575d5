"""Soak: ponytail guard under pid reuse. Stand-in containers (a process in a cgroup v1 devices
cgroup of its own, recorded as the prestart hook records one, allowed its GPU's nodes) lose their
GPU's rules as a systemd reload takes them; then `ponytail guard --once` runs while some of
their processes are SIGKILLed and their pids taken at once by processes in a cgroup of nobody's
container, which allows no device (clone3 with set_tid: tests/c/at_pid.c). Half the rounds run
the guard in this process with the window between its check and its write widened: the pid is
reused right there, every time.

    sudo .venv/bin/python bench/soak_guard.py [--rounds 40] [--containers 6] [--kill-rate 0.3]

Counts, and exits 1 unless all are zero:
- wrong GPUs: a GPU node's rule in nobody's cgroup (given to the process that took a pid);
- silent failures: a guard run that exited other than 0 or 1, or said a traceback; a container
  still running that the next pass did not give its nodes back;
- stuck: records of containers that are gone, left after a pass that may remove them.
bench/soak.py runs it after its own runs; tests/engines/test_guard.py runs a shorter one.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from support.fakehost import FakeHost, compile_program  # noqa: E402

DEVICES = Path("/sys/fs/cgroup/devices")
NODES = ((195, 0, "/dev/nvidia0"), (195, 255, "/dev/nvidiactl"), (511, 0, "/dev/nvidia-uvm"))


@dataclass
class GuardReport:
    rounds: int = 0
    passes: int = 0
    reused: int = 0  # pids taken by another process while a pass ran
    in_window: int = 0  # of those, taken between a pass's check and its write (the widened rounds)
    repaired: int = 0
    wrong_gpus: list[str] = field(default_factory=list)
    silent_failures: list[str] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def clean(self) -> bool:
        return not (self.wrong_gpus or self.silent_failures or self.stuck)

    def summary(self) -> str:
        return (f"guard under pid reuse: {self.rounds} rounds, {self.passes} passes in {self.seconds:.1f} s, {self.reused} pids reused "
                f"({self.in_window} inside the check-to-write window), {self.repaired} containers given back their nodes; "
                f"wrong GPUs {len(self.wrong_gpus)}, silent failures {len(self.silent_failures)}, stuck {len(self.stuck)}")


class Stand:
    """A stand-in container: ``sleep`` in a devices cgroup of its own, allowed NODES, recorded."""

    def __init__(self, parent: Path, name: str, records: str, driver_version: str) -> None:
        from ponytail.apply.containerrecord import record_container

        self.id = name
        self.cgroup = parent / name
        self.cgroup.mkdir()
        (self.cgroup / "devices.deny").write_text("a")
        for major, minor, _ in NODES:
            (self.cgroup / "devices.allow").write_text(f"c {major}:{minor} rw")
        self.process = subprocess.Popen(["sleep", "3600"], stdin=subprocess.DEVNULL)
        (self.cgroup / "cgroup.procs").write_text(str(self.process.pid))
        record_container(records, name, self.process.pid, "hook", [("c", *node) for node in NODES], driver_version)

    def reload(self) -> None:
        for major, minor, _ in NODES:
            (self.cgroup / "devices.deny").write_text(f"c {major}:{minor} rwm")

    def allowed(self) -> bool:
        rules = set((self.cgroup / "devices.list").read_text().splitlines())
        return all(f"c {major}:{minor} rw" in rules for major, minor, _ in NODES)

    def kill(self) -> int:
        pid = self.process.pid
        self.process.kill()
        self.process.wait()
        return pid

    def close(self) -> None:
        if self.process.poll() is None:
            self.kill()
        _rmdir(self.cgroup)


def guard_soak(base: Path, ponytail: str, rounds: int = 40, containers: int = 6, kill_rate: float = 0.3, seed: int = 1) -> GuardReport:
    """The guard-under-pid-reuse scenario (cgroup v1: a devices hierarchy at /sys/fs/cgroup/devices)."""
    report = GuardReport()
    if not (DEVICES / "devices.list").exists():
        report.silent_failures.append(f"no cgroup v1 devices hierarchy at {DEVICES}: the scenario needs one")
        return report
    rng = random.Random(seed)  # noqa: S311 - a repeatable schedule, not a secret
    host = FakeHost(base / "host")
    config_file = host.write_config()
    from ponytail.config import load_config

    config = load_config(str(config_file), True)
    at_pid = compile_program("at_pid.c")
    parent = DEVICES / f"ponytail-soak-{os.getpid()}"
    parent.mkdir()
    nobody = parent / "nobody"
    nobody.mkdir()
    (nobody / "devices.deny").write_text("a")
    taken: list[int] = []
    started = time.monotonic()
    try:
        for number in range(rounds):
            report.rounds += 1
            stands = [Stand(parent, f"soak-{number}-{i}", config.records_dir, host.driver_version) for i in range(containers)]
            try:
                for stand in stands:
                    stand.reload()
                doomed = [s for s in stands if rng.random() < kill_rate]
                if number % 2:
                    _widened_pass(config, stands, doomed, at_pid, nobody, taken, report)
                else:
                    _racing_pass(ponytail, config_file, doomed, at_pid, nobody, taken, rng, report)
                _check(report, nobody, number)
                again = _run_guard(ponytail, config_file, report)  # the next pass: every container still running has its nodes
                for stand in stands:
                    if stand.process.poll() is None:
                        if stand.allowed():
                            report.repaired += 1
                        else:
                            report.silent_failures.append(f"round {number}: container {stand.id} still running, not given back: {again}")
            finally:
                for pid in taken:
                    _kill(pid)
                taken.clear()
                for stand in stands:
                    stand.close()
            _check(report, nobody, number)
        _run_guard(ponytail, config_file, report)
        left = sorted(p.name for p in Path(config.records_dir).iterdir()) if Path(config.records_dir).is_dir() else []
        report.stuck += [f"record {name} left after the containers ended" for name in left]
    finally:
        for pid in taken:
            _kill(pid)
        if nobody.is_dir():
            for pid in (nobody / "cgroup.procs").read_text().split():
                _kill(int(pid))
        _rmdir(nobody)
        _rmdir(parent)
    report.seconds = time.monotonic() - started
    return report


def _racing_pass(ponytail: str, config_file: Path, doomed: list[Stand], at_pid: Path, nobody: Path, taken: list[int],
                 rng: random.Random, report: GuardReport) -> None:
    """`ponytail guard --once` while the doomed containers' pids are taken, at random moments of its run."""
    command = [ponytail, "guard", "--once", "--config", str(config_file)]
    guard = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for stand in doomed:
        time.sleep(rng.uniform(0.0, 0.08))
        if _reuse(stand.kill(), at_pid, nobody, taken):
            report.reused += 1
    out, err = guard.communicate(timeout=120)
    report.passes += 1
    _judge(report, guard.returncode, out, err)


def _widened_pass(config: object, stands: list[Stand], doomed: list[Stand], at_pid: Path, nobody: Path, taken: list[int],
                  report: GuardReport) -> None:
    """A pass in this process, each doomed container's pid taken between the pass's check and its write."""
    from ponytail.guard import watch

    by_cgroup = {"/" + str(s.cgroup.relative_to(DEVICES)): s for s in doomed}
    real = watch.denied_devices

    def widened(v1, *args, **kwargs):  # type: ignore[no-untyped-def]
        found = real(v1, *args, **kwargs)
        stand = by_cgroup.pop(v1, None)
        if stand is not None and _reuse(stand.kill(), at_pid, nobody, taken):
            report.reused += 1
            report.in_window += 1
        return found

    watch.denied_devices = widened  # type: ignore[assignment]
    try:
        watch.guard_pass(config, repair=True)  # type: ignore[arg-type]
    except Exception as e:  # noqa: BLE001 - counted: a pass must never raise
        report.silent_failures.append(f"a pass raised {type(e).__name__}: {e}")
    finally:
        watch.denied_devices = real
    report.passes += 1


def _run_guard(ponytail: str, config_file: Path, report: GuardReport) -> str:
    result = subprocess.run([ponytail, "guard", "--once", "--config", str(config_file)], capture_output=True, text=True, timeout=120)
    report.passes += 1
    _judge(report, result.returncode, result.stdout, result.stderr)
    return result.stdout.strip().splitlines()[-1] if result.stdout.strip() else result.stderr.strip()


def _judge(report: GuardReport, code: int, out: str, err: str) -> None:
    if code not in (0, 1) or "Traceback" in out + err or "internal error" in out + err:
        report.silent_failures.append(f"guard --once exit {code}: {(err or out).strip()[-300:]}")


def _check(report: GuardReport, nobody: Path, number: int) -> None:
    rules = (nobody / "devices.list").read_text().split("\n")
    given = [r for r in rules if r.strip()]
    if given:
        report.wrong_gpus.append(f"round {number}: nobody's cgroup was given {', '.join(given)}")
        (nobody / "devices.deny").write_text("a")


def _reuse(pid: int, at_pid: Path, nobody: Path, taken: list[int]) -> bool:
    """Start a process with the pid ``pid`` in nobody's cgroup; False when another process took it first."""
    result = subprocess.run([str(at_pid), str(pid), str(nobody / "cgroup.procs")], capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        return False
    taken.append(int(result.stdout))
    return True


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _rmdir(cgroup: Path) -> None:
    deadline = time.monotonic() + 10
    while True:
        try:
            cgroup.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:  # EBUSY: a killed process not yet gone from it
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def run(command: str, rounds: int = 40, containers: int = 6, kill_rate: float = 0.3, seed: int = 1) -> bool:
    """The scenario in a fresh directory, its lines printed; whether all its counts are zero."""
    base = Path(tempfile.mkdtemp(prefix="ponytail-soak-guard-"))
    try:
        report = guard_soak(base, command, rounds, containers, kill_rate, seed)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(report.summary())
    for line in report.wrong_gpus + report.silent_failures + report.stuck:
        print("  " + line)
    return report.clean


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--containers", type=int, default=6)
    parser.add_argument("--kill-rate", type=float, default=0.3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--command", default=str(Path(sys.executable).parent / "ponytail"), help="the ponytail command")
    args = parser.parse_args()
    return 0 if run(args.command, args.rounds, args.containers, args.kill_rate, args.seed) else 1


if __name__ == "__main__":
    sys.exit(main())
