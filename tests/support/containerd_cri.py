"""A private containerd 1.6 (own root, state, gRPC and ttrpc addresses, in a mount namespace
of its own) and a small CRI v1 client that runs pods the way kubelet does: a pod sandbox
from a locally built pause image, then containers in it.

The CRI stubs are generated at test time with grpcio-tools from tests/cri/runtime_v1_min.proto,
which holds only the messages and fields used here (with CRI v1's field numbers).
"""

from __future__ import annotations

import hashlib
import importlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from support.commands import installed
from support.engines import BUSY_DEADLINE, TIMEOUT, processes_naming, start_daemon, stop_daemon
from support.fakehost import FakeHost, gpus, make_rootfs
from support.sidroot import in_sid, sid_binary, sid_env, stop_sid_daemon

PROTO = Path(__file__).parent.parent / "cri" / "runtime_v1_min.proto"  # tests/cri
NAMESPACE = "k8s.io"  # where the CRI plugin keeps its images and containers


def cri_modules(directory: Path):  # type: ignore[no-untyped-def]
    """(messages, services) generated from the proto into ``directory``."""
    from grpc_tools import protoc

    directory.mkdir(parents=True, exist_ok=True)
    args = ["protoc", f"-I{PROTO.parent}", f"--python_out={directory}", f"--grpc_python_out={directory}", str(PROTO)]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {PROTO}")
    sys.path.insert(0, str(directory))
    try:
        return importlib.import_module("runtime_v1_min_pb2"), importlib.import_module("runtime_v1_min_pb2_grpc")
    finally:
        sys.path.remove(str(directory))


def oci_archive(rootfs: Path, name: str, cmd: list[str], out: Path) -> Path:
    """An OCI image layout tar of ``rootfs`` (one uncompressed layer) named ``name``, for `ctr images import`."""
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for entry in sorted(rootfs.rglob("*")):
            tar.add(entry, arcname=str(entry.relative_to(rootfs)), recursive=False)
    blobs: dict[str, bytes] = {}

    def blob(data: bytes, media_type: str) -> dict:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        blobs[digest] = data
        return {"mediaType": media_type, "digest": digest, "size": len(data)}

    layer_bytes = layer.getvalue()
    config = {
        "architecture": "amd64", "os": "linux",
        "config": {"Cmd": cmd, "Env": ["PATH=/usr/local/bin:/usr/bin:/bin"]},
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(layer_bytes).hexdigest()]},
    }
    manifest = {
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": blob(json.dumps(config).encode(), "application/vnd.oci.image.config.v1+json"),
        "layers": [blob(layer_bytes, "application/vnd.oci.image.layer.v1.tar")],
    }
    descriptor = blob(json.dumps(manifest).encode(), "application/vnd.oci.image.manifest.v1+json")
    descriptor["annotations"] = {"io.containerd.image.name": name, "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1]}
    index = {"schemaVersion": 2, "manifests": [descriptor]}
    with tarfile.open(out, "w") as tar:
        for path, data in [("oci-layout", b'{"imageLayoutVersion": "1.0.0"}'), ("index.json", json.dumps(index).encode())] + [
            (f"blobs/sha256/{d.split(':')[1]}", b) for d, b in blobs.items()
        ]:
            info = tarfile.TarInfo(path)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out


def private_config(default_text: str, state: Path, sandbox_image: str) -> str:
    """`containerd config default` (config version 2 of containerd 1.x, version 3 of 2.0-2.2 or 4 of 2.3)
    with every path of its own: root, state, sockets, /opt, CDI spec directory (``state``/cdi), NRI off;
    the pause image built here."""
    if default_text.startswith(("version = 3", "version = 4")):
        replacements = [
            (r"(?m)^root = '.*'$", f"root = '{state}/root'"),
            (r"(?m)^state = '.*'$", f"state = '{state}/state'"),
            (r"address = '/run/containerd/containerd.sock'", f"address = '{state}/c.sock'"),
            (r"(\[ttrpc\]\n  address = )'(/run/containerd/containerd.sock.ttrpc)?'", rf"\1'{state}/t.sock'"),
            (r"sandbox = '.*'", f"sandbox = '{sandbox_image}'"),
            (r"path = '/opt/containerd'", f"path = '{state}/opt'"),
            (r"bin_dir = '/opt/containerd/image-verifier/bin'", f"bin_dir = '{state}/opt/verifier'"),
            (r"cdi_spec_dirs = \[.*\]", f"cdi_spec_dirs = ['{state}/cdi']"),
            (r"(\[plugins.'io.containerd.nri.v1.nri'\]\n    disable = )false", r"\1true"),
            (r"restrict_oom_score_adj = false", "restrict_oom_score_adj = true"),
        ]
    else:
        replacements = [
            (r'(?m)^root = ".*"$', f'root = "{state}/root"'),
            (r'(?m)^state = ".*"$', f'state = "{state}/state"'),
            (r'(\[grpc\]\n  address = )".*"', rf'\1"{state}/c.sock"'),
            (r'(\[ttrpc\]\n  address = )".*"', rf'\1"{state}/t.sock"'),
            (r'sandbox_image = ".*"', f'sandbox_image = "{sandbox_image}"'),
            (r'path = "/opt/containerd"', f'path = "{state}/opt"'),
            # root here lacks CAP_SYS_RESOURCE: the pause container's oom_score_adj -998 cannot be set
            (r"restrict_oom_score_adj = false", "restrict_oom_score_adj = true"),
        ]
    for pattern, replacement in replacements:
        default_text, count = re.subn(pattern, replacement, default_text)
        if count != 1:
            raise RuntimeError(f"containerd's default config has no single match for {pattern!r}")
    return default_text


class Containerd:
    """containerd --config CONFIG in a mount namespace of its own with a private /run (where
    containerd puts its shims' sockets and runc its state whatever the config says);
    ``env`` reaches its runtimes. Pods' cgroups go under ``cgroup_parent``, removed at close.
    ``sid``: Debian sid's containerd 2.1, its shim and runc 1.3, run in the sid root (support.sidroot),
    else Debian 12's."""

    def __init__(self, config: Path, state: Path, env: dict[str, str], sid: bool = False) -> None:
        self.state = state
        self.socket = str(state / "c.sock")
        self.cgroup_parent = f"/{state.name}"
        self.sid = sid
        self.ctr_command = sid_binary("ctr") if sid else "ctr"
        if sid:
            command = in_sid(["containerd", "--config", str(config)])
            env = sid_env(env)
        else:
            command = ["unshare", "-m", "--propagation", "private", "sh", "-c", 'mount -t tmpfs tmpfs /run && exec "$@"', "sh",
                       "containerd", "--config", str(config)]
        self.process = start_daemon(command, state / "containerd.log", env, lambda: self.ctr("version").returncode == 0, lambda: None,
                                    stop=stop_sid_daemon if sid else stop_daemon)

    def ctr(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([self.ctr_command, "-a", self.socket, *args], capture_output=True, text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL)

    def log(self) -> str:
        return (self.state / "containerd.log").read_text(errors="replace")

    def bundle_config(self, container_id: str) -> dict:
        path = self.state / "state/io.containerd.runtime.v2.task" / NAMESPACE / container_id / "config.json"
        return json.loads(path.read_text())

    def close(self) -> None:
        (stop_sid_daemon if self.sid else stop_daemon)(self.process)
        for pid in processes_naming(self.socket):  # shims of containers left behind: ours, by their -address
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        remove_cgroups(self.cgroup_parent)


def remove_cgroups(cgroup_parent: str) -> None:
    """The pods' cgroups under ``cgroup_parent`` in every hierarchy, deepest first (waiting a few seconds
    for the processes of a PID namespace just ended to be gone from them)."""
    deadline = time.monotonic() + 10
    for hierarchy in Path("/sys/fs/cgroup").iterdir():
        parent = hierarchy / cgroup_parent.lstrip("/")
        if parent.is_dir():
            for directory in [*sorted((d for d in parent.rglob("*") if d.is_dir()), key=lambda d: -len(d.parts)), parent]:
                while True:
                    try:
                        directory.rmdir()
                        break
                    except OSError:
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.1)


class Pods:
    """Pods through the CRI RuntimeService, each a sandbox with one container, as kubelet runs them."""

    def __init__(self, daemon: Containerd, image: str, stubs: Path) -> None:
        import grpc

        self.pb, services = cri_modules(stubs)
        self.channel = grpc.insecure_channel(f"unix://{daemon.socket}")
        self.runtime = services.RuntimeServiceStub(self.channel)
        self.daemon = daemon
        self.image = image
        self.sandboxes: list[str] = []

    def version(self) -> str:
        answer = self.runtime.Version(self.pb.VersionRequest(version="v1"), timeout=30)
        return f"{answer.runtime_name} {answer.runtime_version} CRI {answer.runtime_api_version}"

    def config(self) -> dict:
        """The CRI plugin's configuration as the runtime reports it (Status, verbose: containerd's "config")."""
        return json.loads(self.runtime.Status(self.pb.StatusRequest(verbose=True), timeout=30).info["config"])

    def runtime_spec(self, container_id: str) -> dict:
        """The OCI spec the engine made for a container, before any runtime saw it (ContainerStatus, verbose)."""
        answer = self.runtime.ContainerStatus(self.pb.ContainerStatusRequest(container_id=container_id, verbose=True), timeout=30)
        return json.loads(answer.info["info"])["runtimeSpec"]

    def create(
        self, args: list[str], env: dict[str, str] | None = None, mounts: list[tuple[str, str]] = (),  # type: ignore[assignment]
        annotations: dict[str, str] | None = None, runtime_handler: str = "", privileged: bool = False,
        namespace: str = "default", pod_annotations: dict[str, str] | None = None, cdi_devices: tuple[str, ...] = (),
    ) -> tuple[str, Path]:
        """A pod sandbox (host network) in ``namespace``, with the pod's ``pod_annotations``, and a
        created, not started, container: (container id, log file). ``cdi_devices``: CRI's CDIDevices
        field (fully qualified CDI names, as kubelet passes them)."""
        pb = self.pb
        uid = uuid.uuid4().hex
        logs = self.daemon.state / "pods" / uid
        node = pb.NamespaceOption(network=pb.NODE, pid=pb.CONTAINER, ipc=pb.POD)
        sandbox = pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=f"pod-{uid[:8]}", uid=uid, namespace=namespace),
            annotations=pod_annotations or {},
            log_directory=str(logs),
            linux=pb.LinuxPodSandboxConfig(
                cgroup_parent=self.daemon.cgroup_parent,
                security_context=pb.LinuxSandboxSecurityContext(namespace_options=node, privileged=privileged),
            ),
        )
        pod = self.runtime.RunPodSandbox(pb.RunPodSandboxRequest(config=sandbox, runtime_handler=runtime_handler), timeout=60)
        self.sandboxes.append(pod.pod_sandbox_id)
        container = pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name="main"),
            image=pb.ImageSpec(image=self.image, user_specified_image=self.image),
            command=args,
            envs=[pb.KeyValue(key=k, value=v) for k, v in (env or {}).items()],
            mounts=[pb.Mount(host_path=h, container_path=c, readonly=True) for h, c in mounts],
            annotations=annotations or {},
            CDI_devices=[pb.CDIDevice(name=name) for name in cdi_devices],
            log_path="main.log",
            linux=pb.LinuxContainerConfig(
                security_context=pb.LinuxContainerSecurityContext(namespace_options=node, privileged=privileged)
            ),
        )
        created = self.runtime.CreateContainer(
            pb.CreateContainerRequest(pod_sandbox_id=pod.pod_sandbox_id, config=container, sandbox_config=sandbox), timeout=60
        )
        return created.container_id, logs / "main.log"

    def start(self, container_id: str) -> None:
        """StartContainer: containerd 1.6 makes the task (the bundle, ``runtime create``) here."""
        self.runtime.StartContainer(self.pb.StartContainerRequest(container_id=container_id), timeout=60)

    def run(self, args: list[str], **kwargs) -> tuple[str, int, list[str]]:  # type: ignore[no-untyped-def]
        """Create, start and wait for a container: (its id, exit code, its stdout lines)."""
        pb = self.pb
        container_id, log = self.create(args, **kwargs)
        self.start(container_id)
        deadline = time.monotonic() + BUSY_DEADLINE
        while True:
            status = self.runtime.ContainerStatus(pb.ContainerStatusRequest(container_id=container_id), timeout=30).status
            if status.state == pb.CONTAINER_EXITED or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        lines = []
        for line in log.read_text().splitlines() if log.exists() else []:
            _, stream, _, text = line.split(" ", 3)  # CRI log format: time stream tag text
            if stream == "stdout":
                lines.append(text)
        return container_id, status.exit_code, lines

    def close(self) -> None:
        import grpc

        pb = self.pb
        for sandbox in self.sandboxes:
            try:
                self.runtime.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sandbox), timeout=60)
                self.runtime.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=sandbox), timeout=60)
            except grpc.RpcError:  # noqa: S110 - containerd's close ends what is left
                pass
        self.channel.close()


def gpu_node_files(base: Path, request_config: str = "") -> tuple[FakeHost, Path, Path, str]:
    """What a node test needs under ``base``: a fake host (3 GPUs, minors 2, 0, 1), ponytail's strict
    config for it ([request] accept_env_when_unprivileged = false: GPUs from the device plugin's list
    only; ``request_config``: more keys of [request]), a rootfs with cudacheck and sleep, and a fresh
    image name for it."""
    host = FakeHost(base / "host", gpu_list=gpus(3, minors=[2, 0, 1]))
    ponytail_config = base / "ponytail.toml"
    ponytail_config.write_text(host.config_text() + "[request]\naccept_env_when_unprivileged = false\n" + request_config)
    rootfs = make_rootfs(base / "rootfs")
    (rootfs / "bin/sleep").symlink_to("busybox")
    return host, ponytail_config, rootfs, f"localhost/ponytail-test-{uuid.uuid4().hex[:12]}:1"


def make_state_dir() -> Path:
    """Short (unix socket paths are limited to 108 bytes) and unique."""
    return Path(tempfile.mkdtemp(prefix="pt-ctrd-"))


def remove_state_dir(state: Path) -> None:
    shutil.rmtree(state, ignore_errors=True)


def configured_private_config(containerd: str, state: Path, image: str, *configure_args: str) -> tuple[Path, str]:
    """``containerd config default`` of the ``containerd`` binary made private (private_config) as
    ``state``/config.toml, then ``ponytail configure --runtime containerd`` run on it with
    ``configure_args`` (ponytail-runtime as the handler's runtime, records in ``state``/ponytail):
    the config file, and what configure said."""
    default = subprocess.run([containerd, "config", "default"], capture_output=True, text=True, check=True).stdout
    config = state / "config.toml"
    config.write_text(private_config(default, state, image))
    configured = subprocess.run(
        [installed("ponytail"), "configure", "--runtime", "containerd", "--config-file", str(config),
         "--path", installed("ponytail-runtime"), "--state-dir", str(state / "ponytail"), *configure_args],
        capture_output=True, text=True, timeout=60,
    )
    assert configured.returncode == 0, configured.stderr
    return config, configured.stdout


@contextmanager
def node_daemon(config: Path, state: Path, env: dict[str, str], rootfs: Path, image: str, base: Path,
                sid: bool = False) -> Iterator[tuple[Containerd, Pods]]:
    """A private containerd on ``config`` with ``rootfs`` imported as ``image`` (running sleep) and
    pods to make in it; both stopped, and ``state`` removed, on the way out. ``sid``: Debian sid's
    containerd 2.1 (Containerd)."""
    daemon = pods = None
    try:
        daemon = Containerd(config, state, env, sid=sid)
        imported = daemon.ctr("-n", "k8s.io", "images", "import", str(oci_archive(rootfs, image, ["/bin/sleep", "100000"], base / "image.tar")))
        assert imported.returncode == 0, imported.stderr
        pods = Pods(daemon, image, base / "stubs")
        yield daemon, pods
    finally:
        if pods is not None:
            pods.close()
        if daemon is not None:
            daemon.close()
        remove_state_dir(state)
