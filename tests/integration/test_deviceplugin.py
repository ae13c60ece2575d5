"""Kubernetes' device plugin names a container's GPUs in volume mounts under
/var/run/nvidia-container-devices/ or in CDI annotations; with
`[request] accept_env_when_unprivileged = false` an unprivileged container's own
NVIDIA_VISIBLE_DEVICES selects nothing. The hook's dry run shows what it would inject."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ponytail.container.oci import read_spec
from ponytail.hooks.shim.edit import spec_asks_for_gpus

from support.fakehost import FakeHost
from support.harness import bundle_for, run_ponytail, state_for

DEVICES = "/var/run/nvidia-container-devices"
STRICT = "[request]\naccept_env_when_unprivileged = false\n"
STRICT_CONTAINERD = STRICT + 'cri = "containerd"\n'  # CDI annotations are believed only where the CRI is known
ALL_CAPS = ["CAP_CHOWN", "CAP_SYS_ADMIN", "CAP_NET_ADMIN"]


def spec_with(bundle: Path, mounts: list | None = None, annotations: dict | None = None, privileged: bool = False) -> None:
    spec = json.loads((bundle / "config.json").read_text())
    if mounts is not None:
        spec["mounts"] = mounts
    if annotations is not None:
        spec["annotations"] = annotations
    caps = ALL_CAPS if privileged else ["CAP_CHOWN", "CAP_NET_BIND_SERVICE"]
    spec["process"]["capabilities"] = {"bounding": caps, "effective": caps, "permitted": caps}
    (bundle / "config.json").write_text(json.dumps(spec))


def device_mount(name: str, source: str = "/dev/null") -> dict:
    return {"destination": f"{DEVICES}/{name}", "source": source, "type": "bind", "options": ["rbind", "ro"]}


def dry_run(host: FakeHost, bundle: Path, config_extra: str = "") -> str:
    config = host.base / "config.toml"
    config.write_text(host.config_text() + config_extra)
    result = run_ponytail(["-config", str(config), "-debug"], stdin=state_for(bundle, 1))
    assert result.returncode == 0, result.stderr
    return result.stdout.decode()


def selected(output: str) -> str:
    """The dry run's header lines: which devices were asked for, and by whom."""
    return next(line for line in output.splitlines() if "devices requested" in line or "not a GPU container" in line)


def test_volume_mounts_name_the_gpus(host: FakeHost, tmp_path: Path, rootfs: Path) -> None:
    bundle = bundle_for(tmp_path, rootfs, env=[f"NVIDIA_VISIBLE_DEVICES={DEVICES}"])
    spec_with(bundle, mounts=[device_mount(host.gpu_list[1].uuid), device_mount("2")])
    output = dry_run(host, bundle, STRICT)
    assert f"devices requested: '{host.gpu_list[1].uuid},2' (from volume mounts under {DEVICES})" in output
    assert "2 selected" in output
    marked = [line.split()[2] for line in output.splitlines() if line.strip().startswith("* gpu")]
    assert marked == ["1", "2"], output


def test_a_pods_own_volume_there_is_not_a_device_list(host: FakeHost, tmp_path: Path, rootfs: Path) -> None:
    """Only the device plugin's /dev/null mounts count: an emptyDir or other volume a pod
    mounts at the same place is ignored, and the strict policy then gives nothing."""
    bundle = bundle_for(tmp_path, rootfs, env=[f"NVIDIA_VISIBLE_DEVICES={DEVICES}"])
    spec_with(bundle, mounts=[device_mount("all", source="/var/lib/kubelet/pods/x/volumes/empty")])
    assert "not a GPU container" in selected(dry_run(host, bundle, STRICT))
    # the device plugin's directory as the env value, with no mounts, asks for nothing either
    assert "not a GPU container" in selected(dry_run(host, bundle))


def test_cdi_annotations_name_the_gpus(host: FakeHost, tmp_path: Path, rootfs: Path) -> None:
    bundle = bundle_for(tmp_path, rootfs, env=["NVIDIA_VISIBLE_DEVICES=all"])
    spec_with(bundle, annotations={
        "cdi.k8s.io/nvidia-device-plugin_abc": "nvidia.com/gpu=1",
        "cdi.k8s.io/other": "vendor.com/net=eth1",
        "io.kubernetes.cri.container-type": "container",
    })
    output = dry_run(host, bundle, STRICT_CONTAINERD)
    assert "devices requested: '1' (from CDI annotations (cdi.k8s.io/*))" in output and "1 selected" in output


def test_strict_policy_refuses_an_unprivileged_containers_env(host: FakeHost, tmp_path: Path, rootfs: Path) -> None:
    bundle = bundle_for(tmp_path, rootfs, env=["NVIDIA_VISIBLE_DEVICES=all"])
    spec_with(bundle)
    line = selected(dry_run(host, bundle, STRICT))
    assert "not a GPU container" in line and "refused: unprivileged container" in line, line
    # the default policy (NVIDIA's default too) accepts it
    assert "devices requested: 'all' (from NVIDIA_VISIBLE_DEVICES)" in dry_run(host, bundle)
    # and a privileged container's env is always accepted
    spec_with(bundle, privileged=True)
    assert "devices requested: 'all' (from NVIDIA_VISIBLE_DEVICES)" in dry_run(host, bundle, STRICT)


def test_shim_asks_only_for_what_the_policy_lets_through() -> None:
    unprivileged = {"process": {"env": ["NVIDIA_VISIBLE_DEVICES=all"], "capabilities": {"bounding": ["CAP_CHOWN"]}}}
    assert spec_asks_for_gpus(read_spec(unprivileged, "config.json")) is True
    assert spec_asks_for_gpus(read_spec(unprivileged, "config.json"), accept_env_when_unprivileged=False) is False
    privileged = {"process": {"env": ["NVIDIA_VISIBLE_DEVICES=all"], "capabilities": {"bounding": ["CAP_SYS_ADMIN"]}}}
    assert spec_asks_for_gpus(read_spec(privileged, "config.json"), accept_env_when_unprivileged=False) is True
    listed = {"process": {"env": []}, "mounts": [device_mount("0")]}
    assert spec_asks_for_gpus(read_spec(listed, "config.json"), accept_env_when_unprivileged=False) is True
    annotated = {"process": {"env": []}, "annotations": {"cdi.k8s.io/x": "nvidia.com/gpu=0"}}
    assert spec_asks_for_gpus(read_spec(annotated, "config.json"), accept_env_when_unprivileged=False) is True
    for plain in ({"process": {"env": ["PATH=/bin"]}}, {"process": {"env": [f"NVIDIA_VISIBLE_DEVICES={DEVICES}"]}}):
        assert spec_asks_for_gpus(read_spec(plain, "config.json")) is False


def test_policy_must_be_a_boolean(host: FakeHost, tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text('[request]\naccept_env_when_unprivileged = "no"\n')
    result = run_ponytail(["-config", str(config), "-debug"])
    assert result.returncode == 2
    assert b"'request.accept_env_when_unprivileged' must be true or false, not str" in result.stderr


def test_the_device_plugins_own_cdi_kind_names_the_gpus(host: FakeHost, tmp_path: Path, rootfs: Path) -> None:
    """NVIDIA's device plugin names its CDI devices k8s.device-plugin.nvidia.com/gpu=<UUID> (and
    /mig): the same meaning as nvidia.com/gpu, also under the strict policy."""
    bundle = bundle_for(tmp_path, rootfs, env=["NVIDIA_VISIBLE_DEVICES=all"])
    uuid = host.gpu_list[1].uuid
    spec_with(bundle, annotations={"cdi.k8s.io/k8s-device-plugin_abc": f"k8s.device-plugin.nvidia.com/gpu={uuid}"})
    output = dry_run(host, bundle, STRICT_CONTAINERD)
    assert f"devices requested: '{uuid}' (from CDI annotations (cdi.k8s.io/*))" in output and "1 selected" in output
    spec_with(bundle, annotations={"cdi.k8s.io/k8s-device-plugin_abc": "k8s.device-plugin.nvidia.com/mig=MIG-0000,vendor.com/x=1"})
    (host.base / "config.toml").write_text(host.config_text() + STRICT_CONTAINERD)
    asked = run_ponytail(["-config", str(host.base / "config.toml"), "-debug"], stdin=state_for(bundle, 1))
    assert b"unknown MIG device 'MIG-0000' in CDI annotations (cdi.k8s.io/*)" in asked.stderr  # asked for, and this host has none
    spec_with(bundle, annotations={"cdi.k8s.io/other": "k8s.device-plugin.example.com/gpu=1"})  # another vendor's kind
    assert "not a GPU container" in selected(dry_run(host, bundle, STRICT_CONTAINERD))


CONTAINERD_NAMESPACE = "io.kubernetes.cri.sandbox-namespace"
CRIO_NAMESPACE = "io.kubernetes.pod.namespace"
MANAGED = STRICT + 'env_namespaces = ["gpu-operator", "nvidia-dp"]\n'


@pytest.mark.parametrize(("cri", "key", "other"), [("containerd", CONTAINERD_NAMESPACE, CRIO_NAMESPACE), ("cri-o", CRIO_NAMESPACE, CONTAINERD_NAMESPACE)])
def test_management_pods_of_the_named_namespaces_are_believed(host: FakeHost, tmp_path: Path, rootfs: Path, cri: str, key: str, other: str) -> None:
    """[request] env_namespaces: the device plugin, dcgm-exporter and GPU feature discovery need
    every GPU without asking the scheduler. The namespace is read only from the configured CRI
    implementation's own annotation: the other engine's key is one a pod can bring."""
    bundle = bundle_for(tmp_path, rootfs, env=["NVIDIA_VISIBLE_DEVICES=all"])
    config = MANAGED + f'cri = "{cri}"\n'
    spec_with(bundle, annotations={key: "gpu-operator"})
    assert "devices requested: 'all' (from NVIDIA_VISIBLE_DEVICES)" in dry_run(host, bundle, config)
    assert "NVIDIA_VISIBLE_DEVICES believed: the pod's namespace 'gpu-operator' is one of [request] env_namespaces" in host.log.read_text()
    for brought in ({key: "default"}, {other: "gpu-operator"}, {key: "gpu-operator-x"}, {}):
        spec_with(bundle, annotations=brought)
        line = selected(dry_run(host, bundle, config))
        assert "not a GPU container" in line and "refused: unprivileged container" in line, (brought, line)
    # without env_namespaces the namespace changes nothing
    spec_with(bundle, annotations={key: "gpu-operator"})
    assert "not a GPU container" in selected(dry_run(host, bundle, STRICT + f'cri = "{cri}"\n'))
    # the shim asks for the same
    listed = {"process": {"env": ["NVIDIA_VISIBLE_DEVICES=all"]}, "annotations": {key: "gpu-operator"}}
    from ponytail.config import parse_config
    from ponytail.container.deviceplugin import accepts_env

    parsed = parse_config(config.encode(), "config.toml")
    assert spec_asks_for_gpus(read_spec(listed, "config.json"), accepts_env(parsed, listed["annotations"])) is True
    assert accepts_env(parsed, {other: "gpu-operator"}) is False


def test_cdi_annotations_the_engine_resolved_are_not_injected_again(host: FakeHost, tmp_path: Path, rootfs: Path) -> None:
    """An engine with CDI on (containerd 2.x, CRI-O) has put the annotations' devices in linux.devices
    and run the spec's hook: the hook (and ponytail-runtime) then inject nothing over them; a volume-mount
    list still counts. A privileged container has every host node in linux.devices: only a GPU CDI spec's
    hook says CDI was applied there."""
    bundle = bundle_for(tmp_path, rootfs, env=["NVIDIA_VISIBLE_DEVICES=void"])
    spec_with(bundle, annotations={"cdi.k8s.io/nvidia-device-plugin_abc": "nvidia.com/gpu=0"})
    spec = json.loads((bundle / "config.json").read_text())
    spec["linux"]["devices"] = [{"path": "/dev/nvidia2", "type": "c", "major": 195, "minor": 2},
                                {"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255}]
    (bundle / "config.json").write_text(json.dumps(spec))
    line = selected(dry_run(host, bundle, STRICT_CONTAINERD))
    assert "not a GPU container" in line and "already resolved by the engine's CDI" in line, line
    assert spec_asks_for_gpus(read_spec(spec, "config.json"), accept_env_when_unprivileged=False) is False
    listed = {**spec, "mounts": [device_mount("1")]}
    assert spec_asks_for_gpus(read_spec(listed, "config.json"), accept_env_when_unprivileged=False) is True
    # privileged: the host's nodes are all there whatever was asked; the annotations still select
    spec_with(bundle, privileged=True)
    assert "devices requested: '0' (from CDI annotations (cdi.k8s.io/*))" in dry_run(host, bundle, STRICT)
    # ... unless a GPU CDI spec's hook (ponytail's cdi-hook, NVIDIA's nvidia-cdi-hook) ran: CDI did it
    for hook in ({"path": "/usr/local/bin/ponytail", "args": ["ponytail", "cdi-hook", "--ldconfig", "/sbin/ldconfig"]},
                 {"path": "/usr/bin/nvidia-cdi-hook", "args": ["nvidia-cdi-hook", "update-ldcache"]}):
        spec = json.loads((bundle / "config.json").read_text())
        spec["hooks"] = {"createContainer": [hook]}
        (bundle / "config.json").write_text(json.dumps(spec))
        assert "already resolved by the engine's CDI" in selected(dry_run(host, bundle, STRICT_CONTAINERD)), hook
