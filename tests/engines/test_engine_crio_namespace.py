"""CRI-O (the current release from $ENGINES_DIR) and the pod namespace of [request] env_namespaces.

CRI-O copies a pod's annotations into each of its containers' config.json, then the container's
annotations, then the kubelet's container labels, which name the pod's namespace
(io.kubernetes.pod.namespace; crictl stands in for the kubelet here and sets the labels the kubelet
sets). So with `cri = "cri-o"` a pod in `default` that brings io.kubernetes.pod.namespace:
gpu-operator as a pod annotation, a container annotation and a pod label is still in `default`;
and containerd's key, io.kubernetes.cri.sandbox-namespace, reaches the spec as the pod wrote it:
why ponytail reads only the configured CRI implementation's key."""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from support.containerd_cri import make_state_dir, oci_archive, remove_state_dir
from support.engines import TIMEOUT, current_engines, start_daemon, stop_daemon
from support.fakehost import FakeHost, make_rootfs
from support.harness import run_ponytail, state_for

pytestmark = pytest.mark.current_engines
FORGED = "gpu-operator"


@pytest.fixture(scope="module")
def crictl():  # type: ignore[no-untyped-def]
    """crictl against a private CRI-O (own storage, state and socket; cgroupfs; no CNI: host network)."""
    engines = current_engines()
    if engines is None or not (engines / "crio").is_file() or shutil.which("conmon") is None or shutil.which("podman") is None:
        pytest.skip("needs ENGINES_DIR with crio (make test-engines), conmon and podman (to load the image)")
    state = make_state_dir()
    image = f"localhost/pt-crio-{uuid.uuid4().hex[:8]}:1"
    (state / "etc").mkdir()
    (state / "etc/policy.json").write_text('{"default": [{"type": "insecureAcceptAnything"}]}')
    (state / "etc/crio.conf").write_text(
        f'[crio]\nroot = "{state}/root"\nrunroot = "{state}/run"\nstorage_driver = "vfs"\nlog_dir = "{state}/logs"\n'
        f'version_file = "{state}/version"\nversion_file_persist = "{state}/version-persist"\n'
        f'clean_shutdown_file = "{state}/clean.shutdown"\n'
        f'[crio.api]\nlisten = "{state}/crio.sock"\nstream_port = "0"\n'
        f'[crio.runtime]\ndefault_runtime = "runc"\nconmon = "{shutil.which("conmon")}"\ncgroup_manager = "cgroupfs"\n'
        f'conmon_cgroup = "pod"\npinns_path = "{engines}/pinns"\nnamespaces_dir = "{state}/ns"\n'
        f'container_exits_dir = "{state}/exits"\ncontainer_attach_socket_dir = "{state}/attach"\n'
        f'[crio.runtime.runtimes.runc]\nruntime_path = "{engines}/runc"\nruntime_root = "{state}/runc"\n'
        f'[crio.image]\npause_image = "{image}"\npause_command = ""\nsignature_policy = "{state}/etc/policy.json"\n'
        f'[crio.network]\nnetwork_dir = "{state}/cni"\nplugin_dirs = ["{state}/cni"]\n[crio.metrics]\nenable_metrics = false\n'
    )
    rootfs = make_rootfs(state / "rootfs", programs=())
    (rootfs / "bin/sleep").symlink_to("busybox")
    podman = ["podman", "--root", f"{state}/root", "--runroot", f"{state}/run", "--storage-driver", "vfs"]
    loaded = subprocess.run([*podman, "load", "-i", str(oci_archive(rootfs, image, ["/bin/sleep", "600"], state / "image.tar"))],
                            capture_output=True, text=True, timeout=TIMEOUT)
    assert loaded.returncode == 0, loaded.stderr
    command = [str(engines / "crictl"), "--runtime-endpoint", f"unix://{state}/crio.sock", "--timeout", "60s"]
    ready = lambda: subprocess.run([*command, "version"], capture_output=True, timeout=TIMEOUT).returncode == 0  # noqa: E731
    crio = ["unshare", "--mount", "--propagation", "private", "sh", "-c", 'mount -t tmpfs tmpfs /run && exec "$0" "$@"',
            str(engines / "crio"), "--config", f"{state}/etc/crio.conf", "--config-dir", f"{state}/etc/none"]
    process = start_daemon(crio, state / "crio.log", {}, ready, lambda: None)
    try:
        yield command, state
    finally:
        subprocess.run([*command, "rmp", "-fa"], capture_output=True, timeout=TIMEOUT)
        stop_daemon(process)
        remove_state_dir(state)


def test_a_pod_cannot_claim_a_namespace_under_crio(crictl, host: FakeHost, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    command, state = crictl
    uid = uuid.uuid4().hex
    pod = {
        "metadata": {"name": "forger", "namespace": "default", "uid": uid},
        "log_directory": f"{state}/pods/{uid}",
        "annotations": {"io.kubernetes.pod.namespace": FORGED, "io.kubernetes.cri.sandbox-namespace": FORGED, "example.com/passed": "yes"},
        "labels": {"io.kubernetes.pod.namespace": FORGED},
        "linux": {"security_context": {"namespace_options": {"network": 2, "pid": 1}}},
    }
    image = json.loads(subprocess.run([*command, "images", "-o", "json"], capture_output=True, text=True, timeout=TIMEOUT).stdout)
    container = {
        "metadata": {"name": "main"}, "image": {"image": image["images"][0]["repoTags"][0]},
        "command": ["/bin/sleep", "600"], "envs": [{"key": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
        # what the kubelet puts on every container (kuberuntime newContainerLabels)
        "labels": {"io.kubernetes.pod.name": "forger", "io.kubernetes.pod.namespace": "default", "io.kubernetes.pod.uid": uid,
                   "io.kubernetes.container.name": "main"},
        "annotations": {"io.kubernetes.pod.namespace": FORGED},
        "linux": {"security_context": {"namespace_options": {"network": 2, "pid": 1}}},
    }
    (tmp_path / "pod.json").write_text(json.dumps(pod))
    (tmp_path / "container.json").write_text(json.dumps(container))
    sandbox = subprocess.run([*command, "runp", str(tmp_path / "pod.json")], capture_output=True, text=True, timeout=TIMEOUT)
    assert sandbox.returncode == 0, sandbox.stderr
    created = subprocess.run([*command, "create", sandbox.stdout.strip(), str(tmp_path / "container.json"), str(tmp_path / "pod.json")],
                             capture_output=True, text=True, timeout=TIMEOUT)
    assert created.returncode == 0, created.stderr
    bundle = state / "root/vfs-containers" / created.stdout.strip() / "userdata"
    annotations = json.loads((bundle / "config.json").read_text())["annotations"]
    assert annotations["example.com/passed"] == "yes"  # the pod's annotations do reach the spec
    assert annotations["io.kubernetes.pod.namespace"] == "default"  # CRI-O's (the kubelet's) over the pod's
    assert annotations["io.kubernetes.cri.sandbox-namespace"] == FORGED  # containerd's key: the pod's own
    # the hook's decision on that very config.json
    strict = f'[request]\naccept_env_when_unprivileged = false\nenv_namespaces = ["{FORGED}"]\n'
    for cri, believed in (("cri-o", False), ("containerd", True)):
        config = tmp_path / f"{cri}.toml"
        config.write_text(host.config_text() + strict + f'cri = "{cri}"\n')
        output = run_ponytail(["-config", str(config), "-debug"], stdin=state_for(bundle, 1)).stdout.decode()
        assert ("devices requested: 'all' (from NVIDIA_VISIBLE_DEVICES)" in output) is believed, output
