"""Soak of the migration's transaction: ``ponytail migrate --from nvidia`` and ``--undo`` on a node with
NVIDIA's toolkit (tests/support/fake_toolkit.py), stopped again and again, then run again.

Each trial is one of:
- migrate, or undo of a migrated node, SIGKILLed right before a random one of the system calls that
  change a file (strace injects it), then a rerun of migrate or of undo, chosen at random;
- migrate on a root on a small tmpfs filled to a random level (from nothing free to enough), then, the
  filler gone, a rerun of migrate or of undo; or undo of a migrated node whose tmpfs is filled to the last block.

Counts, and fails unless the first two are zero:
- stuck nodes: a rerun refused (other than "nothing to undo" after a run killed before it began, or
  "records a migration already" after one killed past its last change), or a node that after the rerun
  is neither fully migrated (rerun of migrate) nor every file as it was, with its mode, owner and mtime
  (undo; and after migrate, a final undo too);
- broken: a run that failed without one line "ponytail: error: ..." (a traceback), or said it was done
  (exit 0) while the node is not as it says.

    sudo .venv/bin/python bench/soak_migrate.py [--trials 120]
bench/soak.py runs it after its hook soak.
"""

from __future__ import annotations

import argparse
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from support.fake_toolkit import (  # noqa: E402
    at_call,
    install_fake_toolkit,
    kill_points,
    listing_command,
    migrate_argv,
    undo_argv,
)
from support.fakehost import FakeHost, gpus  # noqa: E402


@dataclass
class MigrateReport:
    trials: int = 0
    killed: int = 0  # runs SIGKILLed
    full: int = 0  # runs that met a full disk (refused, one line)
    reruns: dict[str, int] = field(default_factory=dict)
    stuck: list[str] = field(default_factory=list)  # "trial N (...): what", one or more a trial
    broken: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def clean(self) -> bool:
        return not (self.stuck or self.broken)

    def summary(self) -> str:
        reruns = ", ".join(f"{n}x {k}" for k, n in sorted(self.reruns.items()))
        return (f"migrate/undo: {self.trials} trials in {self.seconds:.1f} s: {self.killed} SIGKILLed, {self.full} met a full disk; "
                f"reruns: {reruns}; stuck nodes {_trials(self.stuck)}, broken {_trials(self.broken)}")


def _trials(lines: list[str]) -> int:
    """How many trials ``lines`` speak of."""
    return len({line.split(":")[0] for line in lines})


def migrate_soak(base: Path, trials: int, seed: int = 1) -> MigrateReport:
    rng = random.Random(seed)  # noqa: S311 - a repeatable schedule of kills, not a secret
    host = FakeHost(base / "host", gpu_list=gpus(1))
    config = host.write_config()
    template = base / "template"
    install_fake_toolkit(template, program_size=64 << 10)
    _run(migrate_argv(template, config, "--dry-run"))  # the host's probe cache: the runs then change only the node
    original = _listing(template, True)
    clean = _copy(template, base / "clean")
    _run(migrate_argv(clean, config))
    migrated = _listing(clean, False).replace(str(clean), str(template))
    migrated_state = _copy(clean, base / "migrated-template")
    points = {"kill-migrate": kill_points(migrate_argv(_copy(template, base / "count-migrate"), config), base / "trace.txt"),
              "kill-undo": kill_points(undo_argv(_copy(migrated_state, base / "count-undo")), base / "trace.txt")}
    report = MigrateReport()
    started = time.monotonic()
    for n in range(trials):
        kind = rng.choice(("kill-migrate", "kill-undo", "kill-migrate", "full-migrate", "full-undo"))
        rerun = rng.choice(("migrate", "undo"))
        where = f"trial {n} ({kind}, then {rerun})"
        trial = base / f"trial-{n}"
        if kind.startswith("kill"):
            source = template if kind == "kill-migrate" else migrated_state
            _copy(source, trial)
            argv = migrate_argv(trial, config) if kind == "kill-migrate" else undo_argv(trial)
            call, when = rng.choice(points[kind])  # right before one of the calls that change a file
            first = _run(at_call(argv, when, calls=call))
            report.killed += first.returncode == -9
            _judge_first(report, first, where)
            _rerun_and_judge(report, trial, config, rerun, original, migrated, template, where)
        else:
            _full_disk_trial(report, rng, base, template, migrated_state, config, kind, rerun, original, migrated, where)
        report.reruns[rerun] = report.reruns.get(rerun, 0) + 1
        report.trials += 1
        shutil.rmtree(trial, ignore_errors=True)
    report.seconds = time.monotonic() - started
    return report


def _judge_first(report: MigrateReport, first: subprocess.CompletedProcess, where: str) -> None:
    if first.returncode not in (0, -9) and not _one_line(first):
        report.broken.append(f"{where}: exit {first.returncode}: {first.stderr[-300:]!r}")


def _one_line(result: subprocess.CompletedProcess) -> bool:
    return result.returncode in (1, 2) and result.stderr.startswith("ponytail: error: ") and result.stderr.count("\n") == 1


def _rerun_and_judge(report: MigrateReport, trial: Path, config: Path, rerun: str, original: str, migrated: str, template: Path,
                     where: str) -> None:
    if rerun == "migrate":
        again = _run(migrate_argv(trial, config))
        complete = again.returncode == 1 and "records a migration already" in again.stderr
        if again.returncode != 0 and not complete:
            report.stuck.append(f"{where}: migrate refused: {again.stderr.strip()[-300:]}")
            return
        if _listing(trial, False).replace(str(trial), str(template)) != migrated:
            (report.broken if again.returncode == 0 else report.stuck).append(f"{where}: migrate exited {again.returncode}, not migrated")
            return
    back = _run(undo_argv(trial))
    nothing = back.returncode == 1 and "nothing to undo: no migration is recorded" in back.stderr
    if back.returncode != 0 and not nothing:
        report.stuck.append(f"{where}: undo refused: {back.stderr.strip()[-300:]}")
    elif _listing(trial, True).replace(str(trial), str(template)) != original or (trial / "var/lib/ponytail").exists():
        (report.broken if back.returncode == 0 else report.stuck).append(f"{where}: undo exited {back.returncode}, not as it was")


def _full_disk_trial(report: MigrateReport, rng: random.Random, base: Path, template: Path, migrated_state: Path, config: Path,
                     kind: str, rerun: str, original: str, migrated: str, where: str) -> None:
    """One trial on a root that is a tmpfs of this trial's mount namespace (the listings are taken inside it)."""
    root = base / "tmpfs-root"
    root.mkdir(exist_ok=True)
    out = base / "out"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    source = template if kind == "full-migrate" else migrated_state
    first = " ".join(migrate_argv(root, config) if kind == "full-migrate" else undo_argv(root))
    # free blocks left: from none to about what the migration needs (a tmpfs block is a page)
    keep = rng.choice((0, 1, 2, rng.randint(3, 40), rng.randint(40, 200)))
    if kind == "full-undo":
        keep = 0
    again = " ".join(migrate_argv(root, config) if rerun == "migrate" else undo_argv(root))
    undo = " ".join(undo_argv(root))
    script = f"""
mount -t tmpfs -o size=8m,mode=755 tmpfs {root}
cp -a {source}/. {root}/
dd if=/dev/zero of={root}/filler bs=4k count=$(( $(stat -f -c %a {root}) - {keep} )) 2>/dev/null || true
r=0; {first} >/dev/null 2>{out}/first.err || r=$?; echo $r > {out}/first.rc
rm -f {root}/filler
r=0; {again} >/dev/null 2>{out}/again.err || r=$?; echo $r > {out}/again.rc
{listing_command(root, False)} > {out}/after-again.txt
r=0; {undo} >/dev/null 2>{out}/undo.err || r=$?; echo $r > {out}/undo.rc
{listing_command(root, True)} > {out}/after-undo.txt
ls -A {root}/var/lib 2>/dev/null > {out}/var-lib.txt || true
"""
    done = subprocess.run(["unshare", "-m", "--propagation", "private", "bash", "-euc", script], capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        report.broken.append(f"{where}: the trial's script failed: {done.stderr[-300:]!r}")
        return

    def result(name: str) -> subprocess.CompletedProcess:
        return subprocess.CompletedProcess([], int((out / f"{name}.rc").read_text()), "", (out / f"{name}.err").read_text())

    first_run, again_run, undo_run = result("first"), result("again"), result("undo")
    report.full += first_run.returncode == 1 and "space" in first_run.stderr
    _judge_first(report, first_run, where)
    if kind == "full-undo" and first_run.returncode != 0:
        report.stuck.append(f"{where}: undo on a full disk refused: {first_run.stderr.strip()[-300:]}")
    after_again = (out / "after-again.txt").read_text().replace(str(root), str(template))
    if rerun == "migrate":
        complete = again_run.returncode == 1 and "records a migration already" in again_run.stderr
        if again_run.returncode != 0 and not complete:
            report.stuck.append(f"{where}: migrate refused: {again_run.stderr.strip()[-300:]}")
        elif after_again != migrated:
            report.stuck.append(f"{where}: migrate exited {again_run.returncode}, not migrated")
    elif again_run.returncode != 0 and "nothing to undo" not in again_run.stderr:
        report.stuck.append(f"{where}: undo refused: {again_run.stderr.strip()[-300:]}")
    after_undo = (out / "after-undo.txt").read_text().replace(str(root), str(template))
    if after_undo != original or "ponytail" in (out / "var-lib.txt").read_text():
        report.stuck.append(f"{where}: after undo (exit {undo_run.returncode}: {undo_run.stderr.strip()[-200:]}), not as it was")


def _listing(root: Path, times: bool) -> str:
    return subprocess.run(["bash", "-c", listing_command(root, times)], capture_output=True, text=True, check=True).stdout


def _copy(source: Path, to: Path) -> Path:
    subprocess.run(["cp", "-a", str(source), str(to)], check=True)
    return to


def _run(argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=120)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="ponytail-soak-migrate-"))
    try:
        report = migrate_soak(base, args.trials, args.seed)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(report.summary())
    for line in report.stuck + report.broken:
        print("  " + line)
    return 0 if report.clean else 1


if __name__ == "__main__":
    sys.exit(main())
