"""The containers' records (ponytail.apply.containerrecord) as the hooks write them: root's alone, replaced
atomically, and pruned of containers whose process is gone."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

from ponytail.apply.containerrecord import open_records_dir, process_start, prune_records, record_container

GPU = [("c", 195, 0, "/dev/nvidia0")]


def test_a_record_is_root_s_alone_and_names_the_process(tmp_path: Path) -> None:
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        directory = tmp_path / "cache" / "containers"  # [cache] dir not made yet (no probe cache written on this node)
        path = Path(record_container(str(directory), "c1", sleeper.pid, "hook", GPU, "550.54.15"))
        assert stat.S_IMODE(directory.parent.stat().st_mode) == 0o700
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700 and stat.S_IMODE(path.stat().st_mode) == 0o600
        record = json.loads(path.read_text())
        assert (record["pid"], record["pid_start"]) == (sleeper.pid, process_start(sleeper.pid)) and record["pid_start"] > 0
        assert record["devices"] == [{"type": "c", "major": 195, "minor": 0, "path": "/dev/nvidia0"}]
        assert record["cgroup"]["v1"] is not None or record["cgroup"]["v2"] is not None
    finally:
        sleeper.kill()
        sleeper.wait()


def private(path: Path, text: str) -> None:
    """A file as root's records are written: mode 0600."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def test_records_of_gone_processes_and_killed_writers_leftovers_are_pruned(tmp_path: Path) -> None:
    alive = subprocess.Popen(["sleep", "60"])
    gone = subprocess.Popen(["true"])
    gone.wait()
    try:
        directory = str(tmp_path / "records")
        record_container(directory, "alive", alive.pid, "hook", GPU, "550.54.15")
        record_container(directory, "reused", alive.pid, "hook", GPU, "550.54.15")
        reused = Path(directory, "reused.json")  # the same pid, but another process: a different start time
        reused.write_text(reused.read_text().replace(f'"pid_start": {process_start(alive.pid)}', '"pid_start": 1'))
        private(Path(directory, "gone.json"), json.dumps({"version": 1, "id": "gone", "pid": gone.pid, "pid_start": 5}))
        Path(directory, f".alive.json.{gone.pid}-0123456789ab.tmp").write_text("")  # a writer killed before its rename
        private(Path(directory, "garbage.json"), "{")  # a record cut short: cleared, never kept for ever
        # a gone process's record that others could have written: never removed on its word (the guard says so)
        Path(directory, "forged.json").write_text(json.dumps({"version": 1, "id": "forged", "pid": gone.pid, "pid_start": 5}))
        fd = open_records_dir(directory)
        try:
            assert prune_records(fd) == 4
        finally:
            os.close(fd)
        assert sorted(os.listdir(directory)) == ["alive.json", "forged.json"]
    finally:
        alive.kill()
        alive.wait()
