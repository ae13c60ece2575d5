"""The pure parts of ponytail guard: devices.list read as the kernel writes it, /proc/<pid>/cgroup's
paths, record names, which uevents matter, the metrics' text."""

from __future__ import annotations

import pytest

from ponytail.apply.containerrecord import cgroup_paths, record_name
from ponytail.guard.access import parse_devices_list, v1_allows
from ponytail.guard.events import relevant
from ponytail.guard.metrics import render_metrics
from ponytail.guard.watch import PassReport, Watched

RUNC_LIST = """c 1:3 rwm
c 1:5 rwm
c *:* m
b *:* m
c 136:* rwm
c 195:2 rw
c 195:255 rw
"""


def test_devices_list_rules_allow_what_they_name_with_read_and_write() -> None:
    rules = parse_devices_list(RUNC_LIST + "garbage\nc 1\n")
    assert v1_allows(rules, (195, 2)) and v1_allows(rules, (136, 7)) and v1_allows(rules, (1, 3))
    assert not v1_allows(rules, (195, 0))  # c *:* m: mknod only
    assert not v1_allows(parse_devices_list("c 195:0 r\n"), (195, 0))
    assert v1_allows(parse_devices_list("a *:* rwm\n"), (511, 1))
    assert not v1_allows(parse_devices_list("b 195:0 rwm\n"), (195, 0))
    assert not v1_allows([], (195, 0))


def test_cgroup_paths_on_hybrid_pure_v2_and_garbage() -> None:
    hybrid = "12:pids:/a\n11:devices:/system.slice/docker-1.scope\n1:name=systemd:/a\n0::/system.slice/docker-1.scope\n"
    assert cgroup_paths(hybrid) == {"v1": "/system.slice/docker-1.scope", "v2": "/system.slice/docker-1.scope"}
    assert cgroup_paths("0::/kubepods/pod1/c\n") == {"v1": None, "v2": "/kubepods/pod1/c"}
    assert cgroup_paths("garbage\n:::\n") == {"v1": None, "v2": None}


@pytest.mark.parametrize("bad", ["", ".hidden", "../x", "a/b", "a b", "x" * 201, "é"])
def test_a_record_is_named_by_a_plain_id_only(bad: str) -> None:
    assert record_name("4f1c0e9a_pod-1.2") == "4f1c0e9a_pod-1.2.json"
    with pytest.raises(ValueError):
        record_name(bad)


def test_only_the_driver_s_events_matter() -> None:
    assert relevant(("add", "module", "nvidia")) and relevant(("remove", "module", "nvidia_uvm"))
    assert relevant(("bind", "pci", "nvidia-pci:0000:3b:00.0")) and not relevant(("bind", "pci", "0000:00:1f.0"))
    assert relevant(("add", "nvidia-caps", "nvidia-cap1")) and not relevant(("change", "mem", "null"))
    assert relevant(("change", "mem", "null"), (("mem", "null"),)) and relevant(("change", "mem", "zero"), (("mem", ""),))
    assert not relevant(("add", "module", "loop"))


def test_the_metrics_say_what_the_pass_found() -> None:
    report = PassReport()
    for state in ("ok", "repaired", "lost", "gone"):
        watched = Watched(state, 1, "hook")
        watched.state = state
        report.containers.append(watched)
    report.containers[0].stale = ["given driver 550.54.15, 570.86.10 runs now"]
    report.containers[3].removed = True
    text = render_metrics(report, repairs_total=3, events_total=2)
    values = dict(line.split() for line in text.splitlines() if not line.startswith("#"))
    assert values["ponytail_guard_containers_watched"] == "3" and values["ponytail_guard_containers_lost"] == "2"
    assert values["ponytail_guard_containers_repaired"] == "1" and values["ponytail_guard_containers_stale"] == "1"
    assert values["ponytail_guard_records_removed"] == "1" and values["ponytail_guard_repairs_total"] == "3"
    assert all(line.startswith(("# HELP ponytail_guard_", "# TYPE ponytail_guard_", "ponytail_guard_")) for line in text.splitlines())


def test_an_inotify_queue_overflow_is_an_event_the_guard_acts_on(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """More entries made in /dev than the kernel's inotify queue holds: the events lost (which ones is not
    known), the node must be looked at again. The overflow comes out as one event that matters."""
    from pathlib import Path

    from ponytail.guard.events import NodeEvents

    events = NodeEvents(str(tmp_path))
    try:
        limit = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
        for i in range(limit + 16):
            (tmp_path / f"entry{i}").touch()
        received = []
        while True:
            batch = events.receive()
            if not batch:
                break
            received += batch
        assert [e for e in received if relevant(e)] == [("overflow", "inotify", "events lost")], received[-3:]
    finally:
        events.close()


def test_the_maps_scan_counts_only_the_recorded_file_and_stops_at_its_bounds(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """/proc/<pid>/maps read for a file's device and inode, not its name: a deleted file named like the
    driver's is not it. Past MAX_MAPS_BYTES the reading stops, and says so."""
    import mmap
    import os

    from ponytail.guard import binding

    decoy, real = tmp_path / "libcuda.so.1", tmp_path / "driver-file"
    held = []
    for path in (decoy, real):
        path.write_bytes(b"\0" * 4096)
        with open(path, "rb") as f:
            held.append(mmap.mmap(f.fileno(), 4096, prot=mmap.PROT_READ))
    real_st = real.stat()
    absent = max(real_st.st_ino, decoy.stat().st_ino) + 1  # neither file's inode (the decoy's may be the real one's + 1)
    decoy.unlink()
    try:
        budget = binding.ScanBudget()
        assert binding.mapping_processes([os.getpid()], (real_st.st_dev, real_st.st_ino), budget, "me") == [(os.getpid(), str(real))]
        assert binding.mapping_processes([os.getpid()], (real_st.st_dev, absent), budget, "me") == [] and not budget.hit
        monkeypatch.setattr(binding, "MAX_MAPS_BYTES", 4096)
        monkeypatch.setattr(binding, "_CHUNK", 4096)
        assert binding.mapping_processes([os.getpid()], (real_st.st_dev, absent), budget, "me") == []
        assert budget.hit == [f"me: process {os.getpid()}: only the first 4096 bytes of its maps read"], budget.hit
        spent = binding.ScanBudget(0.0)
        assert binding.mapping_processes([os.getpid()], (real_st.st_dev, real_st.st_ino), spent, "me") == []
        assert "the pass's 0 s for maps spent" in spent.hit[0], spent.hit
    finally:
        for m in held:
            m.close()
