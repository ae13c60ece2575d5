"""A GPU node's life on a booted Debian 12 node (support.bootednode: systemd in systemd-nspawn, the engines
of Debian 12 run by its systemd on cgroup v2, runc's systemd cgroup driver): the package ``make deb`` builds
installed with apt as an operator would, ``ponytail configure``, GPU containers started on every start path
(Docker's legacy hook through ``--gpus``, podman's hooks.d, the runtime shim, CDI, containerd's CRI through
support.containerd_cri's client), then ``systemctl daemon-reload``, a reboot, a package upgrade and removal, a migration off NVIDIA's toolkit and back.

The driver is the project's fake one (support.fakehost): its libraries where the config says, its device
nodes made in the node's /dev at boot by a unit standing in for nvidia-modprobe. A GPU node that opens with
ENXIO is allowed (no real driver behind it), EPERM is denied, ENOENT is not in the container.

Marked ``node`` (tests/conftest.py): ``make test-node`` runs these alone. They need root, systemd-nspawn
(Debian's systemd-container) and Debian's archive (the node's root is built once and cached).
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from support.bootednode import BootedNode, node_root
from support.containerd_cri import Pods, oci_archive
from support.debbuild import OLD_VERSION, build_debs, nvidia_package
from support.fakehost import FakeHost, gpus, make_rootfs
from support.nvidia_tools import DEVICE_PLUGIN_KIND, captured_host, point_hooks, spec_text

CUDACHECK = "/usr/local/bin/cudacheck"
GPU = re.compile(r"open (/dev/nvidia\d+) (\w+)")
# what nvidia-modprobe does at boot on a real node: the driver's nodes in /dev (made with mknod; no udev event)
FAKE_MODPROBE = """[Unit]
Description=the fake driver's device nodes (as nvidia-modprobe makes them)
DefaultDependencies=no
After=local-fs.target
Before=sysinit.target docker.service containerd.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/sh -c 'cp -a {dev}/nvidia* /dev/'

[Install]
WantedBy=sysinit.target
"""


@pytest.fixture(scope="module", params=["bookworm", "sid"])
def suite(request: pytest.FixtureRequest) -> str:
    """Debian 12's engines, and the newer ones of Debian's sid (containerd 2.1, docker 28, podman 5.8, runc 1.3)."""
    return str(request.param)


@pytest.fixture(scope="module")
def lower(suite: str) -> Path:
    root = node_root(suite)
    if isinstance(root, str):
        pytest.skip(root)
    return root


def _pids(suite: str) -> str:
    """No pids controller in the node's cgroup tree: podman 4 takes -1 for no limit, podman 5 0."""
    return "--pids-limit=-1" if suite == "bookworm" else "--pids-limit=0"


@pytest.fixture(scope="module")
def debs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return build_debs(tmp_path_factory.mktemp("nodedebs"))


@pytest.fixture(scope="module")
def fake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fake host with 2 GPUs, an image's rootfs (cudacheck, sleep) and ponytail's config for the node
    (its driver files here, its device nodes in the node's own /dev)."""
    base = tmp_path_factory.mktemp("nodefake")
    host = FakeHost(base / "host", gpu_list=gpus(2))
    rootfs = make_rootfs(base / "rootfs", programs=("cudacheck.c", "cudahold.c"))
    (rootfs / "bin/sleep").symlink_to("busybox")
    (base / "config.toml").write_text(host.config_text().replace(f'dev_root = "{host.dev}"', 'dev_root = "/dev"'))
    (base / "fake-nvidia-modprobe.service").write_text(FAKE_MODPROBE.format(dev=host.dev))
    return base


@pytest.fixture
def node(lower: Path, tmp_path: Path, fake: Path, debs: dict[str, Path]) -> Iterator[BootedNode]:
    booted = BootedNode(lower, tmp_path / "node", f"pt{tmp_path.name[-6:].strip('_').replace('_', '')}"[:12],
                        binds=[fake, debs["new"].parent])
    try:
        booted.boot()
        # the node as its operator set it up before ponytail: the driver's nodes at boot, podman's storage
        booted.check(f"""
            cp {fake}/fake-nvidia-modprobe.service /etc/systemd/system/
            systemctl --no-reload enable fake-nvidia-modprobe.service
            systemctl start fake-nvidia-modprobe.service
            printf '[storage]\\ndriver = "vfs"\\nrunroot = "/run/containers/storage"\\ngraphroot = "/var/lib/containers/storage"\\n' >/etc/containers/storage.conf
            cd {fake}/rootfs && tar -c . | docker import - gpuimg >/dev/null
            """)
        yield booted
    finally:
        if booted.leader:  # the containers first, at once: a poweroff waits for each engine to stop them
            booted.run("docker rm -f $(docker ps -aq) >/dev/null 2>&1; podman rm -af -t 0 >/dev/null 2>&1; true", timeout=120)
        booted.close()
        shutil.rmtree(tmp_path / "node", ignore_errors=True)


def _install(node: BootedNode, fake: Path, deb: Path) -> str:
    out = node.check(f"apt-get install -y --no-install-recommends {deb} 2>&1")
    # the node's driver, as its operator says where (its /proc is the fake host's): the links follow it
    node.check(f"cp {fake}/config.toml /etc/ponytail/config.toml && systemctl start ponytail-dev-char-links.service")
    return out


def _gpus(node: BootedNode, exec_prefix: str) -> dict[str, str]:
    """What each GPU node does when the container opens it: {"/dev/nvidia0": "ENXIO", ...}; libcuda must load."""
    out = node.check(f"{exec_prefix} {CUDACHECK} /dev/nvidia0 /dev/nvidia1")
    assert "cuDriverGetVersion 12040" in out, out
    return dict(GPU.findall(out))


def _scope(node: BootedNode, pid_command: str) -> str:
    pid = node.check(pid_command).strip()
    line = node.check(f"grep ^0:: /proc/{pid}/cgroup").strip()
    assert line.endswith(".scope"), line  # runc's systemd cgroup driver: the container is a systemd unit
    return line.rsplit("/", 1)[1]


def _device_allow(node: BootedNode, unit: str) -> str:
    return node.check(f"systemctl show {unit} -p DeviceAllow")


def test_install_start_paths_and_daemon_reload(node: BootedNode, fake: Path, debs: dict[str, Path], suite: str) -> None:
    installed = _install(node, fake, debs["new"])
    assert "ponytail-guard.service) is not enabled" in installed
    assert node.run("systemctl is-enabled ponytail-guard.service").stdout.strip() == "disabled"
    assert node.check("systemctl is-active ponytail-guard.service || true").strip() == "inactive"
    assert node.check("systemctl is-active ponytail-dev-char-links.path").strip() == "active"
    assert "195:0 -> ../nvidia0" in node.check("ls -l /dev/char/")  # the units linked the driver's nodes

    # registered as an operator does, one command each; the engines restarted
    node.check("""
        ponytail configure --runtime docker
        ponytail install-docker-gpus
        systemctl restart docker
        ponytail cdi generate --output /var/run/cdi/ponytail.yaml
        """)
    starts = {
        "legacy hook (docker --gpus)": "docker run -d --network none --gpus device=0 gpuimg /bin/sleep 100000",
        "shim (docker --runtime ponytail)": "docker run -d --network none --runtime ponytail -e NVIDIA_VISIBLE_DEVICES=0 gpuimg /bin/sleep 100000",
        "hooks.d (podman)": f"podman run -d {_pids(suite)} --network none --annotation com.example.gpu=true -e NVIDIA_VISIBLE_DEVICES=0 "
                            f"--rootfs {fake}/rootfs /bin/sleep 100000",
        "CDI (podman --device)": f"podman run -d {_pids(suite)} --network none --device nvidia.com/gpu=0 --rootfs {fake}/rootfs /bin/sleep 100000",
    }
    containers = {}
    for path, command in starts.items():
        cid = node.check(command).strip().splitlines()[-1]
        engine = command.split()[0]
        containers[path] = (f"{engine} exec {cid}", _scope(node, f"{engine} inspect -f '{{{{.State.Pid}}}}' {cid}"))
    for path, (exec_prefix, unit) in containers.items():
        assert _gpus(node, exec_prefix) == {"/dev/nvidia0": "ENXIO", "/dev/nvidia1": "ENOENT"}, path
        # the hook's nodes are systemd's too (added over D-Bus), the engine's rules (shim, CDI) by /dev/char links
        allowed = _device_allow(node, unit)
        assert re.search(r"DeviceAllow=/dev/(nvidia0|char/195:0) rw", allowed), (path, allowed)
        assert "195:1" not in allowed and "nvidia1 " not in allowed, (path, allowed)

    for _ in range(2):
        node.check("systemctl daemon-reload")
        time.sleep(0.5)
        for path, (exec_prefix, unit) in containers.items():
            assert _gpus(node, exec_prefix) == {"/dev/nvidia0": "ENXIO", "/dev/nvidia1": "ENOENT"}, f"{path} after daemon-reload"
            assert re.search(r"DeviceAllow=/dev/(nvidia0|char/195:0) rw", _device_allow(node, unit)), path
    # systemd re-applying a scope's settings (any set-property does; so does a reload where systemd re-realizes its
    # units) builds the device program from DeviceAllow= alone: the GPU stays because the nodes are in that list
    for path, (exec_prefix, unit) in containers.items():
        node.check(f"systemctl set-property --runtime {unit} DeviceAllow='/dev/null rw'")
        assert _gpus(node, exec_prefix) == {"/dev/nvidia0": "ENXIO", "/dev/nvidia1": "ENOENT"}, f"{path} after its settings were re-applied"

    # the node's systemd enforces its units' device rules here: a scope whose list is emptied loses the GPU,
    # and the guard gives exactly that back
    exec_prefix, unit = containers["hooks.d (podman)"]
    node.check(f"systemctl set-property --runtime {unit} DeviceAllow=")
    assert _gpus(node, exec_prefix)["/dev/nvidia0"] == "EPERM"
    repaired = node.run("ponytail guard --once")
    assert repaired.returncode == 1 and "given back (only those)" in repaired.stdout, repaired.stdout
    assert _gpus(node, exec_prefix)["/dev/nvidia0"] == "ENXIO"
    well = node.run("ponytail guard --once")
    assert well.returncode == 0 and " 0 lost access" in well.stdout, well.stdout + well.stderr
    # the guard as a service (opt-in, as the README says) reacts to systemd's Reloading signal at once, not at
    # its next interval (60 s): the scope's list is still empty, so the reload takes the GPU and the guard gives it back
    node.check("systemctl --no-reload enable ponytail-guard.service && systemctl start ponytail-guard.service && sleep 2")
    node.check(f"systemctl set-property --runtime {unit} DeviceAllow=")  # lost again (no signal the guard hears)
    assert _gpus(node, exec_prefix)["/dev/nvidia0"] == "EPERM"
    node.check("systemctl daemon-reload")
    deadline = time.monotonic() + 10
    while _gpus(node, exec_prefix)["/dev/nvidia0"] != "ENXIO" and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _gpus(node, exec_prefix)["/dev/nvidia0"] == "ENXIO"
    log = (fake / "host/ponytail.log").read_text()
    assert re.search(r"pass \(1 event\(s\): reloaded systemd daemon-reload\): \d+ container\(s\) watched, 1 lost access, 1 repaired", log), log[-3000:]

    # an upgrade from the previous version with the GPU containers running: no reload, no lost GPU
    node.check(f"apt-get install -y --allow-downgrades {debs[OLD_VERSION]} >/dev/null 2>&1")
    node.check(f"apt-get install -y {debs['new']} >/dev/null 2>&1")
    for path, (exec_prefix, _unit) in containers.items():
        assert _gpus(node, exec_prefix)["/dev/nvidia0"] == "ENXIO", f"{path} after the upgrade"
    # with engines still registered, removal is refused and says what to run first
    refused = node.run("apt-get remove -y ponytail")
    assert refused.returncode != 0 and "ponytail configure --runtime ENGINE --uninstall" in refused.stderr + refused.stdout


def test_reboot_brings_the_node_back(node: BootedNode, fake: Path, debs: dict[str, Path]) -> None:
    _install(node, fake, debs["new"])
    node.check("ponytail configure --runtime docker && systemctl restart docker")
    node.check("touch /run/before-the-reboot")
    node.poweroff()
    node.boot()
    assert node.run("ls /run/before-the-reboot").returncode != 0  # /run started empty
    assert "195:0 -> ../nvidia0" in node.check("ls -l /dev/char/")  # the driver's nodes and their links again
    cid = node.check("docker run -d --network none --runtime ponytail -e NVIDIA_VISIBLE_DEVICES=1 gpuimg /bin/sleep 100000").strip()
    assert _gpus(node, f"docker exec {cid}") == {"/dev/nvidia0": "ENOENT", "/dev/nvidia1": "ENXIO"}
    well = node.run("ponytail guard --once")
    assert well.returncode == 0, well.stdout + well.stderr


def test_migrate_reboot_and_undo(node: BootedNode, fake: Path, debs: dict[str, Path], tmp_path: Path, suite: str) -> None:
    captured = tmp_path / "captured"
    host = captured_host(captured)
    config = captured / "config.toml"
    config.write_text(host.config_text())
    rootfs = make_rootfs(captured / "rootfs")
    (rootfs / "bin/sleep").symlink_to("busybox")
    # the device plugin's spec names its hooks in the nvidia-ctk form (its default --nvidia-cdi-hook-path)
    plugin_spec = point_hooks(yaml.safe_load(spec_text(captured, variant="device-plugin-names")), "", ctk="/usr/bin/nvidia-ctk")
    (captured / "plugin.yaml").write_text(yaml.safe_dump(plugin_spec))
    (captured / "nvidia.yaml").write_text(spec_text(captured))
    (captured / "management.yaml").write_text(spec_text(captured, variant="management"))
    nvidia = nvidia_package(captured)
    node.poweroff()
    node.binds.append(captured)
    node.boot()
    _install(node, fake, debs["new"])
    node.check(f"cp {config} /etc/ponytail/config.toml")  # this node's driver is the captured host's
    # NVIDIA's toolkit as its packages lay it out, its spec and the device plugin's and the Operator's in /var/run/cdi
    node.check(f"""
        dpkg -i {nvidia} >/dev/null && mkdir -p /var/run/cdi
        cp {captured}/nvidia.yaml /var/run/cdi/nvidia.yaml
        cp {captured}/plugin.yaml /var/run/cdi/k8s.device-plugin.nvidia.com-gpu.yaml
        cp {captured}/management.yaml /var/run/cdi/management.nvidia.com-gpu.yaml
        """)
    snapshot = "sha256sum /usr/bin/nvidia-* /var/run/cdi/*; ls /etc/systemd/system /etc/systemd/system/multi-user.target.wants"
    before = node.check(snapshot)
    uuid = host.gpu_list[0].uuid
    pod = f"podman run --rm {_pids(suite)} --network none --device {DEVICE_PLUGIN_KIND}={uuid} --rootfs {rootfs} {CUDACHECK} /dev/nvidia{host.gpu_list[0].minor}"

    migrated = node.check("ponytail migrate --from nvidia")
    assert "is left alone" in migrated
    after = node.check("sha256sum /var/run/cdi/*")
    for line in before.splitlines():
        if "k8s.device-plugin" in line or "management.nvidia.com" in line:
            assert line in after  # the plugin's and the Operator's specs, byte for byte
    assert "/var/run/cdi/ponytail.yaml" in after and "/var/run/cdi/nvidia.yaml" not in after
    # a pod of the plugin's names starts, its hooks run by ponytail's hook script at /usr/bin/nvidia-ctk: libcuda loads
    out = node.check(pod)
    assert "cuDriverGetVersion 12040" in out and "ENXIO" in out, out

    node.poweroff()
    node.boot()
    # ponytail's spec is written again at boot, before the engines
    assert node.check("systemctl is-active ponytail-cdi-spec.service").strip() == "active"
    spec_at = int(node.check("systemctl show ponytail-cdi-spec.service -p ActiveEnterTimestampMonotonic --value"))
    for engine in ("containerd", "docker"):
        started = int(node.check(f"systemctl show {engine}.service -p ExecMainStartTimestampMonotonic --value"))
        assert spec_at <= started, engine
    node.check(f"cp {captured}/plugin.yaml /var/run/cdi/k8s.device-plugin.nvidia.com-gpu.yaml")  # the plugin writes its spec again
    out = node.check(pod)
    assert "cuDriverGetVersion 12040" in out and "ENXIO" in out, out

    undone = node.run("ponytail migrate --from nvidia --undo")
    assert undone.returncode == 0, undone.stderr
    node.check(f"cp {captured}/management.yaml /var/run/cdi/management.nvidia.com-gpu.yaml")  # the Operator's, again after the boot
    assert node.check(snapshot) == before


@dataclass
class NodeContainerd:
    """The node's own containerd as support.containerd_cri.Pods sees it: its CRI socket reached from here
    through the node's root (/proc/PID/root), pod logs under ``state`` (bound into the node at the same path)."""

    socket: str
    state: Path
    cgroup_parent: str


# The node's containerd as an operator sets it up for kubelet: runc's systemd cgroup driver (kubelet's
# cgroupDriver: systemd), restrict_oom_score_adj, the pause image imported locally (no registry reachable), the
# native snapshotter (overlayfs is refused over the node's overlay root, as for podman). And, a stand-in's
# choice: disable_cgroup = true. containerd's CRI gives every sandbox CPU shares (no setting but this one turns
# that off), and this machine's cpu controller is bound to cgroup v1, so the node's cgroup2 tree has none: runc
# fails writing cpu.weight. With it containerd 1.6 sends no resources and no cgroup path; runc's systemd driver
# still makes each container a systemd scope (runc-ID.scope in system.slice) with the spec's device rules as its
# DeviceAllow=, and the node's systemd enforces them: the reload check stays a real one. Only CPU and memory
# limits, and the pod's cgroup parent, are left out.
CONTAINERD_CONFIG = r"""
    containerd config default >/etc/containerd/config.toml
    sed -Ei -e 's/SystemdCgroup = false/SystemdCgroup = true/' \
        -e 's/^(\s*sandbox_image = ).*/\1"localhost\/pause:1"/' \
        -e 's/^(\s*snapshotter = )"overlayfs"/\1"native"/' \
        -e 's/restrict_oom_score_adj = false/restrict_oom_score_adj = true/' \
        -e 's/disable_cgroup = false/disable_cgroup = true/' /etc/containerd/config.toml
    test "$(grep -cE 'SystemdCgroup = true|localhost/pause:1|"native"|restrict_oom_score_adj = true|disable_cgroup = true' /etc/containerd/config.toml)" = 5
    """
NO_CRI_ON_SID = ("containerd 2.1 has no disable_cgroup (it ignores the key as unknown) and its CRI sets CPU shares on "
                 "every sandbox; the node's cgroup2 tree has no cpu controller (bound to cgroup v1 on this machine), "
                 "so runc fails writing cpu.weight")


def _node_pods(node: BootedNode, state: Path) -> Pods:
    """A CRI client of the node's containerd: host-network pods, no CPU or memory resources asked."""
    daemon = NodeContainerd(f"/proc/{node.leader}/root/run/containerd/containerd.sock", state, "")
    return Pods(daemon, "localhost/pause:1", state / "stubs")  # type: ignore[arg-type]


def _task_pid(cid: str) -> str:
    return f"ctr -n k8s.io task ls | awk '$1 == \"{cid}\" {{print $2}}'"


def _cri_gpus(node: BootedNode, cid: str) -> dict[str, str]:
    """_gpus in a CRI container, cudacheck's output through a file in it (ctr task exec at times drops its output)."""
    exec_id = f"check-{time.monotonic_ns()}"
    out = node.check(f"""
        ctr -n k8s.io task exec --exec-id {exec_id} {cid} /bin/sh -c '{CUDACHECK} /dev/nvidia0 /dev/nvidia1 >/tmp/cudacheck 2>&1'
        cat /proc/$({_task_pid(cid)})/root/tmp/cudacheck
        """)
    assert "cuDriverGetVersion 12040" in out, out
    return dict(GPU.findall(out))


def _start_cri_pods(node: BootedNode, pods: Pods) -> dict[str, tuple[str, str]]:
    """A GPU pod on each of containerd 1.6's routes (no CDI there): {route: (container id, its systemd scope)}."""
    routes: dict[str, dict] = {
        "shim (handler ponytail, NVIDIA_VISIBLE_DEVICES)": {"env": {"NVIDIA_VISIBLE_DEVICES": "0"}, "runtime_handler": "ponytail"},
        "shim (handler ponytail, the device plugin's list)": {
            "mounts": [("/dev/null", "/var/run/nvidia-container-devices/0")], "runtime_handler": "ponytail"},
    }
    started = {}
    for route, request in routes.items():
        cid, _ = pods.create(["/bin/sleep", "100000"], **request)
        pods.start(cid)
        started[route] = (cid, _scope(node, _task_pid(cid)))
    return started


def test_cri_pods_daemon_reload_and_reboot(node: BootedNode, fake: Path, debs: dict[str, Path], suite: str) -> None:
    """GPU pods started through containerd's CRI in the node (the project's CRI client, as kubelet calls it) keep
    exactly their GPU across daemon-reloads; after a reboot new ones get it again."""
    if suite != "bookworm":
        pytest.skip(NO_CRI_ON_SID)
    _install(node, fake, debs["new"])
    state = fake / f"cri-{node.name}"
    state.mkdir()
    image = oci_archive(fake / "rootfs", "localhost/pause:1", ["/bin/sleep", "100000"], state / "image.tar")
    node.check(CONTAINERD_CONFIG)
    node.check("ponytail configure --runtime containerd && systemctl restart containerd")
    node.check(f"ctr -n k8s.io images import --snapshotter native {image}")
    only_gpu0 = {"/dev/nvidia0": "ENXIO", "/dev/nvidia1": "ENOENT"}
    pods = _node_pods(node, state)
    try:
        assert "containerd 1.6" in pods.version()
        started = _start_cri_pods(node, pods)
        for route, (cid, unit) in started.items():
            assert _cri_gpus(node, cid) == only_gpu0, route
            allowed = _device_allow(node, unit)
            assert re.search(r"DeviceAllow=/dev/(nvidia0|char/195:0) rw", allowed), (route, allowed)
            assert "195:1" not in allowed and "nvidia1 " not in allowed, (route, allowed)
        for _ in range(2):
            node.check("systemctl daemon-reload")
            time.sleep(0.5)
            for route, (cid, unit) in started.items():
                assert _cri_gpus(node, cid) == only_gpu0, f"{route} after daemon-reload"
                assert re.search(r"DeviceAllow=/dev/(nvidia0|char/195:0) rw", _device_allow(node, unit)), route
        # the node's systemd enforces the scopes' device rules: emptied, the list takes the GPU away; the guard gives it back
        cid, unit = next(iter(started.values()))
        node.check(f"systemctl set-property --runtime {unit} DeviceAllow=")
        assert _cri_gpus(node, cid)["/dev/nvidia0"] == "EPERM"
        repaired = node.run("ponytail guard --once")
        assert repaired.returncode == 1 and "given back (only those)" in repaired.stdout, repaired.stdout + repaired.stderr
        assert _cri_gpus(node, cid) == only_gpu0
    finally:
        pods.close()

    node.poweroff()
    node.boot()
    pods = _node_pods(node, state)  # the node's containerd again, its GPU pods started anew as kubelet would
    try:
        for route, (cid, _unit) in _start_cri_pods(node, pods).items():
            assert _cri_gpus(node, cid) == only_gpu0, f"{route} after the reboot"
    finally:
        pods.close()
    well = node.run("ponytail guard --once")
    assert well.returncode == 0, well.stdout + well.stderr



def test_a_driver_upgrade_is_reported(node: BootedNode, fake: Path, debs: dict[str, Path], suite: str) -> None:
    """Last in this module: it swaps the fake driver that the other tests share."""
    _install(node, fake, debs["new"])
    node.check("ponytail configure --runtime docker && systemctl restart docker")
    cid = node.check("docker run -d --network none --runtime ponytail -e NVIDIA_VISIBLE_DEVICES=0 gpuimg /usr/local/bin/cudahold").strip()
    time.sleep(1)
    assert node.run("ponytail guard --once").returncode == 0
    version = fake / "host/proc/driver/nvidia/version"
    was = version.read_text()
    old = next(word for word in was.split() if word.count(".") == 2)
    try:
        # the package manager's way: a new version in /proc, the old libcuda deleted and a new file in its place
        node.check(f"""
            sed -i 's/{old}/570.86.10/' {version}
            lib=$(find {fake}/host/driver -name 'libcuda.so.{old}' | head -1)
            cp "$lib" "$lib.new" && mv "$lib.new" "$lib"
            """)
        found = node.run("ponytail guard --once --report-only")
        assert found.returncode == 1, found.stdout + found.stderr
        line = next(x for x in found.stdout.splitlines() if cid[:12] in x)
        assert f"given driver {old}, 570.86.10 runs now" in line, line
    finally:
        version.write_text(was)  # the fake driver as the other tests know it
