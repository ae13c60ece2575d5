"""A pod's own annotations never hand over GPUs. CRI-O copies every pod annotation into every container's
config.json, at top level, before the container's own annotations (which it also keeps, as JSON, in
io.kubernetes.cri-o.Annotations): a pod annotation `cdi.k8s.io/x: nvidia.com/gpu=all,...` is not the
device plugin's list. Real runc starts, through the prestart hook (CRI-O's hooks.d route, its gate
annotation set by the pod too) and through ponytail-runtime's bundle edit, with config.json as CRI-O
writes it and ponytail's strict cluster config (cri = "cri-o")."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from support.engines import EXPECTED_GPU0, TIMEOUT, console_script, hook_entry, oci_bundle, run_bundle, unique
from support.fakehost import FakeHost, gpus

HOST_SHAPE = {"gpu_list": gpus(3, minors=[2, 0, 1]), "fabrics": ("imex",)}
CHANNELS = [f"/dev/nvidia-caps-imex-channels/channel{n}" for n in (0, 1, 2)]
GPUS = ["/dev/nvidia2", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia0", "/dev/nvidia1"]
CUDACHECK = ["/usr/local/bin/cudacheck", *GPUS, *CHANNELS]
# what a pod author writes in metadata.annotations: every GPU and IMEX channel, and the hooks.d gate
HOSTILE = {"cdi.k8s.io/x": "nvidia.com/gpu=all,nvidia.com/imex-channel=all", "com.example.gpu": "true"}
# what the kubelet passes as the container's annotations: the device plugin's (GPU 0, IMEX channel 1) and its own
KUBELET = {"cdi.k8s.io/nvidia-device-plugin_abc": "nvidia.com/gpu=0", "cdi.k8s.io/imex": "nvidia.com/imex-channel=1",
           "io.kubernetes.container.hash": "5d1e", "io.kubernetes.container.restartCount": "0"}
LABELS = {"io.kubernetes.pod.name": "p", "io.kubernetes.pod.namespace": "default", "io.kubernetes.container.name": "c"}


def crio_annotations(pod: dict[str, str], container: dict[str, str]) -> dict[str, str]:
    """As CRI-O's SpecAddAnnotations writes them: the pod's, CRI-O's own, the container's as JSON and
    one by one, then the kubelet's container labels."""
    out = dict(pod)
    out.update({"io.kubernetes.cri-o.SandboxID": "f00", "io.kubernetes.cri-o.ContainerType": "container"})
    out["io.kubernetes.cri-o.Annotations"] = json.dumps(container)
    out.update(container)
    out.update(LABELS)
    return out


def cluster_config(host: FakeHost, tmp_path: Path) -> Path:
    config = tmp_path / "config.toml"
    config.write_text(host.config_text() + '[request]\naccept_env_when_unprivileged = false\ncri = "cri-o"\n')
    return config


def unprivileged(bundle: Path) -> None:
    spec = json.loads((bundle / "config.json").read_text())
    caps = ["CAP_CHOWN", "CAP_NET_BIND_SERVICE"]
    spec["process"]["capabilities"] = {"bounding": caps, "effective": caps, "permitted": caps}
    (bundle / "config.json").write_text(json.dumps(spec))


def start(route: str, host: FakeHost, tmp_path: Path, annotations: dict[str, str]) -> tuple[subprocess.CompletedProcess, Path, str]:
    """The container started by runc through ``route``: (runc's result, its bundle, its id)."""
    config = cluster_config(host, tmp_path)
    hooks = {"prestart": [hook_entry(config)]} if route == "hook" else None
    bundle = oci_bundle(tmp_path, CUDACHECK, env=["NVIDIA_VISIBLE_DEVICES=void"], hooks=hooks, annotations=annotations)
    unprivileged(bundle)
    container_id = unique()
    if route == "hook":
        return run_bundle("runc", bundle, container_id), bundle, container_id
    env = {"PATH": os.environ["PATH"], "PONYTAIL_CONFIG": str(config)}
    runtime = [console_script("ponytail-runtime"), "--root", str(tmp_path / "runc-state")]
    try:
        result = subprocess.run([*runtime, "run", "--bundle", str(bundle), container_id], env=env, capture_output=True, text=True,
                                timeout=TIMEOUT, stdin=subprocess.DEVNULL)
    finally:
        subprocess.run([*runtime, "delete", "-f", container_id], env=env, capture_output=True, timeout=TIMEOUT)
    return result, bundle, container_id


def gpu_rules(bundle: Path) -> list[tuple[int, int]]:
    rules = json.loads((bundle / "config.json").read_text()).get("linux", {}).get("resources", {}).get("devices", [])
    return [(r["major"], r["minor"]) for r in rules if r.get("allow") and r.get("major") in (195, 237)]


@pytest.mark.parametrize("route", ["hook", "ponytail-runtime"])
def test_a_pods_own_cdi_annotation_gets_no_gpu_on_crio(route: str, host: FakeHost, tmp_path: Path) -> None:
    result, bundle, container_id = start(route, host, tmp_path, crio_annotations(HOSTILE, {k: v for k, v in KUBELET.items() if "cdi" not in k}))
    assert result.returncode == 2 and result.stdout.startswith("dlopen libcuda.so.1 failed"), (result.stdout, result.stderr)
    assert gpu_rules(bundle) == []
    logged = [line for line in host.log.read_text().splitlines() if f"container={container_id}" in line]
    refusal = ("cdi.k8s.io/x refused: not among the container's own annotations (io.kubernetes.cri-o.Annotations); "
               "a pod annotation CRI-O copied is not the device plugin's")
    assert any(refusal in line for line in logged), logged
    assert not any("injected into" in line for line in logged), logged


@pytest.mark.parametrize("route", ["hook", "ponytail-runtime"])
def test_the_kubelets_container_annotation_gets_exactly_its_gpu_on_crio(route: str, host: FakeHost, tmp_path: Path) -> None:
    """The same hostile pod annotation beside the device plugin's: GPU 0 and IMEX channel 1, nothing more."""
    result, bundle, container_id = start(route, host, tmp_path, crio_annotations(HOSTILE, KUBELET))
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert result.stdout.splitlines() == [*EXPECTED_GPU0, f"open {CHANNELS[0]} ENOENT", f"open {CHANNELS[1]} ENXIO",
                                          f"open {CHANNELS[2]} ENOENT"], result.stdout
    if route == "ponytail-runtime":  # the engine's own device rules name only what was handed over
        rules = gpu_rules(bundle)
        assert (195, 2) in rules and (237, 1) in rules and not {(195, 0), (195, 1), (237, 0), (237, 2)} & set(rules), rules


def test_without_the_cri_the_strict_policy_believes_no_annotation(host: FakeHost, tmp_path: Path) -> None:
    """[request] cri unset: a pod's copy cannot be told from the kubelet's, so neither is believed, and
    the log says what to set."""
    config = tmp_path / "config.toml"
    config.write_text(host.config_text() + "[request]\naccept_env_when_unprivileged = false\n")
    bundle = oci_bundle(tmp_path, CUDACHECK, env=["NVIDIA_VISIBLE_DEVICES=void"], hooks={"prestart": [hook_entry(config)]},
                        annotations=crio_annotations(HOSTILE, KUBELET))
    unprivileged(bundle)
    container_id = unique()
    result = run_bundle("runc", bundle, container_id)
    assert result.returncode == 2 and result.stdout.startswith("dlopen libcuda.so.1 failed"), (result.stdout, result.stderr)
    logged = [line for line in host.log.read_text().splitlines() if f"container={container_id}" in line]
    assert any('[request] cri is not set' in line and 'set [request] cri = "containerd" or "cri-o"' in line for line in logged), logged


CONTAINERD_RUNC = """version = 2
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
  pod_annotations = ["*/*", "io.katacontainers.*", "cdi.k8s.io/*"]
"""


def test_containerd_entry_lets_no_pod_annotation_of_cdi_through(tmp_path: Path) -> None:
    """containerd writes the pod annotations a runtime entry's pod_annotations let through beside the
    container's, indistinguishable: ponytail's entry copies runc's but never such a pattern, and says so."""
    config = tmp_path / "config.toml"
    config.write_text(CONTAINERD_RUNC)
    result = subprocess.run([console_script("ponytail"), "configure", "--runtime", "containerd", "--config-file", str(config)],
                            capture_output=True, text=True, timeout=TIMEOUT)
    assert result.returncode == 0, result.stderr
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    runtimes = tomllib.loads(config.read_text())["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]
    assert runtimes["ponytail"]["pod_annotations"] == ["io.katacontainers.*"], runtimes["ponytail"]
    assert runtimes["ponytail"]["container_annotations"] == ["cdi.k8s.io/*"]  # the kubelet's, as before
    assert runtimes["runc"]["pod_annotations"] == ["*/*", "io.katacontainers.*", "cdi.k8s.io/*"]  # runc's own: untouched
    assert "left runc's pod_annotations '*/*', 'cdi.k8s.io/*' out of" in result.stdout, result.stdout


INSTALLER = Path(__file__).resolve().parents[2] / "packaging" / "installer" / "installer.sh"
OLD_POLICY = "# Written by the ponytail installer (see config/config.toml for every key).\n[request]\naccept_env_when_unprivileged = false\n"


@pytest.mark.parametrize(("engine", "before", "after"), [
    ("crio", None, OLD_POLICY + 'cri = "cri-o"\n'),
    ("containerd", None, OLD_POLICY + 'cri = "containerd"\n'),
    ("crio", OLD_POLICY, OLD_POLICY + 'cri = "cri-o"\n'),  # an earlier installer's file gains the CRI
    ("crio", "[request]\naccept_env_when_unprivileged = false\n", "[request]\naccept_env_when_unprivileged = false\n"),  # the operator's
    ("docker", None, OLD_POLICY),
])
def test_the_installer_names_the_cri(tmp_path: Path, engine: str, before: str | None, after: str) -> None:
    """The cluster policy is strict, and a CDI annotation is believed only where the CRI is known."""
    host, image = tmp_path / "host", tmp_path / "image"
    image.mkdir()
    (image / "ponytail").symlink_to(console_script("ponytail"))
    (image / "ponytail-runtime").symlink_to("ponytail")
    for directory in ("etc/ponytail", "usr/local", "var/lib", "etc/systemd/system/multi-user.target.wants", "etc/udev/rules.d"):
        (host / directory).mkdir(parents=True, exist_ok=True)
    if before is not None:
        (host / "etc/ponytail/config.toml").write_text(before)
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOST_ROOT": str(host), "IMAGE_DIR": str(image), "ENGINE": engine,
           "RESTART_MODE": "none", "DEV_CHAR_LINKS": "false", "CDI_SPEC": "", "ENGINE_CONFIG": str(tmp_path / "engine.conf")}
    installed = subprocess.run(["sh", str(INSTALLER), "install"], env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    assert (host / "etc/ponytail/config.toml").read_text() == after
