"""``ponytail migrate --from nvidia`` and ``--undo`` as one transaction, on a node with NVIDIA's toolkit in
plain files (tests/support/fake_toolkit.py): killed (SIGKILL, Ctrl-C) at every system call that changes a
file, a rerun of either command completes it or rolls it back: migrated like a run never stopped, or every
file back byte for byte with its mode, owner and times; never a node neither command will touch. A failed
fsync never costs the only copy of an original; a full disk is found before the first change; the record is
believed only as root's alone, names only places a migration touches, and a saved copy only as recorded;
--root's absolute links lead inside the root."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from support.fake_toolkit import (
    NVIDIA_SPEC,
    at_call,
    install_fake_toolkit,
    kill_points,
    listing_command,
    migrate_argv,
    node_files,
    undo_argv,
    without_mtimes,
)
from support.fakehost import FakeHost, gpus
from support.harness import in_private_mount_ns

STATE = "var/lib/ponytail/migrate"


@pytest.fixture
def node(tmp_path: Path) -> tuple[Path, Path, dict[str, bytes]]:
    """(the node's root with NVIDIA's toolkit, ponytail's config, every file of it as it was)."""
    host = FakeHost(tmp_path / "host", gpu_list=gpus(1))
    root = tmp_path / "root"
    install_fake_toolkit(root)
    config = host.write_config()
    assert run(migrate_argv(root, config, "--dry-run")).returncode == 0  # the host's probe cache written: runs change only the node
    return root, config, node_files(root)


def run(argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def one_line_error(result: subprocess.CompletedProcess, code: int = 1) -> str:
    assert result.returncode == code and result.stderr.startswith("ponytail: error: ") and result.stderr.count("\n") == 1, result
    return result.stderr


def migrated_files(root: Path, config: Path, tmp_path: Path) -> dict[str, bytes]:
    """The node as an uninterrupted migration leaves it (bytes, modes, owners)."""
    clean = _copy(root, tmp_path / "clean")
    assert run(migrate_argv(clean, config)).returncode == 0
    return {p.replace(str(clean), str(root), 1): b for p, b in without_mtimes(node_files(clean)).items()}


def check_reruns(root: Path, config: Path, killed: subprocess.CompletedProcess, original: dict[str, bytes],
                 migrated: dict[str, bytes], where: str) -> None:
    """From the state a killed run left: a rerun of migrate migrates fully, an undo (of a copy of that
    state) gives back every file as it was; neither is refused."""
    assert "Traceback" not in killed.stderr, (where, killed.stderr)
    copy = root.parent / f"{root.name}-copy"
    shutil.rmtree(copy, ignore_errors=True)
    subprocess.run(["cp", "-a", str(root), str(copy)], check=True)
    forward = run(migrate_argv(root, config))
    complete = forward.returncode == 1 and "records a migration already" in forward.stderr  # killed after its last change
    assert forward.returncode == 0 or complete, (where, forward.stderr)
    assert without_mtimes(node_files(root)) == migrated, where
    assert (root / STATE / "record.json").is_file(), where
    back = run(undo_argv(copy))
    nothing = back.returncode == 1 and "nothing to undo: no migration is recorded" in back.stderr  # killed before it began
    assert back.returncode == 0 or nothing, (where, back.stderr)
    assert {p.replace(str(copy), str(root), 1): b for p, b in node_files(copy).items()} == original, where
    assert not (copy / "var/lib/ponytail").exists(), where
    shutil.rmtree(copy)


@pytest.mark.slow
@pytest.mark.parametrize("signal", ["KILL", "INT"])
@pytest.mark.parametrize("command", ["migrate", "undo"])
def test_a_migration_or_undo_stopped_at_every_step_is_completed_or_undone(node: tuple[Path, Path, dict[str, bytes]], tmp_path: Path,
                                                                         command: str, signal: str) -> None:
    """A migration (about 64 such calls) or the undo of a migrated node (about 54), each stopped once at every one."""
    root, config, original = node
    migrated = migrated_files(root, config, tmp_path)
    if command == "undo":
        assert run(migrate_argv(root, config)).returncode == 0
    argv = undo_argv if command == "undo" else (lambda at: migrate_argv(at, config))
    kill_everywhere(argv, root, config, original, migrated, signal, 30)


def kill_everywhere(argv: Callable[[Path], list[str]], root: Path, config: Path, original: dict[str, bytes], migrated: dict[str, bytes],
                    signal: str, at_least: int) -> None:
    """``argv`` (of a copy of ``root``) stopped by ``signal`` right before each call that changes a file, in turn;
    from each such state, check_reruns."""
    points = kill_points(argv(_copy(root, root.parent / "count")), root.parent / "trace.txt")
    assert len(points) > at_least, points

    def one(point: tuple[str, int]) -> None:
        call, when = point
        trial = _copy(root, root.parent / f"trial-{call}-{when}")
        killed = run(at_call(argv(trial), when, f"signal={signal}", calls=call))
        assert killed.returncode != 0, point  # it was stopped there
        check_reruns(trial, config, killed, _moved(original, root, trial), _moved(migrated, root, trial), f"{argv(trial)[2:4]} stopped at {call} #{when}")
        shutil.rmtree(trial)

    with ThreadPoolExecutor(2) as pool:
        list(pool.map(one, points))


def _copy(root: Path, to: Path) -> Path:
    subprocess.run(["cp", "-a", str(root), str(to)], check=True)
    return to


def _moved(files: dict[str, bytes], root: Path, to: Path) -> dict[str, bytes]:
    return {p.replace(str(root), str(to), 1): b for p, b in files.items()}


def test_a_failed_fsync_anywhere_never_loses_an_original(node: tuple[Path, Path, dict[str, bytes]], tmp_path: Path) -> None:
    """fsync fails (EIO) once, at each fsync of the migration in turn (a file's, a directory's after a
    rename): the run says so in one line, and the node is as it was, or its record keeps every original
    and undo puts them back."""
    root, config, original = node
    trace = tmp_path / "trace.txt"
    for when in range(1, 200):
        trial = _copy(root, tmp_path / f"trial-{when}")
        failed = run(at_call(migrate_argv(trial, config), when, "error=EIO", calls="fsync", trace=str(trace)))
        if "INJECTED" not in trace.read_text():  # past the last fsync: the migration ran whole
            assert failed.returncode == 0 and when > 10, (when, failed)
            break
        one_line_error(failed)
        assert "Input/output error" in failed.stderr, failed.stderr
        if (trial / STATE / "record.json").exists():
            assert run(undo_argv(trial)).returncode == 0
        assert node_files(trial) == _moved(original, root, trial), (when, failed.stderr)
        assert not (trial / "var/lib/ponytail/migrate").exists(), when
        shutil.rmtree(trial)


def test_undo_refuses_a_saved_copy_that_is_not_what_was_saved(node: tuple[Path, Path, dict[str, bytes]]) -> None:
    """A copy that lost its bytes (a crash before it reached the disk) is named, and nothing changes."""
    root, config, _ = node
    assert run(migrate_argv(root, config)).returncode == 0
    (root / STATE / "files/%2Fusr%2Fbin%2Fnvidia-ctk").write_bytes(b"")
    migrated = node_files(root)
    err = one_line_error(run(undo_argv(root)))
    assert "the saved original of /usr/bin/nvidia-ctk" in err and "is not what was saved (0 bytes" in err, err
    assert "nothing was changed" in err and node_files(root) == migrated


def test_undo_restores_owner_and_mode_from_the_record_not_the_copy(node: tuple[Path, Path, dict[str, bytes]]) -> None:
    root, config, original = node
    assert run(migrate_argv(root, config)).returncode == 0
    copy = root / STATE / "files/%2Fetc%2Fcrio%2Fcrio.conf.d%2F99-nvidia.toml"
    os.chown(copy, 1000, 1000)
    os.chmod(copy, 0o4777)  # noqa: S103 - a hostile copy
    assert run(undo_argv(root)).returncode == 0
    restored = os.stat(root / "etc/crio/crio.conf.d/99-nvidia.toml")
    assert (restored.st_uid, restored.st_gid, restored.st_mode & 0o7777) == (0, 4, 0o640)
    assert node_files(root) == original


@pytest.mark.parametrize("spoil", ["dir-owner", "dir-mode", "dir-link", "record-owner", "record-mode", "files-mode"])
def test_undo_believes_only_a_store_that_is_roots_alone(node: tuple[Path, Path, dict[str, bytes]], tmp_path: Path, spoil: str) -> None:
    root, config, _ = node
    assert run(migrate_argv(root, config)).returncode == 0
    state = root / STATE
    if spoil == "dir-owner":
        os.chown(state, 1000, 1000)
    elif spoil == "dir-mode":
        os.chmod(state, 0o777)  # noqa: S103 - a hostile store
    elif spoil == "dir-link":
        elsewhere = tmp_path / "elsewhere"
        state.rename(elsewhere)
        state.symlink_to(elsewhere)
    elif spoil == "record-owner":
        os.chown(state / "record.json", 1000, 1000)
    elif spoil == "record-mode":
        os.chmod(state / "record.json", 0o644)
    else:
        os.chmod(state / "files", 0o777)  # noqa: S103 - a hostile store
    migrated = node_files(root)
    err = one_line_error(run(undo_argv(root)))
    assert "not undoing" in err and ("state directory" in err or "record" in err), err
    assert node_files(root) == migrated


@pytest.mark.parametrize("path", ["/etc/shadow", "/etc/cdi/../shadow", "/usr/bin/bash", "/etc/cdi/x.conf", "relative/etc/cdi/nvidia.yaml"])
def test_undo_touches_only_places_a_migration_touches(node: tuple[Path, Path, dict[str, bytes]], path: str) -> None:
    """A record (root's, 0600) naming another path is not a record ponytail wrote: refused before anything changes."""
    root, config, _ = node
    assert run(migrate_argv(root, config)).returncode == 0
    record_file = root / STATE / "record.json"
    record = json.loads(record_file.read_text())
    record["entries"][0]["path"] = path
    record_file.write_text(json.dumps(record))
    migrated = node_files(root)
    err = one_line_error(run(undo_argv(root)))
    assert "is not a migration record ponytail wrote" in err and "no migration of NVIDIA's toolkit touches" in err, err
    assert node_files(root) == migrated


def test_an_earlier_releases_record_names_its_copy_by_the_path_only(node: tuple[Path, Path, dict[str, bytes]]) -> None:
    """An earlier release's record keeps a saved copy's name: only <the path, quoted> in files/ is taken,
    never another name (an absolute one least of all); a copy owned by another user is refused."""
    root, config, _ = node
    assert run(migrate_argv(root, config)).returncode == 0
    record_file = root / STATE / "record.json"
    record = json.loads(record_file.read_text())
    from urllib.parse import quote

    old = {"from": "nvidia", "entries": [{"path": e["path"], "saved": quote(e["path"], safe="") if e["before"]["kind"] != "nothing" else None,
                                          "left": {k: v for k, v in e["left"].items() if k in ("kind", "sha256", "target")}}
                                         for e in record["entries"]]}
    hostile = json.loads(json.dumps(old))
    hostile["entries"][0]["saved"] = "/etc/shadow"
    record_file.write_text(json.dumps(hostile))
    migrated = node_files(root)
    err = one_line_error(run(undo_argv(root)))
    assert "not a migration record ponytail wrote" in err and "'/etc/shadow'" in err, err
    assert node_files(root) == migrated
    record_file.write_text(json.dumps(old))
    os.chown(root / STATE / "files/%2Fetc%2Fdocker%2Fdaemon.json", 1000, 1000)
    err = one_line_error(run(undo_argv(root)))
    assert "owned by uid 1000" in err, err
    os.chown(root / STATE / "files/%2Fetc%2Fdocker%2Fdaemon.json", 0, 0)
    assert run(undo_argv(root)).returncode == 0
    assert not (root / "var/lib/ponytail").exists()


def test_root_resolves_the_nodes_absolute_links_inside_it(tmp_path: Path) -> None:
    """The node's /var/run is a link to /run (absolute): its /var/run/cdi is the node's /run/cdi, never this
    process's (a private tmpfs /run here, holding NVIDIA's spec as a decoy that must stay untouched)."""
    host = FakeHost(tmp_path / "host", gpu_list=gpus(1))
    root = tmp_path / "root"
    install_fake_toolkit(root, spec_dir="run/cdi")
    (root / "var").mkdir()
    (root / "var/run").symlink_to("/run")
    original = node_files(root)
    migrate = " ".join(migrate_argv(root, host.write_config()))
    undo = " ".join(undo_argv(root))
    script = f"""
mount -t tmpfs tmpfs /run && mkdir /run/cdi && cat > /run/cdi/nvidia.yaml <<'SPEC'
{NVIDIA_SPEC}SPEC
{migrate} >/dev/null
sha256sum /run/cdi/nvidia.yaml {root}/run/cdi/nvidia.yaml
ls /run/cdi
grep -c nvidia-cdi-hook {root}/run/cdi/nvidia.yaml || true
"""
    result = in_private_mount_ns(script)
    assert result.returncode == 0, result.stderr
    import hashlib

    lines = result.stdout.splitlines()
    decoy = hashlib.sha256(NVIDIA_SPEC.encode()).hexdigest()
    assert lines[0].split()[0] == decoy and lines[1].split()[0] != decoy, lines  # the node's spec migrated, not this process's
    assert lines[2] == "nvidia.yaml" and lines[3] == "0", lines
    record = json.loads((root / STATE / "record.json").read_text())
    assert record["entries"][0]["path"] == "/run/cdi/nvidia.yaml", record["entries"][0]["path"]
    assert in_private_mount_ns(f"mount -t tmpfs tmpfs /run && {undo}").returncode == 0
    assert node_files(root) == original


def test_a_spec_that_is_an_absolute_link_is_read_inside_the_root(tmp_path: Path) -> None:
    """The node's /etc/cdi/linked.yaml -> /run/cdi/vendor.yaml is the node's vendor spec, not this process's
    file of that name (NVIDIA's spec here, in a private tmpfs /run): cdi owners, whose scan migrate uses, reads the node's."""
    root = tmp_path / "root"
    (root / "etc/cdi").mkdir(parents=True)
    (root / "run/cdi").mkdir(parents=True)
    (root / "run/cdi/vendor.yaml").write_text(VENDOR_SPEC)
    (root / "etc/cdi/linked.yaml").symlink_to("/run/cdi/vendor.yaml")
    owners = " ".join([*undo_argv(root)[:1], "cdi", "owners", "--root", str(root)])
    script = f"""mount -t tmpfs tmpfs /run && mkdir /run/cdi && cat > /run/cdi/vendor.yaml <<'SPEC'
{NVIDIA_SPEC}SPEC
{owners}"""
    result = in_private_mount_ns(script)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{root}/etc/cdi/linked.yaml\tvendor.com/x\tanother generator\t1 device(s)\n", result.stdout


VENDOR_SPEC = """\
cdiVersion: 0.5.0
kind: vendor.com/x
devices:
- name: "a"
  containerEdits:
    deviceNodes:
    - path: /dev/null
"""


def _tmpfs_script(root: Path, size: str, body: str, staging: Path) -> str:
    return f"mount -t tmpfs -o size={size},mode=755 tmpfs {root} && cp -a {staging}/. {root}/ && {body}"


def test_a_full_disk_is_found_before_the_first_change(tmp_path: Path) -> None:
    """A root on a small tmpfs, nearly full: migrate refuses in one line and changes nothing; with room
    to migrate, and then the disk filled to the last byte, undo still gives every file back (it links
    the saved originals back: no space needed)."""
    host = FakeHost(tmp_path / "host", gpu_list=gpus(1))
    staging = tmp_path / "staging"
    install_fake_toolkit(staging, program_size=256 << 10)
    root = tmp_path / "root"
    root.mkdir()
    migrate = " ".join(migrate_argv(root, host.write_config()))
    undo = " ".join(undo_argv(root))
    fill = f"(dd if=/dev/zero of={root}/filler bs=4k 2>/dev/null || true)"
    script = _tmpfs_script(root, "4m", f"""
{fill}; rm -f {root}/filler; dd if=/dev/zero of={root}/filler bs=4k count=$(( $(stat -f -c %a {root}) - 2 )) 2>/dev/null
{listing_command(root)} > {tmp_path}/before.txt
r=0; {migrate} > /dev/null 2> {tmp_path}/full.txt || r=$?; echo "full: $r"
{listing_command(root)} > {tmp_path}/after-full.txt
ls -A {root}/var/lib 2>/dev/null | tr '\\n' ' '; echo
rm {root}/filler
r=0; {migrate} > /dev/null 2> {tmp_path}/migrated.txt || r=$?; echo "migrated: $r"
{fill}
r=0; {undo} > /dev/null 2> {tmp_path}/undone.txt || r=$?; echo "undone: $r"
rm {root}/filler
{listing_command(root)} > {tmp_path}/after-undo.txt
""", staging)
    result = in_private_mount_ns(script)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    full = (tmp_path / "full.txt").read_text()
    assert lines[0] == "full: 1" and full.count("\n") == 1 and "not enough space on the file system of" in full, (lines, full)
    assert "nothing was changed" in full and "ponytail migrate --from nvidia again" in full, full
    def listed(name: str) -> list[str]:
        return (tmp_path / name).read_text().splitlines()

    before = listed("before.txt")
    assert listed("after-full.txt") == before
    assert lines[1].strip() == "", lines  # no state directory left, nor /var/lib/ponytail
    assert lines[2] == "migrated: 0", (tmp_path / "migrated.txt").read_text()
    assert lines[3] == "undone: 0", (tmp_path / "undone.txt").read_text()
    assert listed("after-undo.txt") == before


def test_a_state_directory_on_a_small_file_system_is_refused_before_the_first_change(tmp_path: Path) -> None:
    """The originals are copied when the state directory is on another file system: there must be room."""
    host = FakeHost(tmp_path / "host", gpu_list=gpus(1))
    root = tmp_path / "root"
    install_fake_toolkit(root, program_size=512 << 10)
    (root / "var/lib/ponytail").mkdir(parents=True)
    before = node_files(root)
    migrate = " ".join(migrate_argv(root, host.write_config()))
    result = in_private_mount_ns(f"mount -t tmpfs -o size=1m tmpfs {root}/var/lib/ponytail && r=0 && {{ {migrate} || r=$?; }}; echo \"exit $r\"")
    assert result.stdout.splitlines()[-1] == "exit 1", result
    assert result.stderr.count("\n") == 1 and f"not enough space on the file system of {root}/var/lib/ponytail" in result.stderr, result.stderr
    assert node_files(root) == before


def test_a_second_run_while_one_is_going_on_is_refused(node: tuple[Path, Path, dict[str, bytes]]) -> None:
    """A migration held up at its first saved original (strace delays the link) holds the lock: a second
    migrate, and an undo, are refused with one line, and the first completes."""
    import time

    root, config, original = node
    first = subprocess.Popen(at_call(migrate_argv(root, config), 1, "delay_enter=3000000", calls="linkat"),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not (root / STATE / "files").is_dir() and time.monotonic() < deadline:
            time.sleep(0.05)
        for second in (migrate_argv(root, config), undo_argv(root)):
            err = one_line_error(run(second))
            assert "another ponytail migrate is running" in err, err
    finally:
        _, err = first.communicate(timeout=60)
    assert first.returncode == 0, err
    assert run(undo_argv(root)).returncode == 0 and node_files(root) == original


@pytest.mark.slow
def test_soak_migrate_and_undo_stopped_and_run_again(tmp_path: Path) -> None:
    """bench/soak_migrate.py (bench/soak.py runs it after its hook soak), shortened: 30 trials."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from soak_migrate import migrate_soak

    report = migrate_soak(tmp_path, trials=30, seed=2)
    assert report.clean, report.summary() + "\n" + "\n".join(report.stuck + report.broken)
    assert report.killed > 0 and report.trials == 30
