"""Host paths and small host files (ponytail.fs.hostfiles)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ponytail.fs.hostfiles import is_under, read_head, under_root


def test_under_root_names_a_trees_file_by_its_letters() -> None:
    assert under_root("/", "/etc/x") == "/etc/x"
    assert under_root("/node/", "/etc/x") == under_root("/node", "etc/x") == "/node/etc/x"


def test_read_head_reads_at_most_its_limit(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"ab\xffcdef")
    assert read_head(str(path), 4) == "ab\ufffdc"
    assert read_head(str(tmp_path / "missing"), default="") == ""
    with pytest.raises(FileNotFoundError):
        read_head(str(tmp_path / "missing"))


def test_is_under_takes_a_tree_and_what_is_in_it_and_nothing_beside() -> None:
    assert is_under("/a/b", "/a") and is_under("/a", "/a") and is_under("/a/b", "/a/") and is_under("/x", "/")
    assert not is_under("/ab", "/a") and not is_under("/", "/a")
