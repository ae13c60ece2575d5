"""Multi-node training's opt-in features: IMEX channels (NVIDIA_IMEX_CHANNELS), GPUDirect Storage
(NVIDIA_GDS), InfiniBand (NVIDIA_MOFED), GDRCopy (NVIDIA_GDRCOPY), NVSwitch (NVIDIA_NVSWITCH).
Each is injected only when asked (by env, by the device plugin's IMEX volume mounts or its CDI
annotations), as plan operations with their reasons and device rules; asked for but missing on
the host, the start fails with one line. Real runc starts for IMEX channels and GDS."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
import yaml
from test_shim import shim

from ponytail.capabilities import FeatureAsk
from ponytail.container.deviceplugin import plugin_features
from ponytail.container.request import build_request, requested_features
from ponytail.errors import InputError

from support.cdi_support import CdiPodman, generate
from support.engines import hook_entry, oci_bundle, run_bundle, unique
from support.fakehost import FakeHost, gpus, make_rootfs
from support.harness import bundle_for, run_ponytail, state_for

ALL_FABRICS = ("imex", "gds", "mofed", "gdrcopy", "nvswitch")
ASK_ALL = [
    "NVIDIA_IMEX_CHANNELS=all", "NVIDIA_GDS=enabled", "NVIDIA_MOFED=enabled", "NVIDIA_GDRCOPY=enabled", "NVIDIA_NVSWITCH=enabled",
]
# every node of each feature on the fake host (tests/support/fakehost.py FABRICS), with its rule
NODES = {
    "imex": ["nvidia-caps-imex-channels/channel0 (c 237:0", "nvidia-caps-imex-channels/channel2 (c 237:2"],
    "gds": [f"nvidia-fs{n} (c 241:{n}" for n in range(4)],
    "mofed": ["infiniband/uverbs0 (c 231:192", "infiniband/uverbs1 (c 231:193", "infiniband/rdma_cm (c 10:58"],
    "gdrcopy": ["gdrdrv (c 242:0"],
    "nvswitch": ["nvidia-nvswitchctl (c 240:255", "nvidia-nvswitch0 (c 240:0", "nvidia-nvswitch1 (c 240:1"],
}


def dry_run(host: FakeHost, tmp_path: Path, env: list[str], name: str = "bundle") -> tuple[int, str, str]:
    """-debug of a hook run for a container with ``env``: (exit status, stdout, stderr)."""
    (tmp_path / "rootfs").mkdir(exist_ok=True)
    bundle = bundle_for(tmp_path, tmp_path / "rootfs", env=["PATH=/bin", *env], name=name)
    result = run_ponytail(["-config", str(host.write_config()), "-debug"], stdin=state_for(bundle, os.getpid()))
    return result.returncode, result.stdout.decode(), result.stderr.decode()


@pytest.fixture(scope="module")
def fabric_host(tmp_path_factory: pytest.TempPathFactory) -> FakeHost:
    return FakeHost(tmp_path_factory.mktemp("fabrics"), gpu_list=gpus(1), fabrics=ALL_FABRICS)


def test_each_feature_is_injected_when_asked_with_its_reason_and_device_rule(fabric_host: FakeHost, tmp_path: Path) -> None:
    status, out, err = dry_run(fabric_host, tmp_path, ASK_ALL)
    assert status == 0 and "problem" not in out, out + err
    lines = out.splitlines()
    for fabric, nodes in NODES.items():
        for node in nodes:
            mount = next((line for line in lines if f"-> /dev/{node}" in line.replace("  (", " (")), None)
            assert mount is not None, f"{fabric}: {node} not planned:\n{out}"
            rule = node.split("(c ")[1]
            assert f"c {rule} rw" in out, f"{fabric}: no device rule for {rule}"
    assert "NVIDIA_GDS=enabled: GPUDirect Storage" in out and "NVIDIA_IMEX_CHANNELS=all: IMEX channel" in out
    assert "-> /etc/cufile.json" in out and "-> /run/udev/data " in out  # what cuFile reads besides its nodes
    assert "-> /run/udev " not in out  # never udevd's directory, with its control socket


def test_nothing_of_them_is_injected_when_not_asked(fabric_host: FakeHost, tmp_path: Path) -> None:
    for i, env in enumerate(([], ["NVIDIA_IMEX_CHANNELS="], ["NVIDIA_IMEX_CHANNELS=none", "NVIDIA_GDS=disabled"])):
        status, out, err = dry_run(fabric_host, tmp_path, env, name=f"b{i}")
        assert status == 0, err
        for word in ("imex-channels", "nvidia-fs", "infiniband", "gdrdrv", "nvswitch", "cufile", "/run/udev"):
            assert word not in out, (env, word)


def test_a_list_of_imex_channels_gives_exactly_those(fabric_host: FakeHost, tmp_path: Path) -> None:
    status, out, _ = dry_run(fabric_host, tmp_path, ["NVIDIA_IMEX_CHANNELS=2, 0"])
    assert status == 0
    assert "channel0 (c 237:0" in out.replace("  (", " (") and "channel2 (c 237:2" in out.replace("  (", " (")
    assert "channel1" not in out


def test_an_unknown_imex_channel_fails_the_start_with_one_line(fabric_host: FakeHost, tmp_path: Path, sleeper) -> None:
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    bundle = bundle_for(tmp_path, rootfs, env=["NVIDIA_IMEX_CHANNELS=0,7"])
    result = run_ponytail(["-config", str(fabric_host.write_config())], stdin=state_for(bundle, sleeper.pid))
    lines = result.stderr.decode().splitlines()
    assert result.returncode == 1 and len(lines) == 1, lines
    assert "NVIDIA_IMEX_CHANNELS=0,7: IMEX channel asked, but" in lines[0] and "channel7 does not exist" in lines[0], lines
    assert not (rootfs / "dev").exists() or not any((rootfs / "dev").iterdir())  # nothing half-done


@pytest.mark.parametrize("variable", ["NVIDIA_IMEX_CHANNELS=all", "NVIDIA_GDS=enabled", "NVIDIA_MOFED=enabled", "NVIDIA_GDRCOPY=enabled", "NVIDIA_NVSWITCH=enabled"])
def test_a_feature_asked_for_on_a_host_without_it_is_refused_clearly(shared_host: FakeHost, tmp_path: Path, variable: str, sleeper) -> None:
    """The default fake host has none of these modules or nodes: the start fails, one line."""
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    bundle = bundle_for(tmp_path, rootfs, env=[variable])
    result = run_ponytail(["-config", str(shared_host.write_config())], stdin=state_for(bundle, sleeper.pid))
    lines = result.stderr.decode().splitlines()
    assert result.returncode == 1 and len(lines) == 1, lines
    assert lines[0].startswith(f"ponytail: error: {variable}: ") and "asked, but no " in lines[0] and "/devices" in lines[0], lines


def test_a_missing_node_is_refused_even_when_the_module_is_loaded(tmp_path: Path) -> None:
    host = FakeHost(tmp_path / "host", gpu_list=gpus(1), fabrics=("gdrcopy",))
    (host.dev / "gdrdrv").unlink()
    status, out, _ = dry_run(host, tmp_path, ["NVIDIA_GDRCOPY=enabled"])
    assert status == 1 and "problem: NVIDIA_GDRCOPY=enabled: GDRCopy asked, but" in out and "gdrdrv does not exist" in out
    os.mknod(host.dev / "gdrdrv", 0o666 | 0o060000, os.makedev(242, 0))  # a block device of the right numbers
    status, out, _ = dry_run(host, tmp_path, ["NVIDIA_GDRCOPY=enabled"], name="again")
    assert "gdrdrv is not a character device" in out


def test_request_parsing_of_imex_channels_and_switches() -> None:
    assert requested_features({}) == ()
    assert requested_features({"NVIDIA_IMEX_CHANNELS": "all"}) == (("imex-channel", "all", "NVIDIA_IMEX_CHANNELS=all"),)
    assert requested_features({"NVIDIA_IMEX_CHANNELS": " 3,1,3 "})[0][1] == "3,1"
    assert requested_features({"NVIDIA_IMEX_CHANNELS": "0"})[0][1] == "0"  # channel 0, not "off"
    for empty in ("", " ", "none", "void"):
        assert requested_features({"NVIDIA_IMEX_CHANNELS": empty}) == ()
    assert [f for f, _, _ in requested_features({"NVIDIA_GDS": "enabled", "NVIDIA_MOFED": "Enabled", "NVIDIA_NVSWITCH": "off"})] == ["gds", "mofed"]
    env = {"NVIDIA_GDS": "enabled", "NVIDIA_IMEX_CHANNELS": "all", "NVIDIA_VISIBLE_DEVICES": "0"}
    assert build_request(env=env, privileged=False, accept_env_when_unprivileged=False).features == ()  # env refused: no opt-ins either
    plugin = (FeatureAsk("imex-channel", "2", "volume mounts under /var/run/nvidia-container-devices/imex"),)
    assert build_request(env=env, privileged=False, accept_env_when_unprivileged=False, plugin_features=plugin).features == plugin  # the device plugin's still count
    for bad in ("x", "1,-2", "GPU-0", "1" * 12):
        with pytest.raises(InputError, match="is not an IMEX channel number"):
            requested_features({"NVIDIA_IMEX_CHANNELS": bad})


def test_the_device_plugin_hands_over_imex_channels_and_features() -> None:
    mounts = [
        {"destination": "/var/run/nvidia-container-devices/imex/3", "source": "/dev/null"},
        {"destination": "/var/run/nvidia-container-devices/imex/1", "source": "/dev/null"},
        {"destination": "/var/run/nvidia-container-devices/imex/9", "source": "/home/pod/own"},  # not the plugin's
        {"destination": "/var/run/nvidia-container-devices/GPU-1", "source": "/dev/null"},
    ]
    annotations = {"cdi.k8s.io/a": "nvidia.com/gpu=0,nvidia.com/gds=all", "cdi.k8s.io/b": "nvidia.com/mofed=all", "other": "nvidia.com/gdrcopy=all"}
    found = plugin_features(mounts, annotations)
    assert found == (
        ("imex-channel", "3,1", "volume mounts under /var/run/nvidia-container-devices/imex"),
        ("gds", "all", "CDI annotations (cdi.k8s.io/*)"),
        ("mofed", "all", "CDI annotations (cdi.k8s.io/*)"),
    )
    assert plugin_features([], {"cdi.k8s.io/x": "nvidia.com/imex-channel=0,nvidia.com/imex-channel=2"}) == (
        ("imex-channel", "0,2", "CDI annotations (cdi.k8s.io/*)"),
    )


@pytest.mark.parametrize("runtime", ["runc", "runc-v2"])  # device rules in cgroup v1, then as eBPF programs (v2)
def test_runc_starts_a_container_with_the_imex_channels_it_asked_for(fabric_host: FakeHost, tmp_path: Path, runtime: str) -> None:
    hooks = {"prestart": [hook_entry(fabric_host.write_config())]}
    nodes = [f"/dev/nvidia-caps-imex-channels/channel{n}" for n in (0, 1, 2)]
    bundle = oci_bundle(tmp_path, ["/usr/local/bin/cudacheck", *nodes], env=["NVIDIA_IMEX_CHANNELS=1,2"], hooks=hooks)
    container_id = unique()
    result = run_bundle(runtime, bundle, container_id)
    assert result.returncode == 0, result.stderr
    # ENXIO: there and allowed by the device cgroup (no driver behind the fake major); channel 0 was not asked
    assert result.stdout.splitlines()[1:] == [f"open {nodes[0]} ENOENT", f"open {nodes[1]} ENXIO", f"open {nodes[2]} ENXIO"], result.stdout
    allowed = [line for line in fabric_host.log.read_text().splitlines() if f"container={container_id} allowed " in line]
    assert len(allowed) == 1 and "c 237:1 rw, c 237:2 rw" in allowed[0] and "c 237:0" not in allowed[0], allowed


def test_runc_refuses_a_container_asking_for_an_imex_channel_the_host_lacks(fabric_host: FakeHost, tmp_path: Path) -> None:
    hooks = {"prestart": [hook_entry(fabric_host.write_config())]}
    bundle = oci_bundle(tmp_path, ["/usr/local/bin/cudacheck"], env=["NVIDIA_IMEX_CHANNELS=5"], hooks=hooks)
    result = run_bundle("runc", bundle)
    assert result.returncode != 0 and "cuDriverGetVersion" not in result.stdout
    assert "ponytail: error: NVIDIA_IMEX_CHANNELS=5: IMEX channel asked, but" in result.stderr, result.stderr


def test_runc_starts_a_container_with_gpudirect_storage(fabric_host: FakeHost, tmp_path: Path) -> None:
    hooks = {"prestart": [hook_entry(fabric_host.write_config())]}
    script = "/usr/local/bin/cudacheck /dev/nvidia-fs0 /dev/nvidia-fs3 /dev/gdrdrv; cat /etc/cufile.json; ls /run/udev/data; ls /run/udev"
    bundle = oci_bundle(tmp_path, ["/bin/sh", "-c", script], env=["NVIDIA_GDS=enabled"], hooks=hooks)
    result = run_bundle("runc", bundle)
    assert result.returncode == 0, result.stderr
    out = result.stdout.splitlines()
    assert out[1:4] == ["open /dev/nvidia-fs0 ENXIO", "open /dev/nvidia-fs3 ENXIO", "open /dev/gdrdrv ENOENT"], out
    assert out[4:] == ['{"logging": {"level": "ERROR"}}', "c241:0", "data"], out  # udevd's control socket stays out


def test_gds_is_refused_when_the_udev_database_holds_a_socket(tmp_path: Path) -> None:
    """A directory a feature mounts holds data only: a socket or FIFO in it (a host daemon's
    channel) stops the start with one line instead of reaching the container."""
    host = FakeHost(tmp_path / "host", gpu_list=gpus(1), fabrics=("gds",))
    planted = host.ipc / "run/udev/data/sub/listening"
    planted.parent.mkdir()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind(str(planted))
        status, out, err = dry_run(host, tmp_path, ["NVIDIA_GDS=enabled"])
    assert status == 1, out + err
    assert f"NVIDIA_GDS=enabled: GPUDirect Storage asked, but {host.ipc}/run/udev/data holds the socket {planted}" in out, out
    (tmp_path / "rootfs").mkdir(exist_ok=True)
    bundle = bundle_for(tmp_path, tmp_path / "rootfs", env=["NVIDIA_GDS=enabled"], name="real")
    result = run_ponytail(["-config", str(host.write_config())], stdin=state_for(bundle, os.getpid()))
    err = result.stderr.decode()
    assert result.returncode == 1 and len(err.strip().splitlines()) == 1 and f"holds the socket {planted}" in err, err
    planted.unlink()
    os.mkfifo(planted)
    status, out, err = dry_run(host, tmp_path, ["NVIDIA_GDS=enabled"], name="fifo")
    assert status == 1 and f"holds the FIFO {planted}" in out, out + err


def test_cdi_generate_writes_each_feature_the_host_has_as_a_kind_of_its_own(fabric_host: FakeHost, tmp_path: Path) -> None:
    generate(fabric_host, tmp_path / "nvidia.yaml")
    kinds = {}
    for feature in ("imex-channel", "gds", "mofed", "gdrcopy", "nvswitch"):
        spec = yaml.safe_load((tmp_path / f"nvidia-{feature}.yaml").read_text())
        assert spec["kind"] == f"nvidia.com/{feature}"
        kinds[feature] = {d["name"]: d["containerEdits"] for d in spec["devices"]}
    assert list(kinds["imex-channel"]) == ["0", "1", "2", "all"]
    assert [n["path"] for n in kinds["imex-channel"]["1"]["deviceNodes"]] == ["/dev/nvidia-caps-imex-channels/channel1"]
    gds = kinds["gds"]["all"]
    assert [(n["path"], n["major"], n["minor"]) for n in gds["deviceNodes"]] == [(f"/dev/nvidia-fs{n}", 241, n) for n in range(4)]
    assert [(m["containerPath"], "ro" in m["options"]) for m in gds["mounts"]] == [("/etc/cufile.json", True), ("/run/udev/data", True)]
    assert list(kinds["mofed"]) == ["all"] and len(kinds["mofed"]["all"]["deviceNodes"]) == 3
    listed = run_ponytail(["cdi", "list", "-config", str(fabric_host.write_config())]).stdout.decode().splitlines()
    assert "nvidia.com/gpu=0" in listed and "nvidia.com/imex-channel=2" in listed and "nvidia.com/gds=all" in listed, listed


def test_cdi_generate_offers_no_feature_the_host_lacks_and_removes_its_old_spec(shared_host: FakeHost, tmp_path: Path) -> None:
    (tmp_path / "nvidia-gds.yaml").write_text("kind: nvidia.com/gds\n")  # from before nvidia-fs was unloaded
    generate(shared_host, tmp_path / "nvidia.yaml")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nvidia.yaml"]


def test_podman_gives_a_container_the_cdi_devices_of_imex_channels_and_gds(fabric_host: FakeHost, tmp_path: Path) -> None:
    generate(fabric_host, tmp_path / "nvidia.yaml")
    podman = CdiPodman(tmp_path / "nvidia.yaml", tmp_path / "no-hooks", [tmp_path / "nvidia-imex-channel.yaml", tmp_path / "nvidia-gds.yaml"])
    try:
        nodes = "/dev/nvidia-caps-imex-channels/channel0 /dev/nvidia-caps-imex-channels/channel1 /dev/nvidia-fs2 /dev/gdrdrv"
        rootfs = make_rootfs(tmp_path / "rootfs")
        result = podman.run(rootfs, ["sh", "-c", f"/usr/local/bin/cudacheck {nodes}; cat /etc/cufile.json"],
                            devices=["nvidia.com/gpu=0", "nvidia.com/imex-channel=1", "nvidia.com/gds=all"])
    finally:
        podman.close()
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "cuDriverGetVersion 12040", "open /dev/nvidia-caps-imex-channels/channel0 ENOENT",
        "open /dev/nvidia-caps-imex-channels/channel1 ENXIO", "open /dev/nvidia-fs2 ENXIO", "open /dev/gdrdrv ENOENT",
        '{"logging": {"level": "ERROR"}}',
    ], result.stdout


def test_fabric_manager_and_imex_come_with_utility(fabric_host: FakeHost, tmp_path: Path) -> None:
    _, out, _ = dry_run(fabric_host, tmp_path, ["NVIDIA_DRIVER_CAPABILITIES=utility"])
    assert "-> /usr/bin/nv-fabricmanager  (binary, utility" in out and "-> /usr/bin/nvidia-imex  (binary, utility" in out, out
    _, out, _ = dry_run(fabric_host, tmp_path, ["NVIDIA_DRIVER_CAPABILITIES=compute"], name="compute")
    assert "nv-fabricmanager" not in out.split("libraries, binaries and driver files:")[1]


@pytest.mark.parametrize("variable, daemon", [("NVIDIA_IMEX_CHANNELS=0", "nvidia-imex"), ("NVIDIA_NVSWITCH=enabled", "nv-fabricmanager")])
def test_a_fabric_daemon_of_another_driver_fails_the_start_with_one_line(tmp_path: Path, sleeper, variable: str, daemon: str) -> None:
    host = FakeHost(tmp_path / "host", gpu_list=gpus(1), fabrics=("imex", "nvswitch"))
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    bundle = bundle_for(tmp_path, rootfs, env=[variable])
    assert run_ponytail(["-config", str(host.write_config())], stdin=state_for(bundle, sleeper.pid)).returncode == 0
    host.install_fabric_daemons("535.104.05")  # the driver was upgraded, the daemons were not
    result = run_ponytail(["-config", str(host.write_config())], stdin=state_for(bundle, sleeper.pid))
    lines = result.stderr.decode().splitlines()
    assert result.returncode == 1 and len(lines) == 1, lines
    assert f"usr/bin/{daemon} is not of the running driver 550.54.15" in lines[0] and "error 802" in lines[0], lines
    (host.driver / "usr/bin" / daemon).unlink()  # not installed here (it runs in a container of its own): no check
    status, out, err = dry_run(host, tmp_path, [variable], name="daemon-elsewhere")
    assert status == 0 and "problem" not in out, out + err


def test_ponytail_runtime_allows_the_imex_channels_in_the_bundle_it_hands_to_runc(fabric_host: FakeHost, tmp_path: Path) -> None:
    """Docker's and containerd's path: ponytail-runtime writes the device rules of the plan into config.json."""
    bundle = oci_bundle(tmp_path, ["/usr/local/bin/cudacheck", "/dev/nvidia-caps-imex-channels/channel1"], env=["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_IMEX_CHANNELS=1"])
    container_id = unique()
    state, output = tmp_path / "runc-state", tmp_path / "out"
    created = shim(["--root", str(state), "create", "--bundle", str(bundle), container_id], fabric_host.write_config(), output=output)
    try:
        assert created.returncode == 0, output.read_text()
        rules = json.loads((bundle / "config.json").read_text())["linux"]["resources"]["devices"]
        assert {"allow": True, "type": "c", "major": 237, "minor": 1, "access": "rwm"}.items() <= next(
            r for r in rules if r.get("major") == 237).items(), rules
        assert [r for r in rules if r.get("major") == 237 and r.get("minor") != 1] == []
    finally:
        shim(["--root", str(state), "delete", "-f", container_id], fabric_host.write_config())


def listed(host: FakeHost, *args: str) -> tuple[int, list[str], str]:
    result = run_ponytail(["list", "-config", str(host.write_config()), *args])
    return result.returncode, result.stdout.decode().splitlines(), result.stderr.decode()


def test_list_shows_the_nodes_and_files_of_the_features_asked_for(fabric_host: FakeHost) -> None:
    """``ponytail list --feature``: each feature's nodes and files, as its variable would bring
    them; only those asked; an IMEX channel list gives exactly those channels."""
    status, paths, err = listed(fabric_host, "--feature", "imex-channel", "-feature", "gds", "--feature=mofed", "--feature", "gdrcopy=enabled",
                                "--feature", "nvswitch")
    assert status == 0, err
    dev = str(fabric_host.dev)
    for fabric, nodes in NODES.items():
        for node in nodes:
            assert f"{dev}/{node.split(' (')[0]}" in paths, (fabric, node, paths)
    assert str(fabric_host.driver / "etc/cufile.json") in paths and any(p.endswith("/run/udev/data") for p in paths), paths
    status, paths, err = listed(fabric_host, "--feature", "imex-channel=2")
    assert status == 0, err
    assert f"{dev}/nvidia-caps-imex-channels/channel2" in paths
    assert not any(word in p for p in paths for word in ("channel0", "channel1", "nvidia-fs", "infiniband", "gdrdrv", "nvswitch", "cufile"))
    status, paths, _ = listed(fabric_host)  # none asked: none listed
    assert status == 0 and not any(word in p for p in paths for word in ("imex-channels", "nvidia-fs", "infiniband", "gdrdrv", "nvswitch"))


@pytest.mark.parametrize("option, message", [
    ("infiniband", "unknown feature 'infiniband'; the features are imex-channel, gds, mofed, gdrcopy, nvswitch"),
    ("gds=0", "gds takes no selector"),
    ("imex-channel=", "name the IMEX channels"),
    ("imex-channel=x", "'x' is not an IMEX channel number"),
])
def test_list_refuses_a_feature_it_does_not_know_in_one_line(fabric_host: FakeHost, option: str, message: str) -> None:
    status, paths, err = listed(fabric_host, "--feature", option)
    assert status == 2 and paths == [] and len(err.splitlines()) == 1 and message in err, err


def test_list_refuses_a_feature_the_host_lacks_in_one_line(shared_host: FakeHost) -> None:
    status, paths, err = listed(shared_host, "--feature", "gds")
    assert status == 1 and paths == [] and len(err.splitlines()) == 1, err
    assert "NVIDIA_GDS=enabled: GPUDirect Storage asked, but" in err
