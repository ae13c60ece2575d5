"""The kubelet's device-plugin API (tests/deviceplugin/deviceplugin_v1beta1_min.proto) with two stand-ins of
the project's own: ``DevicePlugin`` answers as NVIDIA's device plugin v0.20.0 was seen to answer on a fake host
(../shared/nvidia/README.md: its GPUs by UUID, Healthy; Allocate's ContainerAllocateResponse per
``--device-list-strategy``; in the CDI strategies its own spec, kind k8s.device-plugin.nvidia.com/gpu, in the
engine's CDI directory), and ``Kubelet`` serves Registration and makes every call the kubelet's device manager
makes: GetDevicePluginOptions, ListAndWatch, GetPreferredAllocation (a kubelet asks it whenever the plugin says
it answers it, as NVIDIA's does), Allocate and, where asked for, PreStartContainer.

Both run in the test's process on unix sockets in a directory of the test's: nothing of the machine's kubelet
is touched. NVIDIA's own plugin, where a node has it installed, is run by hand (bench/fake_nvml.c answers its
NVML, GetTopologyCommonAncestor included)."""

from __future__ import annotations

import importlib
import os
import sys
import time
import uuid
from concurrent import futures
from pathlib import Path
from types import ModuleType

from support.fakehost import FakeHost
from support.nvidia_tools import DEVICE_PLUGIN_KIND, REPO, nvidia_spec

PROTO = REPO / "tests/deviceplugin/deviceplugin_v1beta1_min.proto"
RESOURCE = "nvidia.com/gpu"
ENDPOINT = "nvidia-gpu.sock"  # NVIDIA's plugin's socket name for nvidia.com/gpu
STRATEGIES = ("envvar", "volume-mounts", "cdi-annotations", "cdi-cri")
VOLUME_ROOT = "/var/run/nvidia-container-devices"  # the volume-mounts strategy's list, one mount per device
ANNOTATION_PREFIX = "cdi.k8s.io/nvidia-device-plugin_"  # the cdi-annotations strategy's key, a fresh UUID after it


def device_plugin_api(work: Path) -> tuple[ModuleType, ModuleType]:
    """The API's messages and services (protoc's Python modules, made in ``work``)."""
    from grpc_tools import protoc

    work.mkdir(parents=True, exist_ok=True)
    if not (work / "deviceplugin_v1beta1_min_pb2_grpc.py").exists():
        if protoc.main(["protoc", f"-I{PROTO.parent}", f"--python_out={work}", f"--grpc_python_out={work}", str(PROTO)]) != 0:
            raise RuntimeError(f"protoc failed on {PROTO}")
    sys.path.insert(0, str(work))
    try:
        return importlib.import_module("deviceplugin_v1beta1_min_pb2"), importlib.import_module("deviceplugin_v1beta1_min_pb2_grpc")
    finally:
        sys.path.remove(str(work))


def allocate_answer(pb: ModuleType, strategy: str, ids: list[str]):  # type: ignore[no-untyped-def]
    """NVIDIA's device plugin's ContainerAllocateResponse for GPUs ``ids`` under ``strategy`` (README's table)."""
    names = [f"{DEVICE_PLUGIN_KIND}={i}" for i in ids]
    if strategy == "envvar":
        return pb.ContainerAllocateResponse(envs={"NVIDIA_VISIBLE_DEVICES": ",".join(ids)})
    if strategy == "volume-mounts":
        return pb.ContainerAllocateResponse(envs={"NVIDIA_VISIBLE_DEVICES": VOLUME_ROOT},
                                            mounts=[pb.Mount(host_path="/dev/null", container_path=f"{VOLUME_ROOT}/{i}") for i in ids])
    if strategy == "cdi-annotations":
        return pb.ContainerAllocateResponse(annotations={f"{ANNOTATION_PREFIX}{uuid.uuid4()}": ",".join(names)})
    if strategy == "cdi-cri":
        return pb.ContainerAllocateResponse(cdi_devices=[pb.CDIDevice(name=n) for n in names])
    raise ValueError(f"unknown device list strategy {strategy!r} (one of {', '.join(STRATEGIES)})")


class DevicePlugin:
    """A device plugin answering as NVIDIA's with ``strategy`` for ``host``'s GPUs: in the CDI strategies its spec
    (nvidia-ctk's, device-plugin names, hooks at ``hook_path``: the ``nvidia-ctk hook`` form where it is named
    nvidia-ctk, the plugin's default) is written into ``cdi_dir``; it serves ``plugins_dir``/nvidia-gpu.sock and
    registers with the kubelet at ``plugins_dir``/kubelet.sock."""

    def __init__(self, host: FakeHost, plugins_dir: Path, cdi_dir: Path, strategy: str, hook_path: str, work: Path | None = None) -> None:
        import grpc

        if strategy not in STRATEGIES:
            raise ValueError(f"unknown device list strategy {strategy!r} (one of {', '.join(STRATEGIES)})")
        pb, rpc = device_plugin_api(work or plugins_dir.parent / "pb")
        self.strategy = strategy
        self.ids = [g.uuid for g in sorted(host.gpu_list, key=lambda g: g.bus_id)]  # NVML's index order
        self.spec = cdi_dir / f"{DEVICE_PLUGIN_KIND.replace('/', '-')}.yaml"
        if strategy.startswith("cdi-"):
            ctk = hook_path if os.path.basename(hook_path) == "nvidia-ctk" else ""
            nvidia_spec(host, self.spec, hook_path, ctk=ctk, variant="device-plugin-names")
        plugin = self

        class Servicer(rpc.DevicePluginServicer):  # type: ignore[name-defined,misc]
            def GetDevicePluginOptions(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802 - the API's names
                return pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)

            def ListAndWatch(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
                yield pb.ListAndWatchResponse(devices=[pb.Device(ID=i, health="Healthy") for i in plugin.ids])
                while context.is_active() and not plugin.stopping:
                    time.sleep(0.05)

            def GetPreferredAllocation(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
                answers = []
                for wanted in request.container_requests:
                    chosen = list(wanted.must_include_deviceIDs)
                    chosen += [i for i in plugin.ids if i in wanted.available_deviceIDs and i not in chosen]
                    answers.append(pb.ContainerPreferredAllocationResponse(deviceIDs=chosen[:wanted.allocation_size]))
                return pb.PreferredAllocationResponse(container_responses=answers)

            def Allocate(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
                for wanted in request.container_requests:
                    unknown = [i for i in wanted.devices_ids if i not in plugin.ids]
                    if unknown:
                        context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"invalid allocation request for '{RESOURCE}': unknown device: {unknown[0]}")
                return pb.AllocateResponse(container_responses=[allocate_answer(pb, strategy, list(w.devices_ids)) for w in request.container_requests])

            def PreStartContainer(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
                return pb.PreStartContainerResponse()

        self.stopping = False
        socket = plugins_dir / ENDPOINT
        socket.unlink(missing_ok=True)
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        rpc.add_DevicePluginServicer_to_server(Servicer(), self.server)
        self.server.add_insecure_port(f"unix://{socket}")
        self.server.start()
        with grpc.insecure_channel(f"unix://{plugins_dir / 'kubelet.sock'}") as channel:
            options = pb.DevicePluginOptions(get_preferred_allocation_available=True)
            rpc.RegistrationStub(channel).Register(
                pb.RegisterRequest(version="v1beta1", endpoint=ENDPOINT, resource_name=RESOURCE, options=options), timeout=30)

    def stop(self) -> None:
        self.stopping = True
        self.server.stop(None)


class Kubelet:
    """The kubelet's side of the device-plugin API: serves Registration on ``plugins_dir``/kubelet.sock,
    then talks to the plugin that registered, as the kubelet's device manager does."""

    def __init__(self, plugins_dir: Path, work: Path) -> None:
        import grpc

        self.pb, self.rpc = device_plugin_api(work)
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
        if self.channel is None:
            self.channel = grpc.insecure_channel(f"unix://{self.plugins_dir / request.endpoint}")
        return self.rpc.DevicePluginStub(self.channel)

    def devices(self) -> list:
        """The first list ListAndWatch sends (the kubelet's view of the node's GPUs)."""
        stream = self.plugin().ListAndWatch(self.pb.Empty(), timeout=60)
        first = next(iter(stream))
        stream.cancel()
        return list(first.devices)

    def allocate(self, device_ids: list[str]):  # type: ignore[no-untyped-def]
        """One container's GPUs as the kubelet's device manager admits a pod: the plugin's options, its
        preferred allocation among the healthy devices (``device_ids`` must be in it, as devices the
        container already has are), Allocate of what it preferred, and PreStartContainer where the
        plugin asks for it. Any failed call fails the admission. Allocate's ContainerAllocateResponse."""
        plugin = self.plugin()
        options = plugin.GetDevicePluginOptions(self.pb.Empty(), timeout=60)
        chosen = list(device_ids)
        if options.get_preferred_allocation_available:
            healthy = [d.ID for d in self.devices() if d.health == "Healthy"]
            wanted = self.pb.ContainerPreferredAllocationRequest(available_deviceIDs=healthy, must_include_deviceIDs=device_ids,
                                                                 allocation_size=len(device_ids))
            preferred = plugin.GetPreferredAllocation(self.pb.PreferredAllocationRequest(container_requests=[wanted]), timeout=60)
            chosen = list(preferred.container_responses[0].deviceIDs)
            assert len(chosen) == len(device_ids) and set(device_ids) <= set(chosen), (device_ids, chosen)
        request = self.pb.AllocateRequest(container_requests=[self.pb.ContainerAllocateRequest(devices_ids=chosen)])
        response = plugin.Allocate(request, timeout=60).container_responses[0]
        if options.pre_start_required:
            plugin.PreStartContainer(self.pb.PreStartContainerRequest(devices_ids=chosen), timeout=60)
        return response

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
