"""NVIDIA's device plugin (v0.20.0, ../shared/anchor's prebuilt binary) on a fake host, and a stand-in for the
kubelet that speaks the device-plugin API to it (tests/deviceplugin/deviceplugin_v1beta1_min.proto: the
kubelet's Registration service, and GetDevicePluginOptions, ListAndWatch and Allocate on the plugin's socket).

The plugin lists GPUs through NVML (bench/fake_nvml.c answering for the host's GPUs, every other entry point
it binds answering NVML_ERROR_NOT_SUPPORTED), finds the device nodes in its own /dev and registers with the
kubelet at /var/lib/kubelet/device-plugins/kubelet.sock; in its CDI strategies it writes its own spec to
/var/run/cdi. It runs in a private mount namespace where /proc/driver/nvidia, /proc/devices, /dev and
/sys/bus/pci/devices show the fake host, /var/lib/kubelet/device-plugins is a directory of the test's and
/var/run/cdi the engine's spec directory: the machine's own are never touched."""

from __future__ import annotations

import importlib
import os
import re
import sys
import time
from concurrent import futures
from pathlib import Path

from support.engines import start_daemon, stop_daemon
from support.fakehost import FakeHost
from support.nvidia_tools import REPO, install_fake_nvml, nvidia_tools

PROTO = REPO / "tests/deviceplugin/deviceplugin_v1beta1_min.proto"
RESOURCE = "nvidia.com/gpu"

NAMESPACE_SCRIPT = r"""
set -e
H=$1 PLUGINS=$2 CDI=$3; shift 3
mount -t tmpfs -o mode=755 tmpfs /proc/driver
mkdir /proc/driver/nvidia
mount --bind "$H/proc/driver/nvidia" /proc/driver/nvidia
mount --bind "$H/proc/devices" /proc/devices
mount --bind "$H/sys/bus/pci/devices" /sys/bus/pci/devices
mount -t tmpfs -o mode=755 tmpfs /dev
cp -a "$H/dev/." /dev/
mknod -m 666 /dev/null c 1 3; mknod -m 666 /dev/zero c 1 5; mknod -m 666 /dev/urandom c 1 9
mount -t tmpfs -o mode=755 tmpfs /var/lib
mkdir -p /var/lib/kubelet/device-plugins
mount --bind "$PLUGINS" /var/lib/kubelet/device-plugins
mount -t tmpfs -o mode=755 tmpfs /run
mkdir /run/cdi
mount --bind "$CDI" /run/cdi
exec "$@"
"""


def install_plugin_nvml(host: FakeHost) -> None:
    """The fake NVML, with a NOT_SUPPORTED answer for every other entry point the plugin binds."""
    binary = nvidia_tools() / "bin/nvidia-device-plugin"
    names = set(re.findall(rb"_Cfunc_(nvml[A-Za-z0-9_]+)", binary.read_bytes()))
    defined = set(re.findall(rb"\b(nvml[A-Za-z0-9_]+)\(", (REPO / "bench/fake_nvml.c").read_bytes()))
    stubs = host.base / "nvml-stubs.c"
    stubs.write_text("".join(f"int {n.decode()}(void) {{ return 3; }}\n" for n in sorted(names - defined)))
    install_fake_nvml(host, extra_sources=(stubs,))


class DevicePlugin:
    """``nvidia-device-plugin`` with ``strategy``, its hooks at ``hook_path``, registering with the
    kubelet stand-in in ``plugins_dir`` and writing its spec into ``cdi_dir``."""

    def __init__(self, host: FakeHost, plugins_dir: Path, cdi_dir: Path, strategy: str, hook_path: str) -> None:
        install_plugin_nvml(host)
        tools = nvidia_tools()
        argv = [str(tools / "bin/nvidia-device-plugin"), "--driver-root", str(host.driver), "--driver-root-ctr-path", str(host.driver),
                "--dev-root", str(host.base), "--device-list-strategy", strategy, "--nvidia-cdi-hook-path", hook_path,
                "--kubelet-socket", str(Path("/var/lib/kubelet/device-plugins/kubelet.sock")), "--fail-on-init-error"]
        command = ["unshare", "-m", "--propagation", "private", "/bin/sh", "-c", NAMESPACE_SCRIPT, "sh",
                   str(host.base), str(plugins_dir), str(cdi_dir), *argv]
        self.log_path = plugins_dir.parent / f"device-plugin-{strategy}.log"
        env = {"DP_DISABLE_HEALTHCHECKS": "all", "PATH": f"{tools / 'bin'}:{os.environ['PATH']}"}
        ready = lambda: (plugins_dir / "nvidia-gpu.sock").exists()  # noqa: E731
        self.process = start_daemon(command, self.log_path, env, ready, lambda: None)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        stop_daemon(self.process)


class Kubelet:
    """The kubelet's side of the device-plugin API: serves Registration on ``plugins_dir``/kubelet.sock,
    then talks to the plugin that registered, as the kubelet's device manager does."""

    def __init__(self, plugins_dir: Path, work: Path) -> None:
        import grpc
        from grpc_tools import protoc

        work.mkdir(parents=True, exist_ok=True)
        if protoc.main(["protoc", f"-I{PROTO.parent}", f"--python_out={work}", f"--grpc_python_out={work}", str(PROTO)]) != 0:
            raise RuntimeError(f"protoc failed on {PROTO}")
        sys.path.insert(0, str(work))
        try:
            self.pb = importlib.import_module("deviceplugin_v1beta1_min_pb2")
            self.rpc = importlib.import_module("deviceplugin_v1beta1_min_pb2_grpc")
        finally:
            sys.path.remove(str(work))
        self.plugins_dir = plugins_dir
        self.registered: list = []
        kubelet = self

        class Registration(self.rpc.RegistrationServicer):  # type: ignore[name-defined,misc]
            def Register(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802 - the API's name
                kubelet.registered.append(request)
                return kubelet.pb.Empty()

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        self.rpc.add_RegistrationServicer_to_server(Registration(), self.server)
        self.server.add_insecure_port(f"unix://{plugins_dir / 'kubelet.sock'}")
        self.server.start()
        self.channel = None

    def plugin(self, timeout: float = 60.0):  # type: ignore[no-untyped-def]
        """The registered plugin's stub (after its Register call)."""
        import grpc

        deadline = time.monotonic() + timeout
        while not self.registered:
            if time.monotonic() > deadline:
                raise TimeoutError("the device plugin did not register with the kubelet stand-in")
            time.sleep(0.05)
        request = self.registered[-1]
        assert request.version == "v1beta1" and request.resource_name == RESOURCE, request
        self.channel = grpc.insecure_channel(f"unix://{self.plugins_dir / request.endpoint}")
        return self.rpc.DevicePluginStub(self.channel)

    def devices(self) -> list:
        """The first list ListAndWatch sends (the kubelet's view of the node's GPUs)."""
        stream = self.plugin().ListAndWatch(self.pb.Empty(), timeout=60)
        first = next(iter(stream))
        stream.cancel()
        return list(first.devices)

    def allocate(self, device_ids: list[str]):  # type: ignore[no-untyped-def]
        """Allocate for one container: its ContainerAllocateResponse."""
        request = self.pb.AllocateRequest(container_requests=[self.pb.ContainerAllocateRequest(devices_ids=device_ids)])
        return self.plugin().Allocate(request, timeout=60).container_responses[0]

    def close(self) -> None:
        if self.channel is not None:
            self.channel.close()
        self.server.stop(None)


def cri_request(response) -> dict:  # type: ignore[no-untyped-def]
    """The CRI container fields the kubelet makes of a ContainerAllocateResponse (Pods.create's keywords):
    its envs, its mounts, its annotations and its CDI devices (the kubelet also copies the CDI devices into
    cdi.k8s.io/ annotations only for runtimes without the field; containerd 2.x and CRI-O take the field)."""
    return {
        "env": dict(response.envs),
        "mounts": [(m.host_path, m.container_path) for m in response.mounts],
        "annotations": dict(response.annotations),
        "cdi_devices": tuple(d.name for d in response.cdi_devices),
    }

