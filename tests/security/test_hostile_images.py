"""Hostile images: symlinks aimed at the host, loops, kernel filesystems, planted programs, a
poisoned environment. For each, the hook runs against a stand-in container (tests/hostile.py)
and the host is checked from outside: the victim directory unchanged, no mount on it in any
namespace, no planted program run. Where injection can still be done safely it must be: a
program in the container still loads libcuda.so.1 and opens its GPU.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from support.commands import PONYTAIL
from support.engines import hook_entry
from support.fakehost import FakeHost, compile_library, compile_program, gpus, make_rootfs
from support.harness import run_ponytail
from support.hostile import CUDA_OK, PlantedNode, Stage, evil_library

WORKS, REFUSED, SAFE = "works", "refused", "safe"  # SAFE: either outcome, the host untouched


@dataclass(frozen=True)
class Case:
    name: str
    build: Callable[[Stage], None]
    expect: str
    message: str = ""


LIB = "/usr/lib/x86_64-linux-gnu"
CASES = [
    # a symlinked directory on the way to a mount target or a written file
    Case("lib-dir-absolute", lambda s: s.redirect(LIB, "lib"), WORKS),
    Case("lib-dir-relative", lambda s: s.redirect(LIB, "lib", relative=True), WORKS),
    Case("usr-absolute", lambda s: s.redirect("/usr", "usr"), WORKS),
    Case("dev-absolute", lambda s: s.redirect("/dev", "dev"), WORKS),
    Case("dev-relative", lambda s: s.redirect("/dev", "dev", relative=True), WORKS),
    Case("etc-absolute", lambda s: s.redirect("/etc", "etc"), WORKS),
    Case("ld.so.conf.d-absolute", lambda s: s.redirect("/etc/ld.so.conf.d", "etc/ld.so.conf.d"), WORKS),
    Case("ld.so.conf.d-relative", lambda s: s.redirect("/etc/ld.so.conf.d", "etc/ld.so.conf.d", relative=True), WORKS),
    Case("var-absolute", lambda s: s.redirect("/var", "var"), WORKS),
    # a symlink as the last component
    Case("library-absolute", lambda s: s.symlink(f"{LIB}/libcuda.so.550.54.15", f"{s.victim}/file"), WORKS),
    Case("library-relative", lambda s: s.symlink(f"{LIB}/libcuda.so.550.54.15", s.escaping(LIB + "/x", f"{s.victim}/file")), WORKS),
    Case("soname-link", lambda s: s.symlink(f"{LIB}/libcuda.so.1", f"{s.victim}/file"), WORKS),
    Case("nvidia-smi", lambda s: s.symlink("/usr/bin/nvidia-smi", f"{s.victim}/file"), WORKS),
    Case("dev-node-absolute", lambda s: s.symlink("/dev/nvidia0", f"{s.victim}/file"), WORKS),
    Case("dev-node-relative", lambda s: s.symlink("/dev/nvidiactl", s.escaping("/dev/x", f"{s.victim}/file")), WORKS),
    Case("ponytail-conf", lambda s: s.symlink("/etc/ld.so.conf.d/00-ponytail.conf", f"{s.victim}/file"), WORKS),
    Case("ld.so.conf", lambda s: s.symlink("/etc/ld.so.conf", f"{s.victim}/etc/ld.so.conf"), WORKS),
    Case("ld.so.cache", lambda s: s.symlink("/etc/ld.so.cache", f"{s.victim}/etc/ld.so.cache"), WORKS),
    Case("ld.so.cache-temp", lambda s: s.symlink("/etc/ld.so.cache~", f"{s.victim}/file"), REFUSED, "ld.so.cache~"),
    # magic links: the container's /proc/<pid>/root is the host's /; a path of ponytail's through
    # one is refused (openat2's RESOLVE_NO_MAGICLINKS), one of ldconfig's stays in the rootfs
    Case("etc-magic", lambda s: s.redirect("/etc", "etc") or s.symlink("/etc", s.magic(f"{s.victim}/etc")), REFUSED, "magic link under /proc"),
    Case("var-cache-magic", lambda s: s.symlink("/var/cache", s.magic(f"{s.victim}")), WORKS),
    Case("ld.so.conf.d-magic", lambda s: s.symlink("/etc/ld.so.conf.d", s.magic(f"{s.victim}/etc/ld.so.conf.d")), REFUSED, "magic link under /proc"),
    Case("ponytail-conf-magic", lambda s: s.symlink("/etc/ld.so.conf.d/00-ponytail.conf", s.magic(f"{s.victim}/file")), REFUSED, "magic link under /proc"),
    Case("lib-dir-magic", lambda s: s.redirect(LIB, "lib") or s.symlink(LIB, s.magic(f"{s.victim}/lib")), SAFE),
    Case("dev-magic", lambda s: s.symlink("/dev", s.magic(f"{s.victim}/dev")), SAFE),
    Case("ld.so.conf-lists-magic", lambda s: _conf(s, "evil.conf", s.magic(f"{s.victim}/lib")), WORKS),
    # kernel filesystems: a write or a mount there acts on the host's kernel
    Case("ponytail-conf-procfs", lambda s: s.symlink("/etc/ld.so.conf.d/00-ponytail.conf", "/proc/sys/kernel/domainname"), REFUSED, "kernel's proc filesystem"),
    Case("ld.so.conf.d-procfs", lambda s: s.symlink("/etc/ld.so.conf.d", "/proc/sys/kernel"), REFUSED, "kernel's proc filesystem"),
    Case("lib-dir-procfs", lambda s: s.symlink(LIB, "/proc/self"), REFUSED, "kernel's proc filesystem"),
    Case("dev-node-sysfs", lambda s: s.symlink("/dev/nvidia0", "/sys/kernel/profiling"), REFUSED, "kernel's sysfs filesystem"),
    # loops are an error, not a hang
    Case("loop-self", lambda s: s.symlink(LIB, "x86_64-linux-gnu"), REFUSED, "too many levels of symbolic links"),
    Case("loop-pair", lambda s: s.symlink("/dev", "/devb") or s.symlink("/devb", "/dev"), REFUSED, "too many levels of symbolic links"),
    Case("loop-dotdot", lambda s: s.symlink(LIB, "../lib/x86_64-linux-gnu"), REFUSED, "too many levels of symbolic links"),
    Case("loop-conf-dir", lambda s: s.symlink("/etc/ld.so.conf.d", "/etc/ld.so.conf.d/"), REFUSED, "too many levels of symbolic links"),
    Case("chain-of-41", lambda s: _chain(s, 41), REFUSED, "too many levels of symbolic links"),
    Case("newline-in-a-name", lambda s: _newline(s), REFUSED, "is not a directory"),
    # not a regular file where ponytail writes one: refused, never opened (a FIFO would hang)
    Case("conf-is-a-fifo", lambda s: _fifo(s, "/etc/ld.so.conf.d/00-ponytail.conf"), REFUSED, "not a regular file"),
    Case("mount-target-is-a-directory", lambda s: s.in_root("/dev/nvidia0").mkdir(), REFUSED, "is a directory"),
]


def _conf(stage: Stage, name: str, line: str) -> None:
    conf = stage.in_root(f"/etc/ld.so.conf.d/{name}")
    conf.parent.mkdir(parents=True, exist_ok=True)
    conf.write_text(line + "\n")


def _chain(stage: Stage, length: int) -> None:
    stage.redirect("/usr/bin", "bin")
    for i in range(length):
        stage.symlink(f"/chain/{i}", f"/chain/{i + 1}")
    stage.symlink(f"/chain/{length}", f"{stage.victim}/bin")
    stage.symlink("/usr/bin", "/chain/0")


def _newline(stage: Stage) -> None:
    """A name that would forge a second line in the error and the log."""
    forged = "/bad\nponytail: error: forged line"
    stage.in_root(forged).write_text("")
    stage.symlink("/usr/bin", forged)


def _fifo(stage: Stage, path: str) -> None:
    target = stage.in_root(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(target)


HOST_SHAPE = {"gpu_list": gpus(1)}  # shared_host's


@pytest.fixture
def stage(tmp_path: Path, shared_host: FakeHost, request: pytest.FixtureRequest) -> Iterator[Stage]:
    s = Stage(tmp_path, shared_host, container_id=f"hostile-{request.node.name}"[:60])
    yield s
    s.close()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_image_never_reaches_the_host(stage: Stage, case: Case) -> None:
    case.build(stage)
    result = stage.inject()
    err = result.stderr.decode()
    stage.assert_host_untouched()
    assert "Traceback" not in err and "internal error" not in err, err
    assert len(err.splitlines()) == (0 if result.returncode == 0 else 1), err
    if case.expect == WORKS:
        assert result.returncode == 0, err
        assert_gpu_usable(stage)
    elif case.expect == REFUSED:
        assert result.returncode == 1, err
        assert case.message in err, err
        assert f"error container={stage.id} " in stage.host.log.read_text(), "the failure is not in the log"
        assert stage.container_mounts() == stage.mounts_before, "a refused run left mounts behind"
    else:
        assert result.returncode in (0, 1), err


def assert_gpu_usable(stage: Stage) -> None:
    out = stage.run_in_image("/usr/local/bin/cudacheck", "/dev/nvidia0", "/dev/nvidiactl")
    assert CUDA_OK in out and "open /dev/nvidia0 ENXIO" in out and "open /dev/nvidiactl ENXIO" in out, out
    assert "Driver Version: 550.54.15" in stage.run_in_image("/usr/bin/nvidia-smi")


def test_write_to_a_sysctl_is_refused(stage: Stage) -> None:
    """/proc/sys/kernel/hostname belongs to the writer's UTS namespace: ponytail runs in a new one
    here, so a write that got through shows up as a changed hostname, and nowhere else."""
    stage.symlink("/etc/ld.so.conf.d/00-ponytail.conf", "/proc/sys/kernel/hostname")
    state = stage.tmp / "state.json"
    state.write_text(stage.state())
    script = f"""
        hostname ponytail-sentinel
        "$@" -config {stage.host.write_config()} < {state} && echo rc=0 || echo rc=$?
        echo "hostname=$(hostname)"
    """
    result = subprocess.run(["unshare", "-u", "bash", "-c", script, "--", *PONYTAIL], capture_output=True, timeout=120)
    out, err = result.stdout.decode(), result.stderr.decode()
    assert "hostname=ponytail-sentinel" in out, out + err
    assert "rc=1" in out and "kernel's proc filesystem" in err, out + err
    stage.assert_host_untouched()


PLANTED = ("/sbin/ldconfig", "/usr/sbin/ldconfig", "/sbin/ldconfig.real", "/usr/bin/ldconfig", "/bin/sh", "/bin/bash", "/usr/bin/env")


def test_programs_and_preloads_planted_in_the_image_never_run(stage: Stage) -> None:
    for path in PLANTED:
        stage.plant_program(path)
    evil_library(stage.in_root("/evil"))
    stage.in_root("/etc/ld.so.preload").write_text("/evil/libevil.so\n")
    result = stage.inject(env=["PATH=/sbin:/usr/sbin:/bin", "LD_PRELOAD=/evil/libevil.so", "SHELL=/bin/sh"])
    assert result.returncode == 0, result.stderr
    stage.assert_host_untouched()  # no marker: neither on the host nor in the image
    assert_gpu_usable(stage)  # (this one runs the image's own code, in the image, as it should)


@pytest.fixture
def spy(tmp_path: Path, shared_host: FakeHost) -> Path:
    """A config whose ldconfig is a dynamically linked spy that records its environment."""
    real = next(p for p in ("/sbin/ldconfig", "/usr/sbin/ldconfig") if os.path.exists(p))
    program = tmp_path / "spy" / "ldconfig-spy"
    program.parent.mkdir()
    program.write_bytes(compile_program("env_spy.c", (f'REAL_LDCONFIG="{real}"',)).read_bytes())
    program.chmod(0o755)
    config = tmp_path / "spy.toml"
    config.write_text(shared_host.config_text().replace("[log]", f'ldconfig = "{program}"\n[log]'))
    return config


def poisoned_environment(tmp_path: Path) -> dict[str, str]:
    """Variables that would run the attacker's code in a process that honoured them."""
    evil = evil_library(tmp_path / "evil")
    pydir = tmp_path / "pyevil"
    pydir.mkdir()
    (pydir / "sitecustomize.py").write_text(f"open('{tmp_path}/sitecustomize.ran', 'a').write('ran')\n")
    binaries = tmp_path / "evilbin"
    binaries.mkdir()
    for name in ("ldconfig", "sh", "env"):
        (binaries / name).write_text(f"#!/bin/sh\necho {name} >> {tmp_path}/path-lookup.ran\n")
        (binaries / name).chmod(0o755)
    (tmp_path / "startup.sh").write_text(f"echo ran >> {tmp_path}/startup.ran\n")
    return {
        "LD_PRELOAD": str(evil),
        "LD_AUDIT": str(evil),
        "LD_LIBRARY_PATH": str(evil.parent),
        "PYTHONPATH": str(pydir),
        "PYTHONSTARTUP": str(tmp_path / "startup.sh"),
        "PYTHONINSPECT": "1",
        "BASH_ENV": str(tmp_path / "startup.sh"),
        "ENV": str(tmp_path / "startup.sh"),
        "PATH": str(binaries),
    }


def test_container_environment_reaches_neither_ponytail_nor_its_helper(stage: Stage, spy: Path, tmp_path: Path) -> None:
    env = [f"{k}={v}" for k, v in poisoned_environment(tmp_path).items()] + ["NVIDIA_VISIBLE_DEVICES=all"]
    result = stage.inject(env=env, config=spy)
    assert result.returncode == 0, result.stderr
    stage.assert_host_untouched()
    assert_helper_environment_is_fixed(spy.parent / "spy" / "ldconfig-spy.env", stage)
    assert_gpu_usable(stage)


def test_ponytails_own_environment_does_not_reach_its_helper(stage: Stage, spy: Path, tmp_path: Path) -> None:
    """The engine's environment for the hook (hooks.d "env") is not passed on either. LD_PRELOAD and
    LD_AUDIT are left out here: they would act on the Python running ponytail itself, before any of
    its code runs, which is the engine's doing."""
    env = poisoned_environment(tmp_path)
    del env["LD_PRELOAD"], env["LD_AUDIT"], env["PYTHONPATH"], env["PYTHONSTARTUP"], env["PYTHONINSPECT"]
    env["PATH"] += ":" + os.environ.get("PATH", "/usr/bin:/bin")
    result = run_ponytail(["-config", str(spy)], stdin=stage.state(), env=env, isolated=False)
    assert result.returncode == 0, result.stderr
    stage.assert_host_untouched()
    assert_helper_environment_is_fixed(spy.parent / "spy" / "ldconfig-spy.env", stage)


def assert_helper_environment_is_fixed(record: Path, stage: Stage) -> None:
    lines = record.read_text().splitlines()
    env = sorted(line[4:] for line in lines if line.startswith("env "))
    args = [line[4:] for line in lines if line.startswith("arg ")]
    assert env == ["LC_ALL=C", "PATH=/usr/sbin:/usr/bin:/sbin:/bin"]
    assert args[1:4] == ["-X", "-r", str(stage.rootfs)], args


def test_the_image_changes_only_where_the_plan_says(stage: Stage) -> None:
    """ponytail adds its mount points, SONAME links and linker files, and nothing else: the
    host's ldconfig does not make links among the image's own libraries (-X)."""
    image_lib = stage.in_root("/opt/image/lib")
    image_lib.mkdir(parents=True)
    built = compile_library("evil_preload.c", "libimage.so.1", "libimage.so.1.0", "0")
    (image_lib / "libimage.so.1.0").write_bytes(built.read_bytes())
    stage.in_root("/etc/ld.so.conf.d").mkdir(exist_ok=True)
    stage.in_root("/etc/ld.so.conf.d/image.conf").write_text("/opt/image/lib\n")
    before = snapshot(stage.rootfs)
    result = stage.inject()
    assert result.returncode == 0, result.stderr
    after = snapshot(stage.rootfs)
    changed = sorted(p for p in after.keys() | before.keys() if before.get(p) != after.get(p))
    planned = {f"/dev/{n}" for n in ("nvidia0", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")}
    planned |= {f"{LIB}/{n}" for n in ("libcuda.so.550.54.15", "libnvidia-ml.so.550.54.15", "libcuda.so.1", "libnvidia-ml.so.1")}
    planned |= {"/usr/bin/nvidia-smi", "/etc/ld.so.conf.d/00-ponytail.conf", "/etc/ld.so.cache"}
    planned |= {"/var", "/var/cache", "/var/cache/ldconfig", "/var/cache/ldconfig/aux-cache"}  # ldconfig's own
    assert set(changed) <= planned, sorted(set(changed) - planned)
    assert "/opt/image/lib/libimage.so.1" not in after


def snapshot(root: Path) -> dict[str, tuple]:
    """In-root path -> (type, mode, content or link target); a directory's size and times left out."""
    entries: dict[str, tuple] = {}
    for path in [root, *root.rglob("*")]:
        st = path.lstat()
        if path.is_symlink():
            what: object = os.readlink(path)
        elif path.is_file():
            what = path.read_bytes()
        else:
            what = None
        entries["/" + str(path.relative_to(root)).lstrip(".")] = (stat.S_IFMT(st.st_mode), st.st_mode, what)
    return entries


# -- device nodes, FIFOs and sockets where a start writes ---------------------------------------
# Every path the host's ldconfig or ponytail opens in the rootfs during a start: ldconfig's
# temporary files and caches (written as root, in the runtime's cgroup: the container's device
# rules do not hold for it), the linker config it reads, and ponytail's own files and links.
WRITTEN = (
    "/etc/ld.so.cache", "/etc/ld.so.cache~", "/var/cache/ldconfig/aux-cache", "/var/cache/ldconfig/aux-cache~",
    "/etc/ld.so.conf", "/etc/ld.so.conf.d/00-ponytail.conf", f"{LIB}/libcuda.so.1",
)
# and a file ldconfig reads under a name no list can know (the image's ld.so.conf includes
# ld.so.conf.d/*.conf): a device there is harmless (ldconfig sees the rootfs nodev); a FIFO would
# keep it waiting until its deadline (README: not covered)
INCLUDED = "/etc/ld.so.conf.d/image.conf"
NODES = [(path, kind) for path in (*WRITTEN, INCLUDED) for kind in PlantedNode.KINDS if path != INCLUDED or "fifo" not in kind]
MODES = ("runc-prestart", "cdi-hook", "manual")
HANG_S = 15  # [timeouts] ldconfig in these tests: a start that waits for a FIFO shows as one this long


@pytest.fixture(scope="module")
def patient_config(shared_host: FakeHost) -> Path:
    config = shared_host.base / "patient.toml"
    config.write_text(shared_host.config_text() + f"[timeouts]\nldconfig = {HANG_S}\n")
    return config


@pytest.fixture(scope="module")
def cdi_hook_args(shared_host: FakeHost, patient_config: Path, tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    from support.cdi_support import generate

    spec = generate(shared_host, tmp_path_factory.mktemp("spec") / "nvidia.json")
    [hook] = spec["containerEdits"]["hooks"]
    args = hook["args"][1:]  # cdi-hook ...
    return [args[0], "-config", str(patient_config), *args[1:]]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("path", "kind"), NODES, ids=[f"{p.rsplit('/', 1)[1].replace('~', '-temp')}-{k}" for p, k in NODES])
def test_a_node_where_a_start_writes_is_never_written_and_never_hangs(
    path: str, kind: str, mode: str, tmp_path: Path, patient_config: Path, cdi_hook_args: list[str]
) -> None:
    """Each start works with nothing written into the node, or fails with one line; never in
    ldconfig's time limit (a FIFO that was opened), never writing the device."""
    from support.engines import oci_bundle

    bundle = oci_bundle(tmp_path, ["/usr/local/bin/cudacheck", "/dev/nvidia0", "/dev/nvidiactl"], env=["NVIDIA_VISIBLE_DEVICES=all"],
                        hooks={"prestart": [hook_entry(patient_config)]})
    rootfs = bundle / "rootfs"
    node = PlantedNode(kind, rootfs / path.lstrip("/"), tmp_path)
    try:
        started = time.monotonic()
        rc, out, err = _start(mode, bundle, patient_config, cdi_hook_args)
        elapsed = time.monotonic() - started
        written = node.written()
    finally:
        node.close()
    assert written == b"", f"{written[:64]!r} was written into the {kind} at {path}"
    assert elapsed < HANG_S - 5, f"the start took {elapsed:.0f} s: something waited on the {kind} at {path}"
    assert "Traceback" not in err and "internal error" not in err, err
    ours = [line for line in err.splitlines() if line.startswith("ponytail: ") or "ponytail: error" in line]
    if rc == 0:
        assert ours == [], err
        cache = rootfs / "etc/ld.so.cache"
        assert cache.is_file() and not cache.is_symlink(), f"{path}: the linker cache is not a regular file"
        if mode != "cdi-hook":  # (there the engine mounts the libraries: not in this stand-in)
            assert b"libcuda.so.1" in cache.read_bytes(), f"{path}: libcuda.so.1 is not in the linker cache"
        if mode == "runc-prestart":
            assert CUDA_OK in out and "open /dev/nvidia0 ENXIO" in out, out + err
    else:
        assert len(ours) == 1 and "ponytail: error: " in ours[0], err
        if mode != "runc-prestart":
            assert rc == 1 and len(err.splitlines()) == 1, err


@pytest.mark.parametrize("under", ["proc", "sys"])
def test_a_fifo_hidden_under_the_images_proc_mount_point_fails_at_once(under: str, tmp_path: Path, patient_config: Path) -> None:
    """/var/cache/ldconfig -> /proc/pt, and a FIFO at proc/pt/aux-cache in the image's own
    directory: hidden while the container's /proc is mounted there, there for ldconfig, whose
    view has the kernel filesystems detached. The check looks where ldconfig will: one line at
    once, not a start that waits for the deadline."""
    from support.engines import oci_bundle, run_bundle

    bundle = oci_bundle(tmp_path, ["/usr/local/bin/cudacheck"], env=["NVIDIA_VISIBLE_DEVICES=all"],
                        hooks={"prestart": [hook_entry(patient_config)]})
    rootfs = bundle / "rootfs"
    (rootfs / under / "pt").mkdir(parents=True)
    os.mkfifo(rootfs / under / "pt/aux-cache")
    (rootfs / "var/cache").mkdir(parents=True, exist_ok=True)
    shutil.rmtree(rootfs / "var/cache/ldconfig", ignore_errors=True)
    os.symlink(f"/{under}/pt", rootfs / "var/cache/ldconfig")
    started = time.monotonic()
    result = run_bundle("runc", bundle)
    elapsed = time.monotonic() - started
    assert elapsed < HANG_S - 5, f"the start took {elapsed:.0f} s: ldconfig waited on the FIFO"
    ours = [line for line in result.stderr.splitlines() if "ponytail: error" in line]
    assert result.returncode != 0 and len(ours) == 1, result.stderr
    assert f"/var/cache/ldconfig/aux-cache (-> /{under}/pt/aux-cache) in the image is a FIFO" in ours[0], ours


def _start(mode: str, bundle: Path, config: Path, cdi_hook_args: list[str]) -> tuple[int, str, str]:
    """One container start in ``mode``: runc running the prestart hook, the CDI hook as an
    engine runs it at createContainer, or manual mode (-root); its status, stdout and stderr."""
    from support.engines import run_bundle

    rootfs = bundle / "rootfs"
    if mode == "runc-prestart":
        result = run_bundle("runc", bundle)
        return result.returncode, result.stdout, result.stderr
    if mode == "manual":
        done = run_ponytail(["-config", str(config), "-root", str(rootfs)])
        return done.returncode, done.stdout.decode(), done.stderr.decode()
    state = json.dumps({"ociVersion": "1.0.2", "id": "cdi-hostile", "status": "creating", "pid": 0, "bundle": str(bundle)})
    done = run_ponytail(cdi_hook_args, stdin=state)  # in a mount namespace of its own, as at createContainer
    return done.returncode, done.stdout.decode(), done.stderr.decode()


@pytest.mark.parametrize("image_cache", ["fifo", "char", "missing"])
def test_a_start_whose_linker_cache_is_not_a_regular_file_fails_with_one_line(
    image_cache: str, shared_host: FakeHost, tmp_path: Path
) -> None:
    """An ldconfig (here the host's /bin/true) that leaves the image's own /etc/ld.so.cache in
    place: a FIFO or a device there is read by the container's loader as an empty cache, so
    libcuda.so.1 would not load although the start succeeded."""
    config = tmp_path / "true.toml"
    config.write_text(shared_host.config_text().replace("[log]", 'ldconfig = "/bin/true"\n[log]'))
    rootfs = make_rootfs(tmp_path / "rootfs")
    cache = rootfs / "etc/ld.so.cache"
    if image_cache == "fifo":
        os.mkfifo(cache)
    elif image_cache == "char":
        os.mknod(cache, 0o644 | stat.S_IFCHR, os.makedev(1, 3))
    result = run_ponytail(["-config", str(config), "-root", str(rootfs)])
    err = result.stderr.decode()
    assert result.returncode == 1 and len(err.splitlines()) == 1, err
    what = {"fifo": "a FIFO", "char": "a character device", "missing": "missing"}[image_cache]
    assert f"/etc/ld.so.cache in the rootfs is {what}" in err, err
