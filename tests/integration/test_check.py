"""``ponytail check``: a healthy fake host, engine layout and container give exit 0 and no
finding that is not ok; each broken layout gives exit 1 and exactly one finding, which
says what is wrong and what to do. The JSON report is parsed back."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from support.engines import console_script
from support.fakehost import NVIDIA_MAJOR, FakeHost, add_stale_libcuda, gpus, install_driver_tree, make_rootfs
from support.harness import bundle_for, run_ponytail

KERNEL = "550.54.15"


class Layout:
    """A healthy host (driver, nodes, daemons, cgroup v2, one driver tree), a podman set up
    with ponytail's hooks.d file, and an image; tests break one thing each."""

    def __init__(self, base: Path, extra_libraries: bool = False) -> None:
        self.host = FakeHost(base / "host", gpu_list=gpus(2), daemons=True, extra_libraries=extra_libraries)
        (self.host.sys / "fs/cgroup").mkdir(parents=True)
        (self.host.sys / "fs/cgroup/cgroup.controllers").write_text("cpu io memory pids\n")
        self.tree = install_driver_tree(base / "umd/dev-build", KERNEL, 12041)
        self.engines = base / "engines"
        hooks = self.engines / "usr/share/containers/oci/hooks.d"
        hooks.mkdir(parents=True)
        (self.engines / "etc/containers").mkdir(parents=True)
        hook = {"version": "1.0.0", "hook": {"path": console_script("ponytail")}, "stages": ["prestart"]}
        (hooks / "ponytail.json").write_text(json.dumps(hook))
        self.rootfs = make_rootfs(base / "rootfs")
        self.base = base
        self.extra_config = ""
        linked = run_ponytail(["dev-char-links", "-config", str(self.host.write_config())])  # what a node set up as documented has
        assert linked.returncode == 0, linked.stderr

    def config(self) -> Path:
        path = self.host.write_config()
        path.write_text(path.read_text() + f'[drivers.dev-build]\nroot = "{self.tree}"\n' + self.extra_config)
        return path

    def check(self, *args: str) -> tuple[int, dict, str]:
        base = ["check", "-config", str(self.config()), "--engine-root", str(self.engines)]
        result = run_ponytail(base + list(args) + ["--json"])
        text = run_ponytail(base + list(args))
        assert text.returncode == result.returncode
        return result.returncode, json.loads(result.stdout), text.stdout.decode()


@pytest.fixture
def layout(tmp_path: Path) -> Layout:
    return Layout(tmp_path)


def _not_ok(report: dict) -> list[dict]:
    return [f for f in report["findings"] if f["level"] != "ok"]


def _one_finding(layout: Layout, *args: str) -> dict:
    status, report, text = layout.check(*args)
    bad = _not_ok(report)
    assert status == 1 and not report["ok"]
    assert len(bad) == 1, bad
    line = next(line for line in text.splitlines() if bad[0]["message"] in line)
    assert line.startswith(bad[0]["level"])  # one line, what is wrong and what to do
    assert ":" in bad[0]["message"]
    return bad[0]


def test_a_healthy_host_engine_and_container(layout: Layout) -> None:
    status, report, text = layout.check("--rootfs", str(layout.rootfs))
    assert status == 0, _not_ok(report)
    assert report["ok"] and text.endswith("all is well\n")
    subjects = {(f["area"], f["subject"]) for f in report["findings"]}
    assert {("host", "driver"), ("host", "libcuda.so.1"), ("host", "/dev/nvidia0"), ("host", "/dev/nvidia-uvm"),
            ("host", "cgroup"), ("host", "driver tree dev-build"), ("engine", "podman"), ("container", "libcuda.so.1"),
            ("container", "libnvidia-ml.so.1")} <= subjects
    assert "cgroup v2" in next(f["message"] for f in report["findings"] if f["subject"] == "cgroup")


def test_a_node_without_its_dev_char_link(layout: Layout) -> None:
    (layout.host.dev / f"char/{NVIDIA_MAJOR}:1").unlink()
    finding = _one_finding(layout)
    assert finding["subject"] == f"{layout.host.dev}/char" and finding["level"] == "warning"
    assert f"char/{NVIDIA_MAJOR}:1 (nvidia1: missing)" in finding["message"]
    assert "daemon-reload" in finding["message"] and "ponytail dev-char-links" in finding["message"]


def test_no_driver_loaded(layout: Layout) -> None:
    (layout.host.proc / "driver/nvidia/version").unlink()
    finding = _one_finding(layout)
    assert finding["subject"] == "driver" and "modprobe nvidia" in finding["message"]


def test_libraries_of_another_version_than_the_kernel_module(layout: Layout) -> None:
    libdir = layout.host.driver / "usr/lib/x86_64-linux-gnu"
    (libdir / "libnvidia-ml.so.1").unlink()
    (libdir / "libnvidia-ml.so.1").symlink_to("libnvidia-ml.so.535.104.05")  # upgraded files, old module
    finding = _one_finding(layout)
    assert finding["subject"] == "libnvidia-ml.so.1"
    assert "535.104.05" in finding["message"] and KERNEL in finding["message"] and "version mismatch" in finding["message"]


def test_firmware_of_another_version(layout: Layout) -> None:
    shutil.rmtree(layout.host.driver / "lib/firmware/nvidia" / KERNEL)
    finding = _one_finding(layout)
    assert finding["subject"] == "firmware" and "535.104.05" in finding["message"]


def test_a_node_with_the_wrong_numbers(layout: Layout) -> None:
    node = layout.host.dev / "nvidia1"
    node.unlink()
    os.mknod(node, 0o666 | 0o020000, os.makedev(NVIDIA_MAJOR, 7))
    finding = _one_finding(layout)
    assert finding["subject"] == "/dev/nvidia1" and "expected c 195:1" in finding["message"]


def test_nvidia_uvm_not_loaded(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    devices = layout.host.proc / "devices"
    devices.write_text("".join(line + "\n" for line in devices.read_text().splitlines() if "nvidia-uvm" not in line))
    finding = _one_finding(layout)
    assert finding["subject"] == "nvidia-uvm" and "modprobe nvidia-uvm" in finding["message"]


def test_no_persistence_daemon(layout: Layout) -> None:
    (layout.host.ipc / "run/nvidia-persistenced/socket").unlink()
    finding = _one_finding(layout)
    assert finding["subject"] == "nvidia-persistenced" and "start nvidia-persistenced" in finding["message"]


def test_a_driver_tree_that_cannot_serve(layout: Layout) -> None:
    shutil.rmtree(layout.tree)
    install_driver_tree(layout.tree, "560.28.03", 12060)
    finding = _one_finding(layout)
    assert finding["subject"] == "driver tree dev-build" and "560.28.03" in finding["message"] and KERNEL in finding["message"]


def listening(path: Path) -> socket.socket:
    """A unix socket listening at ``path`` (bound through its directory's descriptor: any length)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    directory = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        server.bind(f"/proc/self/fd/{directory}/{path.name}")
    finally:
        os.close(directory)
    server.listen(128)  # never accepted: each check's connection waits in the backlog
    return server


def test_docker_without_the_runtime(layout: Layout) -> None:
    (layout.engines / "etc/docker").mkdir(parents=True)
    (layout.engines / "etc/docker/daemon.json").write_text('{"runtimes": {"other": {"path": "/usr/bin/runc"}}}')
    finding = _one_finding(layout, "--engine", "docker")
    assert finding["subject"] == "docker" and "ponytail-runtime" in finding["message"]
    with listening(layout.engines / "run/docker.sock"):  # dockerd runs: checked without being named
        finding = _one_finding(layout)
    assert finding["subject"] == "docker" and "ponytail-runtime" in finding["message"]


def test_with_several_engines_installed_only_those_in_use_are_checked(layout: Layout) -> None:
    """Installed but neither running nor configured for ponytail: not a finding (podman, configured,
    is checked); a socket file a crashed daemon left is not a running service."""
    for directory in ("etc/docker", "etc/containerd", "etc/crio"):
        (layout.engines / directory).mkdir(parents=True)
    (layout.engines / "etc/containerd/config.toml").write_text("version = 2\n")
    listening(layout.engines / "run/containerd/containerd.sock").close()  # stale: nothing listens
    status, report, text = layout.check()
    assert status == 0, _not_ok(report)
    engines = {f["subject"]: f["message"] for f in report["findings"] if f["area"] == "engine"}
    assert "not checked ('ponytail check --engine containerd' checks it)" in engines["containerd"]
    assert "not checked" in engines["docker"] and "runs" in engines["podman"]
    assert "runs" in engines["CRI-O"]  # it reads the same default hooks directory as podman
    # containerd's service runs: it is checked
    with listening(layout.engines / "run/containerd/containerd.sock.new") as server:
        os.rename(layout.engines / "run/containerd/containerd.sock.new", layout.engines / "run/containerd/containerd.sock")
        finding = _one_finding(layout)
        assert finding["subject"] == "containerd" and "BinaryName" in finding["message"]
        # ... unless it is only dockerd's backend (Debian's docker.io): no kubelet configured
        with listening(layout.engines / "var/run/docker.sock"):
            (layout.engines / "etc/docker/daemon.json").write_text(json.dumps({"runtimes": {"ponytail": {"path": console_script("ponytail-runtime")}}}))
            status, report, _ = layout.check()
            assert status == 0, _not_ok(report)
            (layout.engines / "var/lib/kubelet").mkdir(parents=True)
            (layout.engines / "var/lib/kubelet/config.yaml").write_text("kind: KubeletConfiguration\n")
            assert _one_finding(layout)["subject"] == "containerd"
        server.close()
    # named, they are checked; one not installed says so
    status, report, _ = layout.check("--engine", "docker", "--engine", "containerd")
    assert status == 1 and {f["subject"] for f in _not_ok(report)} == {"containerd"}, _not_ok(report)
    (layout.engines / "etc/crio").rmdir()
    finding = _one_finding(layout, "--engine", "crio")
    assert finding["subject"] == "CRI-O" and "is not installed here" in finding["message"]


def test_crio_configured_by_its_drop_in(layout: Layout) -> None:
    (layout.engines / "etc/crio").mkdir(parents=True)
    (layout.engines / "etc/crio/crio.conf").write_text("[crio.runtime]\n")
    configured = subprocess.run([console_script("ponytail"), "configure", "--runtime", "crio", "--config-file",
                                 str(layout.engines / "etc/crio/crio.conf"), "--path", console_script("ponytail-runtime"),
                                 "--state-dir", str(layout.base / "state")], capture_output=True, text=True, timeout=60)
    assert configured.returncode == 0, configured.stderr
    status, report, _ = layout.check()
    assert status == 0, _not_ok(report)
    crio = next(f for f in report["findings"] if f["subject"] == "CRI-O")
    assert "runtime_path in" in crio["message"] and "99-ponytail.conf" in crio["message"]


V3_IMPORTING = """version = 3
imports = ["/etc/containerd/conf.d/*.toml"]

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
runtime_type = "io.containerd.runc.v2"
"""


def _configure(layout: Layout, *args: str) -> str:
    configured = subprocess.run([console_script("ponytail"), "configure", "--runtime", "containerd", "--config-file",
                                 str(layout.engines / "etc/containerd/config.toml"), "--state-dir", str(layout.base / "state"), *args],
                                capture_output=True, text=True, timeout=60)
    assert configured.returncode == 0, configured.stderr
    return configured.stdout


@pytest.mark.parametrize("where", ["imported directory", "directory below the imported one", "runtime of another name"])
def test_containerd_configured_by_a_drop_in(layout: Layout, where: str) -> None:
    """configure writes containerd 2.x's drop-in (conf.d/99-ponytail.toml, which config.toml imports):
    check finds it there, and a second configure has nothing to do: the two read the same files. A
    drop-in in a directory below the imported glob's is imported by a glob of its own (containerd's
    ``*`` stops at ``/``), and a --path of any name is ponytail's runtime all the same."""
    (layout.engines / "etc/containerd/conf.d").mkdir(parents=True)
    (layout.engines / "etc/containerd/config.toml").write_text(V3_IMPORTING)
    args: list[str] = ["--path", console_script("ponytail-runtime")]
    drop_in = layout.engines / "etc/containerd/conf.d/99-ponytail.toml"
    if where == "directory below the imported one":
        drop_in = layout.engines / "etc/containerd/conf.d/gpu/99-ponytail.toml"
        args += ["--drop-in-config", str(drop_in)]
    elif where == "runtime of another name":
        (layout.base / "bin").mkdir()
        (layout.base / "bin/gpu-runtime").symlink_to(console_script("ponytail-runtime"))
        args = ["--path", str(layout.base / "bin/gpu-runtime")]
    _configure(layout, *args)
    assert drop_in.is_file()
    status, report, _ = layout.check()
    assert status == 0, _not_ok(report)
    containerd = next(f for f in report["findings"] if f["subject"] == "containerd")
    assert f"BinaryName in {drop_in}" in containerd["message"], containerd
    assert "already configured for ponytail; nothing changed" in _configure(layout, *args)
    _configure(layout, *args, "--uninstall")
    assert not drop_in.exists()
    finding = _one_finding(layout, "--engine", "containerd")
    assert finding["subject"] == "containerd" and "'ponytail configure --runtime containerd" in finding["message"]


def test_docker_with_the_runtime(layout: Layout) -> None:
    (layout.engines / "etc/docker").mkdir(parents=True)
    runtime = console_script("ponytail-runtime")
    (layout.engines / "etc/docker/daemon.json").write_text(json.dumps({"runtimes": {"ponytail": {"path": runtime}}}))
    status, report, _ = layout.check()
    assert status == 0, _not_ok(report)


def test_containerd_without_the_runtime(layout: Layout) -> None:
    (layout.engines / "etc/containerd").mkdir(parents=True)
    (layout.engines / "etc/containerd/config.toml").write_text("version = 2\n")
    finding = _one_finding(layout, "--engine", "containerd")
    assert finding["subject"] == "containerd" and "BinaryName" in finding["message"]


def test_a_hooks_file_whose_command_is_gone(layout: Layout) -> None:
    hook = layout.engines / "usr/share/containers/oci/hooks.d/ponytail.json"
    hook.write_text(json.dumps({"version": "1.0.0", "hook": {"path": "/nonexistent/ponytail"}, "stages": ["prestart"]}))
    finding = _one_finding(layout)
    assert finding["subject"] == "podman" and "/nonexistent/ponytail" in finding["message"] and "install-hook" in finding["message"]


def _generate_spec(layout: Layout, name: str) -> Path:
    """A spec made by ``ponytail cdi generate`` for the layout's host, where engines read it."""
    spec = layout.engines / "etc/cdi" / name
    spec.parent.mkdir(parents=True, exist_ok=True)
    made = run_ponytail(["cdi", "generate", "-config", str(layout.config()), "--output", str(spec)])
    assert made.returncode == 0, made.stderr
    return spec


def test_a_fresh_cdi_spec_is_ok(layout: Layout) -> None:
    spec = _generate_spec(layout, "nvidia.yaml")
    status, report, _ = layout.check()
    assert status == 0, _not_ok(report)
    assert any(f["subject"] == "CDI" and str(spec) in f["message"] for f in report["findings"])


def test_a_cdi_spec_left_stale_by_a_driver_upgrade(tmp_path: Path) -> None:
    layout = Layout(tmp_path, extra_libraries=True)
    spec = _generate_spec(layout, "nvidia.json")
    gone = next((layout.host.driver / "usr/lib/x86_64-linux-gnu").glob("libnvidia-cfg.so.*.*"))
    assert str(gone) in spec.read_text()  # the spec mounts it
    gone.unlink()  # what an upgrade does to the old version's files
    finding = _one_finding(layout)
    assert finding["subject"] == "CDI" and str(gone) in finding["message"]
    assert f"ponytail cdi generate --output {spec}" in finding["message"]


def test_an_invalid_nvidia_cdi_spec(layout: Layout) -> None:
    cdi = layout.engines / "etc/cdi"
    cdi.mkdir(parents=True)
    (cdi / "nvidia.json").write_text(json.dumps({"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "devices": []}))
    (cdi / "other-vendor.json").write_text(json.dumps({"cdiVersion": "0.5.0", "kind": "example.com/fpga", "devices": []}))
    finding = _one_finding(layout)
    assert finding["subject"] == "CDI" and "nvidia.json" in finding["message"] and "ponytail cdi generate" in finding["message"]


def test_a_container_whose_ld_library_path_loads_an_old_driver(layout: Layout, tmp_path: Path) -> None:
    install_driver_tree(layout.rootfs / "opt/old", "470.82.01", 11040, lib_dir="/lib")
    bundle = bundle_for(tmp_path, layout.rootfs, env=["PATH=/bin", "LD_LIBRARY_PATH=/opt/old/lib"])
    status, report, _ = layout.check("--bundle", str(bundle))
    bad = _not_ok(report)
    assert status == 1
    # libcuda.so.1 and libnvidia-ml.so.1 alike: each says which file and what to do
    assert [f["subject"] for f in bad] == ["libcuda.so.1", "libnvidia-ml.so.1"]
    assert all("/opt/old/lib/" in f["message"] and "470.82.01" in f["message"] and "LD_LIBRARY_PATH" in f["message"] for f in bad)


def test_an_image_with_a_stale_libcuda(layout: Layout) -> None:
    add_stale_libcuda(layout.rootfs, "470.82.01", 11040)
    finding = _one_finding(layout, "--rootfs", str(layout.rootfs))
    assert finding["area"] == "container" and finding["subject"] == "libcuda.so.1"
    assert "/usr/lib/x86_64-linux-gnu/libcuda.so.1" in finding["message"] and "remove it from the image" in finding["message"]


def test_a_container_asking_for_an_unregistered_tree(layout: Layout, tmp_path: Path) -> None:
    bundle = bundle_for(tmp_path, layout.rootfs, env=["PATH=/bin", "PONYTAIL_DRIVER=/opt/evil"])
    finding = _one_finding(layout, "--bundle", str(bundle))
    assert finding["area"] == "container" and "not a registered driver name" in finding["message"]


def test_the_container_of_a_tree_is_checked_against_it(layout: Layout, tmp_path: Path) -> None:
    bundle = bundle_for(tmp_path, layout.rootfs, env=["PATH=/bin", "PONYTAIL_DRIVER=dev-build"])
    status, report, _ = layout.check("--bundle", str(bundle))
    assert status == 0, _not_ok(report)
    picked = next(f for f in report["findings"] if f["area"] == "container" and f["subject"] == "driver")
    assert "driver tree 'dev-build'" in picked["message"]


@pytest.mark.parametrize(
    "engine, config, text, hooks_dir",
    [
        ("podman", "etc/containers/containers.conf", '[engine]\nhooks_dir = ["/etc/my-hooks"]\n', "/etc/my-hooks"),
        ("CRI-O", "etc/crio/crio.conf.d/10-hooks.conf", '[crio.runtime]\nhooks_dir = [\n  "/etc/crio-hooks",  # ours\n]\n', "/etc/crio-hooks"),
    ],
)
def test_an_engine_reading_another_hooks_directory(layout: Layout, engine: str, config: str, text: str, hooks_dir: str) -> None:
    """hooks_dir in the engine's config replaces the default directories: the file must be there."""
    (layout.engines / config).parent.mkdir(parents=True, exist_ok=True)
    (layout.engines / config).write_text(text)
    finding = _one_finding(layout)
    assert finding["subject"] == engine and hooks_dir in finding["message"] and f"hooks_dir in {layout.engines / config}" in finding["message"]
    (layout.engines / hooks_dir.lstrip("/")).mkdir()
    shutil.copy(layout.engines / "usr/share/containers/oci/hooks.d/ponytail.json", layout.engines / hooks_dir.lstrip("/") / "ponytail.json")
    status, report, _ = layout.check()
    assert status == 0, _not_ok(report)
    assert any(f["subject"] == engine and hooks_dir in f["message"] for f in report["findings"])


@pytest.mark.parametrize("plant", ["ld-library-path-link", "cache-link", "cache-fifo", "conf-loop"])
def test_check_never_leaves_the_rootfs(layout: Layout, tmp_path: Path, plant: str) -> None:
    """Links out of the image lead nowhere, a FIFO is not read, an include loop ends: the
    old driver outside the rootfs is never reported as the container's."""
    outside = install_driver_tree(tmp_path / "outside", "470.82.01", 11040, lib_dir="/lib")
    env = ["PATH=/bin"]
    etc = layout.rootfs / "etc"
    if plant == "ld-library-path-link":
        (layout.rootfs / "escape").symlink_to(outside / "lib")
        env.append("LD_LIBRARY_PATH=/escape")
    elif plant == "cache-link":
        (etc / "ld.so.cache").unlink(missing_ok=True)
        (etc / "ld.so.cache").symlink_to(outside / "etc/ld.so.cache")
    elif plant == "cache-fifo":
        (etc / "ld.so.cache").unlink(missing_ok=True)
        os.mkfifo(etc / "ld.so.cache")
    else:
        (etc / "ld.so.conf.d").mkdir(exist_ok=True)
        (etc / "ld.so.conf.d/loop.conf").write_text(f"include /etc/ld.so.conf\n{outside}/lib\n")
    bundle = bundle_for(tmp_path, layout.rootfs, env=env)
    status, report, _ = layout.check("--bundle", str(bundle))
    assert status == 0, _not_ok(report)
    assert "470.82.01" not in json.dumps(report)


def test_an_image_linker_config_of_many_directories_is_read_in_linear_time(tmp_path: Path) -> None:
    """ponytail check --rootfs reads the image's /etc/ld.so.conf and its includes: 16 files of
    6,000 distinct directories cost what 16 files of one repeated directory do (it kept them in a
    list and looked each up there)."""
    from ponytail.doctor.loader import _image_library_dirs

    from support.timing import assert_as_fast

    def rootfs(name: str, distinct: bool) -> int:
        root = make_rootfs(tmp_path / name)
        (root / "etc/ld.so.conf.d").mkdir(parents=True, exist_ok=True)
        (root / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
        for i in range(16):
            (root / f"etc/ld.so.conf.d/{i:02}.conf").write_text("".join(f"/d{i * 10000 + j if distinct else ''}\n" for j in range(6000)))
        return os.open(root, os.O_PATH | os.O_DIRECTORY)

    distinct, repeated = rootfs("distinct", True), rootfs("repeated", False)
    try:
        assert len(_image_library_dirs(distinct)) >= 16 * 6000
        assert_as_fast(lambda: _image_library_dirs(distinct), lambda: _image_library_dirs(repeated), "distinct", "repeated lines")
    finally:
        os.close(distinct)
        os.close(repeated)


def test_a_container_check_without_bundle_or_rootfs_is_a_finding_not_an_assertion() -> None:
    from ponytail.config import Config
    from ponytail.doctor.check import FAIL, Finding, check_container

    assert check_container(Config(), None, None) == [Finding("container", "rootfs", FAIL, "no container to check: pass --bundle or --rootfs")]
