"""One record store, one trust rule: configure's undo records and the migration's record.json (read by
``--undo`` and by the package trigger that puts NVIDIA's hook paths back) are believed only in a real
directory nobody else can write, from a regular file nobody else can read or write (ponytail.fs.trust)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ponytail.errors import ConfigError, PonytailError
from ponytail.install import undo
from ponytail.install.migrate import journal, keephooks

pytestmark = pytest.mark.unit

RECORD = {"version": journal.VERSION, "entries": [{
    "path": "/usr/bin/nvidia-cdi-hook", "before": {"kind": "nothing"}, "left": {"kind": "link", "target": "/usr/bin/ponytail"}}]}


def _stores(tmp_path: Path) -> tuple[Path, Path]:
    """configure's state directory with a record of /etc/docker/daemon.json, and migrate's with its record."""
    configure = tmp_path / "configure"
    configure.mkdir(mode=0o700)
    record = Path(undo.record_path(str(configure), "/etc/docker/daemon.json"))
    record.write_text(json.dumps({"path": "/etc/docker/daemon.json", "original": None, "written": "{}", "added": {}}))
    record.chmod(0o600)
    migrate = tmp_path / "node/var/lib/ponytail/migrate"
    (migrate / journal.FILES).mkdir(parents=True, mode=0o700)
    migrate.chmod(0o700)
    (migrate / journal.RECORD).write_text(json.dumps(RECORD))
    (migrate / journal.RECORD).chmod(0o600)
    return record, migrate / journal.RECORD


def _read_all(tmp_path: Path) -> list[str]:
    """What each reader of a record says: 'read', or its refusal."""
    said = []
    try:
        undo.read(str(tmp_path / "configure"), "/etc/docker/daemon.json")
        said.append("read")
    except ConfigError as e:
        said.append(e.message)
    try:
        journal.read_record(str(tmp_path / "node"), "/var/lib/ponytail/migrate", "not undoing")
        said.append("read")
    except PonytailError as e:
        said.append(e.message)
    lines = keephooks.put_back("/var/lib/ponytail/migrate", str(tmp_path / "node"))
    said.append(lines[0] if lines and "NVIDIA's package" not in lines[0] else "read")
    return said


def test_records_root_alone_can_write_are_read(tmp_path: Path) -> None:
    _stores(tmp_path)
    assert _read_all(tmp_path) == ["read", "read", "read"]


@pytest.mark.parametrize("mode", [0o644, 0o620])
def test_a_record_others_may_read_or_write_is_refused_by_every_reader(tmp_path: Path, mode: int) -> None:
    for record in _stores(tmp_path):
        record.chmod(mode)
    said = _read_all(tmp_path)
    assert said[0].startswith("configure's record") and "is mode" in said[0], said
    assert said[1].startswith("not undoing: the migration's record") and "is mode" in said[1], said
    assert said[2].startswith("ponytail: not putting back NVIDIA's hook paths: the migration's record"), said


def test_a_store_others_may_write_is_refused_by_every_reader(tmp_path: Path) -> None:
    for record in _stores(tmp_path):
        os.chmod(record.parent, 0o777)  # noqa: S103 - the store under test is open to all
    said = _read_all(tmp_path)
    assert all("mode 0777: group or others may write it" in s for s in said), said
