"""``ponytail cdi-hook`` run directly, as an engine runs it at createContainer: in a mount
namespace of the container's own (here a private one), OCI state on stdin, the spec's arguments."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.cdi_support import generate
from support.commands import PONYTAIL
from support.fakehost import FakeHost, add_stale_libcuda, gpus, make_rootfs
from support.harness import run_ponytail

LIB = "/usr/lib/x86_64-linux-gnu"


HOST_SHAPE = {"gpu_list": gpus(3, minors=[2, 0, 1]), "mig": {1: [(1, 0), (2, 0)]}}  # shared_host's


@pytest.fixture(scope="module")
def hook_args(shared_host: FakeHost, tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    spec = generate(shared_host, tmp_path_factory.mktemp("spec") / "nvidia.json")
    [hook] = spec["containerEdits"]["hooks"]
    return hook["args"][1:]  # cdi-hook ...


def container(tmp_path: Path, devices: list[tuple[int, int]], pid: int = 0) -> tuple[Path, Path]:
    """A bundle whose config.json lists ``devices`` (major, minor) as the engine created them; (rootfs, state file)."""
    bundle = tmp_path / "bundle"
    rootfs = make_rootfs(bundle / "rootfs")
    (rootfs / "proc/driver/nvidia").mkdir(parents=True)  # as if the container's /proc had one
    nodes = [{"path": f"/dev/x{minor}", "type": "c", "major": major, "minor": minor} for major, minor in devices]
    config = {"ociVersion": "1.0.2", "root": {"path": "rootfs"}, "process": {"args": ["sh"], "env": ["PATH=/bin"]}, "linux": {"devices": nodes}}
    (bundle / "config.json").write_text(json.dumps(config))
    state = tmp_path / "state.json"  # at createContainer crun sends pid 0, runc the hook's parent's
    state.write_text(json.dumps({"ociVersion": "1.0.2", "id": "cdi-test", "status": "creating", "pid": pid, "bundle": str(bundle)}))
    return rootfs, state


def in_own_namespace(args: list[str], state: Path, then: str, command: list[str] = PONYTAIL) -> str:
    """Run the ponytail command with ``args`` in a private mount namespace, then ``then`` there."""
    import subprocess

    script = f'"$@" < {state}; echo "rc=$?"; {then}'
    result = subprocess.run(["unshare", "-m", "--propagation", "private", "bash", "-c", script, "--", *command, *args],
                            capture_output=True, text=True, timeout=120)
    return result.stdout + result.stderr


def test_links_linker_cache_and_a_proc_view_of_only_the_devices_the_engine_created(
    shared_host: FakeHost, hook_args: list[str], tmp_path: Path, ponytail_command: list[str]
) -> None:
    # the engine created GPU 2's node (minor 1) and the access nodes of MIG device 2:1:0
    rootfs, state = container(tmp_path, [(195, 1), (239, 145), (239, 146)])
    out = in_own_namespace(hook_args, state, f"cd {rootfs}/proc/driver/nvidia && find . -type f | sort && cat params", ponytail_command)
    assert "rc=0" in out, out
    assert out.split("rc=0\n")[1].splitlines()[:6] == [
        "./capabilities/gpu1/mig/gi1/access", "./capabilities/gpu1/mig/gi1/ci0/access",
        "./gpus/0000:38:00.0/information", "./params", "./registry", "./version",
    ]
    assert "ModifyDeviceFiles: 0" in out and "ModifyDeviceFiles: 1" not in out
    assert (rootfs / LIB.lstrip("/") / "libcuda.so.1").readlink() == Path("libcuda.so.550.54.15")
    assert (rootfs / "etc/ld.so.conf.d/00-ponytail.conf").read_text() == f"{LIB}\n"
    assert (rootfs / "etc/ld.so.cache").exists()
    assert "cdi-hook in" in shared_host.log.read_text()


def test_a_libcuda_the_image_ships_at_the_soname_path_is_covered_by_the_drivers(shared_host: FakeHost, hook_args: list[str], tmp_path: Path) -> None:
    """The image-shadowing protection, where the hook enters no namespace: the driver's library is
    cloned when the image's own file is found, and mounted over it (only in the container)."""
    rootfs, state = container(tmp_path, [(195, 2)])
    own = add_stale_libcuda(rootfs, "470.82.01", 11040)
    driver = shared_host.driver / LIB.lstrip("/") / "libcuda.so.550.54.15"
    out = in_own_namespace(hook_args, state, f"cmp {own} {driver} && echo covered")
    assert "rc=0" in out and "covered" in out, out
    assert own.is_file() and not own.is_symlink() and own.read_bytes() != driver.read_bytes()  # the image's file is untouched
    log = [line for line in shared_host.log.read_text().splitlines() if "warning" in line and "libcuda.so.1" in line]
    assert any("image ships its own" in line for line in log), log


def test_refused_as_a_prestart_hook(shared_host: FakeHost, hook_args: list[str], tmp_path: Path, sleeper) -> None:
    """Run as a prestart hook would be, from the runtime's namespace with the container's pid: it must
    not mount there (what it mounted would stay on the host and never reach the container)."""
    rootfs, state = container(tmp_path, [(195, 2)], pid=sleeper.pid)
    result = run_ponytail(hook_args, stdin=state.read_bytes(), isolated=False)
    err = result.stderr.decode()
    assert result.returncode == 1 and "is a createContainer hook" in err and len(err.splitlines()) == 1, err
    assert not (rootfs / LIB.lstrip("/") / "libcuda.so.1").exists()
    assert not (rootfs / "etc/ld.so.conf.d").exists()


def test_a_driver_upgrade_since_the_spec_stops_the_start_with_what_to_do(hook_args: list[str], tmp_path: Path) -> None:
    args = list(hook_args)
    args[args.index("--driver-version") + 1] = "535.104.05"
    rootfs, state = container(tmp_path, [(195, 2)])
    out = in_own_namespace(args, state, "")
    assert "rc=1" in out and "generated for NVIDIA driver 535.104.05 but 550.54.15 is running" in out and "cdi generate" in out, out
    assert not (rootfs / "etc/ld.so.conf.d").exists()


@pytest.mark.parametrize("args", [
    ["--bogus"], ["--link", "/a"], ["--ldconfig"],
    # relative paths would be the image's: the hook's working directory is the rootfs
    ["--ldconfig", "sbin/ldconfig"], ["-config", "etc/config.toml"], ["--link", "/usr/lib/libcuda.so.1", "libcuda.so.5", "lib/x"],
])
def test_bad_arguments_are_one_line_and_exit_2(args: list[str]) -> None:
    result = run_ponytail(["cdi-hook", *args], stdin=b"{}")
    err = result.stderr.decode()
    assert result.returncode == 2 and len(err.splitlines()) == 1 and "cdi-hook" in err, err


def test_the_hook_imports_neither_yaml_nor_click_nor_the_slow_modules(hook_args: list[str], tmp_path: Path) -> None:
    _rootfs, state = container(tmp_path, [(195, 2)])
    result = run_ponytail(hook_args, stdin=state.read_bytes(), env={"PYTHONPROFILEIMPORTTIME": "1"})
    imported = {line.split("|")[-1].strip() for line in result.stderr.decode().splitlines() if line.startswith("import time:")}
    assert "ponytail.hooks.cdi" in imported and "ponytail.apply.executor" in imported, imported
    # the OCI state and config.json are plain JSON: ponytail.lite.plainjson reads them without json, re, enum
    slow = {"yaml", "click", "dataclasses", "subprocess", "typing", "tomllib", "json", "re", "enum", "glob", "fnmatch"}
    assert not imported & slow, imported & slow


def _renumber(host: FakeHost) -> None:
    """The driver gives the two GPUs each other's minors (same driver version)."""
    files = sorted((host.proc / "driver/nvidia/gpus").glob("*/information"))
    texts = [f.read_text() for f in files]
    minors = [t.split("Device Minor: \t ")[1].split("\n")[0] for t in texts]
    for f, text, old, new in zip(files, texts, minors, reversed(minors), strict=True):
        f.write_text(text.replace(f"Device Minor: \t {old}\n", f"Device Minor: \t {new}\n"))


def _new_uvm_major(host: FakeHost) -> None:
    devices = host.proc / "devices"
    devices.write_text(devices.read_text().replace("511 nvidia-uvm", "509 nvidia-uvm"))


def _gpu_gone(host: FakeHost) -> None:
    import shutil

    shutil.rmtree(host.proc / "driver/nvidia/gpus/0000:18:00.0")
    shutil.rmtree(host.sys / "bus/pci/devices/0000:18:00.0")


@pytest.mark.parametrize("change, says", [
    (_renumber, "GPU 0000:18:00.0 (GPU-00000000-1111-2222-3333-000000000000) has minor 1 now, not 0: /dev/nvidia0 is another GPU's"),
    (_new_uvm_major, "the nvidia-uvm major was 511 and is 509 now"),
    (_gpu_gone, "GPU 0000:18:00.0 (GPU-00000000-1111-2222-3333-000000000000, minor 0) is gone from"),
])
def test_a_spec_whose_nodes_changed_meaning_is_refused_by_the_hook_and_by_cdi_check(tmp_path: Path, change, says: str) -> None:
    """Same driver, but what the spec's nodes are has changed: GPU 0's node is GPU 1's now, UVM's
    major moved, or GPU 0 is gone. The hook must not start the container with GPU 0's old node."""
    host = FakeHost(tmp_path / "host", gpu_list=gpus(2))
    spec_path = tmp_path / "nvidia.json"
    spec = generate(host, spec_path)
    args = spec["containerEdits"]["hooks"][0]["args"][1:]
    rootfs, state = container(tmp_path, [(195, 0), (195, 255), (511, 0)])  # what the engine made of gpu=0
    config = str(host.write_config())
    assert "rc=0" in in_own_namespace(args, state, "")
    assert run_ponytail(["cdi", "check", "-config", config, str(spec_path)]).returncode == 0
    change(host)
    rootfs, state = container(tmp_path / "again", [(195, 0), (195, 255), (511, 0)])
    out = in_own_namespace(args, state, "")
    assert "rc=1" in out and says in out and "cdi generate" in out and len(out.splitlines()) == 2, out
    assert not (rootfs / "etc/ld.so.conf.d").exists()
    check = run_ponytail(["cdi", "check", "-config", config, str(spec_path)])
    assert check.returncode == 1 and says in check.stdout.decode(), check.stdout + check.stderr
