"""cgroup v2 device programs, edited by the hook: the pure parts on samples and garbage, then
real programs attached to a real cgroup on this machine's cgroup2 hierarchy
(/sys/fs/cgroup/unified), a stand-in container in it, and the hook run on it. A process in
that cgroup must open exactly the injected nodes afterwards, and nothing else more than before."""

from __future__ import annotations

import ctypes
import os
import signal
import struct
import subprocess
import uuid
from pathlib import Path

import pytest

from ponytail.apply import bpf
from ponytail.apply.cgroup import cgroup2_directory, unified_cgroup_path
from ponytail.errors import InjectionError
from ponytail.fs.libc import syscall
from ponytail.plan.devicefilter import (
    AND32_K,
    EXIT,
    JNE_K,
    LDX_W,
    MOV64_K,
    NEUTRAL_DEVICE,
    allow_block,
    denied_on_purpose,
    extend,
    insn,
    verdict,
    why_not_extensible,
)

from support.bpfprograms import allow_all, calls_a_helper, deny_all, runc_style
from support.commands import PONYTAIL
from support.fakehost import FakeHost, make_rootfs
from support.harness import Sleeper, bundle_for, run_ponytail, state_for

UNIFIED = Path("/sys/fs/cgroup/unified")
GPU0 = ((195, 2), (195, 255), (511, 0), (511, 1))  # what NVIDIA_VISIBLE_DEVICES=0 injects on conftest's host
DENIED = "/denied-nvidia200"  # c 195:200: a GPU node nobody injected
NULL = "/null"  # c 1:3
CHECK = ["/dev/nvidia2", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia0", DENIED, NULL]


# --- the pure parts ---------------------------------------------------------------------------

def test_unified_cgroup_path_on_real_samples() -> None:
    assert unified_cgroup_path("0::/system.slice/docker-4f1c0e.scope\n") == "/system.slice/docker-4f1c0e.scope"
    assert unified_cgroup_path("5:devices:/x\n0::/\n") == "/"
    assert unified_cgroup_path("12:pids:/a\n11:devices:/a\n") is None
    assert unified_cgroup_path("") is None
    assert unified_cgroup_path("0::/user.slice/odd name: with colons/é\n") == "/user.slice/odd name: with colons/é"


@pytest.mark.parametrize("text", ["0::/../../etc\n", "0::/a/../b\n", "0::a/b\n", "0::/a//b\n", "0::/a/./b\n", "0::/a\n0::/b\n", "0::/a/\n"])
def test_unified_cgroup_path_refuses_escapes_and_ambiguity(text: str) -> None:
    with pytest.raises(InjectionError):
        unified_cgroup_path(text)


def test_cgroup2_directory_on_hybrid_pure_and_partial_mounts() -> None:
    hybrid = "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
    pure = "29 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"
    partial = "50 40 0:26 /kubepods /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
    assert cgroup2_directory(hybrid, "/c1") == "/sys/fs/cgroup/unified/c1"
    assert cgroup2_directory(pure, "/system.slice/a b.scope") == "/sys/fs/cgroup/system.slice/a b.scope"
    assert cgroup2_directory(partial, "/kubepods/pod1/c") == "/sys/fs/cgroup/pod1/c"
    assert cgroup2_directory(partial, "/system.slice/c") is None
    assert cgroup2_directory("36 31 0:33 / /sys/fs/cgroup/devices rw - cgroup cgroup rw,devices\n", "/c1") is None
    assert cgroup2_directory("garbage\n- - -\n", "/c1") is None


def test_the_allow_block_goes_in_front_once() -> None:
    old = deny_all()
    new = extend(old, GPU0)
    assert new is not None and new.endswith(old) and new.startswith(allow_block(GPU0))
    assert extend(new, GPU0) is None  # a second run adds nothing
    assert extend(new, GPU0[:1]) is not None  # other nodes: another block


def deny_list(major: int) -> bytes:
    """A deny list, as another tool might attach one: deny c MAJOR:*, allow everything else."""
    return (
        insn(LDX_W, 2, 1, 0) + insn(AND32_K, 2, imm=0xFFFF) + insn(JNE_K, 2, off=4, imm=2)
        + insn(LDX_W, 4, 1, 4) + insn(JNE_K, 4, off=2, imm=major) + insn(MOV64_K, 0, imm=0) + insn(EXIT) + allow_all()
    )


def test_what_a_program_answers_is_read_from_its_instructions() -> None:
    runc = runc_style((1, 3), (1, 5))
    assert [verdict(runc, 1, 3), verdict(runc, 1, 5), verdict(runc, 195, 2), verdict(runc, *NEUTRAL_DEVICE)] == [True, True, False, False]
    assert verdict(runc, 1, 3, access=1) is True and verdict(runc, 1, 3, dev_type=1) is False  # mknod within rwm; a block device
    extended = extend(runc, GPU0)
    assert extended is not None and all(verdict(extended, *d) for d in GPU0)
    assert verdict(extended, 195, 200) is False and verdict(extended, 195, 2, access=1) is False  # no mknod from the block
    assert (verdict(deny_all(), 1, 3), verdict(allow_all(), 1, 3)) == (False, True)
    assert verdict(deny_list(195), 195, 2) is False and verdict(deny_list(195), 1, 3) is True
    assert verdict(calls_a_helper(), 1, 3) is None  # not modelled: left to the old rules
    assert verdict(insn(0x05, off=-1), 1, 3) is None  # a loop: stops at MAX_STEPS
    assert verdict(b"", 1, 3) is None


def test_a_deny_list_denies_on_purpose_an_allow_list_does_not() -> None:
    assert denied_on_purpose(deny_list(195), GPU0) == (195, 2)
    assert denied_on_purpose(deny_list(511), GPU0) == (511, 0)
    assert denied_on_purpose(deny_list(7), GPU0) is None
    for program in (runc_style((1, 3)), deny_all(), allow_all(), calls_a_helper()):
        assert denied_on_purpose(program, GPU0) is None


def test_programs_that_cannot_be_extended_are_named() -> None:
    assert why_not_extensible(deny_all()) is None
    assert why_not_extensible(runc_style((1, 3))) is None
    assert "read" in (why_not_extensible(b"") or "")
    assert "read" in (why_not_extensible(b"\x00" * 7) or "")
    assert "calls" in (why_not_extensible(calls_a_helper()) or "")
    assert "map" in (why_not_extensible(insn(0x18, 1, 1, 0, 5) + insn(0) + deny_all()) or "")
    blinded = insn(0xB4, 11, 0, 0, 0x1234) + deny_all()  # w11 = ...: the blinding scratch register
    assert "blinded" in (why_not_extensible(blinded) or "")


# --- real programs on a real cgroup --------------------------------------------------------------

class Cgroup:
    """A fresh cgroup on the cgroup2 hierarchy; its programs are detached when it is removed."""

    def __init__(self, name: str | None = None) -> None:
        self.path = UNIFIED / (name or f"ponytail-test-{uuid.uuid4().hex[:12]}")
        self.path.mkdir()
        self.fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
        self.kept: list[int] = []

    def attach(self, program: bytes, flags: int = bpf.BPF_F_ALLOW_MULTI) -> None:
        fd = bpf.load_device_program(program, "ponytail_test")
        bpf.attach_device_program(self.fd, fd, flags)
        self.kept.append(fd)

    def link(self, program: bytes) -> None:
        """Attach through a bpf link (BPF_LINK_CREATE), as some managers do: only the link's owner may swap it."""
        fd = bpf.load_device_program(program, "ponytail_test")
        attr = ctypes.create_string_buffer(128)
        struct.pack_into("=IIII", attr, 0, fd, self.fd, bpf.BPF_CGROUP_DEVICE, 0)
        link = syscall("bpf", 28, attr, 128, what="BPF_LINK_CREATE")
        self.kept += [fd, link]

    def programs(self) -> tuple[int, tuple[int, ...]]:
        return bpf.query_device_programs(self.fd)

    def join(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def remove(self) -> None:
        for fd in self.kept + [self.fd]:
            os.close(fd)
        for pid in (self.path / "cgroup.procs").read_text().split():
            os.kill(int(pid), signal.SIGKILL)
        for _ in range(500):
            try:
                self.path.rmdir()
                return
            except OSError:
                subprocess.run(["sleep", "0.01"])
        self.path.rmdir()


@pytest.fixture
def cgroup():
    group = Cgroup()
    yield group
    group.remove()


@pytest.fixture
def container(cgroup: Cgroup, tmp_path: Path):
    """A stand-in container in ``cgroup`` with its bundle and a rootfs holding a c 195:200 and a c 1:3 node."""
    sleeper = Sleeper()
    cgroup.join(sleeper.pid)
    rootfs = make_rootfs(tmp_path / "bundle" / "rootfs")
    os.mknod(rootfs / DENIED.lstrip("/"), 0o666 | 0o020000, os.makedev(195, 200))
    os.mknod(rootfs / NULL.lstrip("/"), 0o666 | 0o020000, os.makedev(1, 3))
    bundle = bundle_for(tmp_path, rootfs, env=["NVIDIA_VISIBLE_DEVICES=0"])
    yield sleeper, bundle, rootfs
    sleeper.stop()


def hook(host: FakeHost, bundle: Path, pid: int, prefix: list[str] | None = None) -> subprocess.CompletedProcess:
    return run_ponytail(["-config", str(host.write_config())], stdin=state_for(bundle, pid), command=prefix)


def opens(cgroup: Cgroup, sleeper: Sleeper, rootfs: Path) -> dict[str, str]:
    """What a process in the container's cgroup and mount namespace gets opening each node."""
    script = f"echo $$ > '{cgroup.path}/cgroup.procs' && exec nsenter -t {sleeper.pid} -m chroot {rootfs} /usr/local/bin/cudacheck {' '.join(CHECK)}"
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=60).stdout
    found = {line.split()[1]: line.split()[2] for line in out.splitlines() if line.startswith("open ")}
    assert len(found) == len(CHECK), out
    return found


INJECTED = {"/dev/nvidia2": "ENXIO", "/dev/nvidiactl": "ENXIO", "/dev/nvidia-uvm": "ENXIO", "/dev/nvidia0": "ENOENT"}


@pytest.mark.parametrize("flags", [bpf.BPF_F_ALLOW_MULTI, 0, bpf.BPF_F_ALLOW_OVERRIDE], ids=["multi", "exclusive", "override"])
def test_a_deny_all_program_opens_exactly_the_injected_nodes(flags: int, host: FakeHost, cgroup: Cgroup, container) -> None:
    sleeper, bundle, rootfs = container
    cgroup.attach(deny_all(), flags)
    _, before = cgroup.programs()
    result = hook(host, bundle, sleeper.pid)
    assert result.returncode == 0, result.stderr
    assert opens(cgroup, sleeper, rootfs) == {**INJECTED, DENIED: "EPERM", NULL: "EPERM"}
    after_flags, after = cgroup.programs()
    assert after_flags == flags and len(after) == 1 and after != before
    # mknod of an injected node is not "rw": it stays what the old program says
    mknod = f"echo $$ > '{cgroup.path}/cgroup.procs' && exec nsenter -t {sleeper.pid} -m chroot {rootfs} /bin/busybox mknod /tmp/nv c 195 2"
    made = subprocess.run(["sh", "-c", mknod], capture_output=True, text=True, timeout=60)
    assert made.returncode != 0 and "Operation not permitted" in made.stderr, made.stderr
    mode = "atomically" if flags == bpf.BPF_F_ALLOW_MULTI else "in place"
    assert f"replaced device program(s) {before[0]} of cgroup {cgroup.path} {mode}" in host.log.read_text()


def test_a_runc_style_allow_list_keeps_its_rules_and_gains_the_injected_nodes(host: FakeHost, cgroup: Cgroup, container) -> None:
    sleeper, bundle, rootfs = container
    cgroup.attach(runc_style((1, 3), (1, 5)))
    result = hook(host, bundle, sleeper.pid)
    assert result.returncode == 0, result.stderr
    assert opens(cgroup, sleeper, rootfs) == {**INJECTED, DENIED: "EPERM", NULL: "OK"}


def test_a_long_program_is_read_whole(host: FakeHost, cgroup: Cgroup, container) -> None:
    """5,000+ instructions: more than the first read of a program's instructions takes."""
    sleeper, bundle, rootfs = container
    cgroup.attach(runc_style(*((7, minor) for minor in range(700)), (1, 3)))
    result = hook(host, bundle, sleeper.pid)
    assert result.returncode == 0, result.stderr
    assert opens(cgroup, sleeper, rootfs) == {**INJECTED, DENIED: "EPERM", NULL: "OK"}


def test_several_allow_lists_are_each_extended_and_a_program_that_allows_the_nodes_is_left_alone(
    host: FakeHost, cgroup: Cgroup, container
) -> None:
    """Device programs are ANDed: every allow list (what runc, crun and systemd attach) must allow
    the nodes; a program that allows them already is not touched."""
    sleeper, bundle, rootfs = container
    cgroup.attach(runc_style((1, 3)))
    cgroup.attach(allow_all())
    cgroup.attach(runc_style((1, 3), (1, 5)))
    _, before = cgroup.programs()
    result = hook(host, bundle, sleeper.pid)
    assert result.returncode == 0, result.stderr
    assert opens(cgroup, sleeper, rootfs) == {**INJECTED, DENIED: "EPERM", NULL: "OK"}
    flags, after = cgroup.programs()
    assert flags == bpf.BPF_F_ALLOW_MULTI and len(after) == 3 and set(after) & set(before) == {before[1]}


def test_programs_of_a_parent_cgroup_are_left_alone_and_named(host: FakeHost, tmp_path: Path) -> None:
    parent = Cgroup()
    child = Cgroup(f"{parent.path.name}/container")
    sleeper = Sleeper()
    try:
        child.join(sleeper.pid)
        parent.attach(runc_style((1, 3)))
        child.attach(deny_all())
        inherited = parent.programs()
        rootfs = make_rootfs(tmp_path / "bundle" / "rootfs")
        result = hook(host, bundle_for(tmp_path, rootfs, env=["NVIDIA_VISIBLE_DEVICES=0"]), sleeper.pid)
        assert result.returncode == 0, result.stderr
        assert parent.programs() == inherited
        log = host.log.read_text()
        assert f"of cgroup {child.path} atomically" in log
        assert f"warning container=test-ctr device program(s) {inherited[1][0]} of a parent cgroup of {child.path} also apply" in log
    finally:
        sleeper.stop()
        child.remove()
        parent.remove()


def test_a_second_run_changes_nothing(host: FakeHost, cgroup: Cgroup, container) -> None:
    sleeper, bundle, rootfs = container
    cgroup.attach(deny_all())
    assert hook(host, bundle, sleeper.pid).returncode == 0
    _, first = cgroup.programs()
    result = hook(host, bundle, sleeper.pid)
    assert result.returncode == 0, result.stderr
    assert cgroup.programs()[1] == first
    assert opens(cgroup, sleeper, rootfs) == {**INJECTED, DENIED: "EPERM", NULL: "EPERM"}


def test_no_program_attached_means_none_added(host: FakeHost, cgroup: Cgroup, container) -> None:
    sleeper, bundle, rootfs = container
    result = hook(host, bundle, sleeper.pid)
    assert result.returncode == 0, result.stderr
    assert cgroup.programs() == (0, ())
    assert f"no device program attached to cgroup {cgroup.path}: nothing to edit" in host.log.read_text()
    assert opens(cgroup, sleeper, rootfs) == {**INJECTED, DENIED: "ENXIO", NULL: "OK"}


def test_debug_shows_the_cgroup_its_programs_and_the_block(host: FakeHost, cgroup: Cgroup, container) -> None:
    sleeper, bundle, _ = container
    cgroup.attach(deny_all())
    before = cgroup.programs()
    result = run_ponytail(["-config", str(host.write_config()), "-debug"], stdin=state_for(bundle, sleeper.pid))
    assert result.returncode == 0, result.stderr
    out = result.stdout.decode()
    assert f"device cgroup v2: {cgroup.path}, device program(s) {before[1][0]} (multi) to be extended" in out
    assert "allow c 195:2 rw, c 195:255 rw, c 511:0 rw, c 511:1 rw" in out
    assert "a block of 18 eBPF instructions that allow these rules" in out
    assert cgroup.programs() == before


@pytest.mark.parametrize("attached", ["calls a helper", "through a bpf link"])
def test_a_program_that_cannot_be_edited_stops_the_start_and_undoes_the_mounts(attached: str, host: FakeHost, cgroup: Cgroup, container) -> None:
    """A program whose translated form cannot be loaded again fails before any mount; one attached
    through a bpf link (only its owner may swap it) fails at the last step, after the mounts,
    which are taken back. Either way one line naming the program and the cgroup, exit 1."""
    sleeper, bundle, rootfs = container
    if attached == "calls a helper":
        cgroup.attach(calls_a_helper())
    else:
        cgroup.link(deny_all())
    before = cgroup.programs()
    result = hook(host, bundle, sleeper.pid)
    assert result.returncode == 1
    stderr = result.stderr.decode()
    assert stderr.count("\n") == 1 and "Traceback" not in stderr, stderr
    what = f"device program {before[1][0]} of cgroup {cgroup.path}"
    named = f"device program {before[1][0]} ('ponytail_test') of cgroup {cgroup.path}"
    expected = {
        "calls a helper": f"ponytail: error: cannot allow the GPU nodes in {named}: it calls a function",
        "through a bpf link": f"ponytail: error: cannot replace {what}: BPF_PROG_ATTACH: No such file or directory (attached through a bpf link",
    }[attached]
    assert expected in stderr, stderr
    assert cgroup.programs() == before
    mountinfo = sleeper.run(["cat", "/proc/self/mountinfo"]).stdout
    assert "nvidia" not in mountinfo and str(rootfs) not in mountinfo


def _hook_into_a_cgroup_named(name: str, host: FakeHost, tmp_path: Path) -> Cgroup:
    """GPU 0 injected into a container whose process is in a fresh cgroup ``name`` under a deny-all
    program; the cgroup (removed again), after the run succeeded."""
    cgroup = Cgroup(name)
    sleeper = Sleeper()
    try:
        cgroup.join(sleeper.pid)
        cgroup.attach(deny_all())
        rootfs = make_rootfs(tmp_path / "bundle" / "rootfs")
        result = hook(host, bundle_for(tmp_path, rootfs, env=["NVIDIA_VISIBLE_DEVICES=0"]), sleeper.pid)
        assert result.returncode == 0, result.stderr
        return cgroup
    finally:
        sleeper.stop()
        cgroup.remove()


def test_an_odd_cgroup_name_is_handled(host: FakeHost, tmp_path: Path) -> None:
    odd = _hook_into_a_cgroup_named(f"ponytail-test odd:name é {uuid.uuid4().hex[:8]}", host, tmp_path)
    assert f"of cgroup {odd.path} atomically" in host.log.read_text()


def test_a_systemd_scope_gets_a_warning_that_daemon_reload_drops_the_edit(host: FakeHost, tmp_path: Path) -> None:
    scope = _hook_into_a_cgroup_named(f"ponytail-test-{uuid.uuid4().hex[:8]}.scope", host, tmp_path)
    assert f"warning container=test-ctr cgroup {scope.path} is a systemd scope" in host.log.read_text()


def test_a_cgroup_outside_the_hooks_cgroup_namespace_is_refused(host: FakeHost, cgroup: Cgroup, container) -> None:
    """In a cgroup namespace rooted elsewhere the container's path reads /../<name>: never followed."""
    sleeper, bundle, _ = container
    cgroup.attach(deny_all())
    before = cgroup.programs()
    elsewhere = Cgroup()
    try:
        prefix = ["sh", "-c", f'echo $$ > "{elsewhere.path}/cgroup.procs" && exec unshare --cgroup "$@"', "sh", *PONYTAIL]
        result = hook(host, bundle, sleeper.pid, prefix)
    finally:
        elsewhere.remove()
    assert result.returncode == 1, result.stderr
    assert "unexpected cgroup v2 path '/../" in result.stderr.decode() and "refusing to edit it" in result.stderr.decode()
    assert cgroup.programs() == before


def test_a_container_process_that_is_gone_is_one_line(host: FakeHost, cgroup: Cgroup, tmp_path: Path) -> None:
    sleeper = Sleeper()
    cgroup.join(sleeper.pid)
    cgroup.attach(deny_all())
    before = cgroup.programs()
    os.kill(sleeper.pid, signal.SIGKILL)  # gone, not yet reaped: its /proc entry is still there
    rootfs = make_rootfs(tmp_path / "bundle" / "rootfs")
    bundle = bundle_for(tmp_path, rootfs, env=["NVIDIA_VISIBLE_DEVICES=0"])
    try:
        zombie = hook(host, bundle, sleeper.pid)
    finally:
        sleeper.proc.wait()
    reaped = hook(host, bundle, sleeper.pid)
    for result in (zombie, reaped):
        stderr = result.stderr.decode()
        assert result.returncode in (1, 2) and stderr.count("\n") == 1 and "Traceback" not in stderr, stderr
        assert f"process {sleeper.pid}" in stderr, stderr
    assert cgroup.programs() == before



@pytest.mark.parametrize("runs, at_once", [(20, 2), (40, 8)])
def test_concurrent_runs_into_one_cgroup_take_turns(runs: int, at_once: int, host: FakeHost, cgroup: Cgroup, container) -> None:
    """The engine may run the hook twice, and containers may share a rootfs: every run succeeds,
    the first extends the program, the others find it extended (no 'detached meanwhile')."""
    from concurrent.futures import ThreadPoolExecutor

    sleeper, bundle, rootfs = container
    cgroup.attach(deny_all())
    config = str(host.write_config())
    state = state_for(bundle, sleeper.pid)
    with ThreadPoolExecutor(at_once) as pool:
        results = list(pool.map(lambda _: run_ponytail(["-config", config], stdin=state), range(runs)))
    failed = [r.stderr for r in results if r.returncode != 0]
    assert not failed, f"{len(failed)} of {runs} failed: {failed[0]}"
    _, programs = cgroup.programs()
    assert len(programs) == 1
    fd = bpf.program_fd(programs[0])
    info = bpf.program_info(fd)
    os.close(fd)
    assert info.instructions == allow_block(GPU0) + deny_all()
    assert opens(cgroup, sleeper, rootfs) == {**INJECTED, DENIED: "EPERM", NULL: "EPERM"}


def test_a_program_that_denies_an_injected_node_on_purpose_wins(host: FakeHost, cgroup: Cgroup, container) -> None:
    """Another tool's deny list (c 195:* denied, the rest allowed) beside the engine's allow list:
    the start fails with one line naming the node and the program, and nothing is changed."""
    sleeper, bundle, rootfs = container
    cgroup.attach(runc_style((1, 3)))
    cgroup.attach(deny_list(195))
    before = cgroup.programs()
    result = hook(host, bundle, sleeper.pid)
    assert result.returncode == 1
    stderr = result.stderr.decode()
    assert stderr.count("\n") == 1 and "Traceback" not in stderr, stderr
    assert (
        f"ponytail: error: device program {before[1][1]} ('ponytail_test') of cgroup {cgroup.path} denies /dev/nvidia2 (c 195:2) "
        "on purpose" in stderr
    ), stderr
    assert "[cgroup] extend_denying_programs = true" in stderr
    assert cgroup.programs() == before
    mountinfo = sleeper.run(["cat", "/proc/self/mountinfo"]).stdout
    assert "nvidia" not in mountinfo and str(rootfs) not in mountinfo


def test_the_config_can_let_ponytail_extend_a_denying_program(host: FakeHost, cgroup: Cgroup, container) -> None:
    sleeper, bundle, rootfs = container
    cgroup.attach(runc_style((1, 3)))
    cgroup.attach(deny_list(195))
    _, before = cgroup.programs()
    config = host.base / "extend.toml"
    config.write_text(host.config_text() + "[cgroup]\nextend_denying_programs = true\n")
    result = run_ponytail(["-config", str(config)], stdin=state_for(bundle, sleeper.pid))
    assert result.returncode == 0, result.stderr
    assert opens(cgroup, sleeper, rootfs) == {**INJECTED, DENIED: "EPERM", NULL: "OK"}
    _, after = cgroup.programs()
    assert len(after) == 2 and not set(after) & set(before)
