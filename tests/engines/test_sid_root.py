"""The current engines' root (support.sidroot, `make test-engines`): Debian sid's packages, the versions the
README's compatibility table names, and the isolation the engine tests rely on: a command there writes
nothing into the cached root and meets none of the machine's services."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from support.commands import REPO
from support.sidroot import run_in_sid, sid_root, versions

pytestmark = pytest.mark.current_engines
# package -> the program's own --version, run in the root
PROGRAMS = {"containerd": ["containerd", "--version"], "runc": ["runc", "--version"], "docker.io": ["dockerd", "--version"],
            "podman": ["podman", "--version"], "crun": ["crun", "--version"]}


def upstream(version: str) -> str:
    """1:2.1.9+ds1-5 -> 2.1.9 (no epoch, no Debian repacking or revision)."""
    return re.split(r"[+~-]", version.split(":", 1)[-1], maxsplit=1)[0]


def test_the_readme_names_the_versions_that_ran() -> None:
    installed = {name: upstream(v) for name, v in versions().items() if name in PROGRAMS}
    assert sorted(installed) == sorted(PROGRAMS), installed
    table = (REPO / "README.md").read_text().split("## Compatibility", 1)[1].split("\n## ", 1)[0]
    for name, version in installed.items():
        said = run_in_sid(PROGRAMS[name])
        assert said.returncode == 0 and version in said.stdout, (name, said.stdout, said.stderr)
        assert version in table, f"the README's compatibility table does not name {name} {version}, which ran"


def test_a_command_in_the_root_leaves_the_cache_and_the_machine_alone(tmp_path: Path) -> None:
    root = sid_root()
    probe = tmp_path / "probe"
    said = run_in_sid(["sh", "-c", f"echo x > /etc/ponytail-probe && ls -A /run && echo seen > {probe} && cat /proc/1/comm"])
    assert said.returncode == 0, said.stderr
    *run, first = said.stdout.split()
    assert set(run) <= {"mount"}, run  # a fresh /run: no service's socket (util-linux's utab of its own mounts alone)
    assert first == "sh", said.stdout  # PID 1 is its own: a PID namespace of its own
    assert not (root / "etc/ponytail-probe").exists()  # the overlay's upper layer took the write
    assert probe.read_text() == "seen\n"  # the machine's /tmp is there, at its own path
