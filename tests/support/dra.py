"""``ponytail dra-plugin`` on a fake host, a stand-in API server (support.kube_api) and a stand-in kubelet.

The kubelet stand-in does what the kubelet does with a DRA plugin: it watches the registration
directory for a socket, calls ``GetInfo`` (a ``DRAPlugin`` offering ``v1.DRAPlugin``) and
``NotifyRegistrationStatus``, then calls ``NodePrepareResources`` / ``NodeUnprepareResources`` and
reads the health stream on the endpoint GetInfo named. Its client code is protoc's (grpcio-tools)
from the project's .proto files, not the plugin's run-time descriptors: a field number the two
disagree on breaks the tests.
"""

from __future__ import annotations

import importlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

from support.commands import PONYTAIL, REPO
from support.fakehost import FakeHost
from support.kube_api import KubeApi

PROTO_DIR = REPO / "ponytail/dra/proto"
NODE = "node-1"
DRIVER = "gpu.ponytail.example.com"


def compiled(work: Path, name: str) -> tuple[ModuleType, ModuleType]:
    """protoc's message and service modules of ponytail/dra/proto/``name``."""
    from grpc_tools import protoc

    work.mkdir(parents=True, exist_ok=True)
    if protoc.main(["protoc", f"-I{PROTO_DIR}", f"--python_out={work}", f"--grpc_python_out={work}", str(PROTO_DIR / name)]) != 0:
        raise RuntimeError(f"protoc failed on {name}")
    stem = name.removesuffix(".proto")
    sys.path.insert(0, str(work))
    try:
        for module in (f"{stem}_pb2", f"{stem}_pb2_grpc"):
            sys.modules.pop(module, None)
        return importlib.import_module(f"{stem}_pb2"), importlib.import_module(f"{stem}_pb2_grpc")
    finally:
        sys.path.remove(str(work))


class Kubelet:
    """The kubelet's side of DRA, against the plugin registered in ``registry``."""

    def __init__(self, registry: Path, work: Path) -> None:
        self.registry = registry
        self.reg_pb, self.reg_rpc = compiled(work, "pluginregistration.proto")
        self.dra_pb, self.dra_rpc = compiled(work, "dra_v1.proto")
        self.health_pb, self.health_rpc = compiled(work, "dra_health.proto")
        self.info = None
        self.channel = None

    def register(self, timeout: float = 30.0) -> object:
        """Wait for a registration socket, then GetInfo and NotifyRegistrationStatus as the kubelet does."""
        import grpc

        deadline = time.monotonic() + timeout
        while True:  # a socket left by a killed plugin refuses until the new one binds: the kubelet tries again
            sockets = sorted(p for p in self.registry.glob("*-reg.sock")) if self.registry.exists() else []
            try:
                if sockets:
                    with grpc.insecure_channel(f"unix://{sockets[0]}") as channel:
                        stub = self.reg_rpc.RegistrationStub(channel)
                        info = stub.GetInfo(self.reg_pb.InfoRequest(), timeout=10)
                        assert info.type == "DRAPlugin" and "v1.DRAPlugin" in info.supported_versions, info
                        stub.NotifyRegistrationStatus(self.reg_pb.RegistrationStatus(plugin_registered=True), timeout=10)
                    break
            except grpc.RpcError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"no plugin registered in {self.registry}")
            time.sleep(0.05)
        self.info = info
        self.channel = grpc.insecure_channel(f"unix://{info.endpoint}")
        return info

    def claim(self, namespace: str, uid: str, name: str) -> object:
        return self.dra_pb.Claim(namespace=namespace, uid=uid, name=name)

    def prepare(self, *claims: object) -> object:
        stub = self.dra_rpc.DRAPluginStub(self.channel)
        return stub.NodePrepareResources(self.dra_pb.NodePrepareResourcesRequest(claims=claims), timeout=60)

    def unprepare(self, *claims: object) -> object:
        stub = self.dra_rpc.DRAPluginStub(self.channel)
        return stub.NodeUnprepareResources(self.dra_pb.NodeUnprepareResourcesRequest(claims=claims), timeout=60)

    def health(self, package: str = "v1alpha1", timeout: float = 120.0) -> object:
        """The health stream, called by the method path the kubelet of ``package`` uses."""
        call = self.channel.unary_stream(  # type: ignore[union-attr]
            f"/{package}.DRAResourceHealth/NodeWatchResources",
            request_serializer=self.health_pb.NodeWatchResourcesRequest.SerializeToString,
            response_deserializer=self.health_pb.NodeWatchResourcesResponse.FromString,
        )
        return call(self.health_pb.NodeWatchResourcesRequest(), timeout=timeout)

    def close(self) -> None:
        if self.channel is not None:
            self.channel.close()


class DraNode:
    """A fake GPU node: the API server, the plugin (``start``), the kubelet, the directories they share."""

    def __init__(self, host: FakeHost, tmp: Path, config: Path | None = None, extra: tuple[str, ...] = ()) -> None:
        self.host = host
        self.tmp = tmp
        self.short = Path(tempfile.mkdtemp(prefix="dra-"))  # socket paths stay under 108 bytes
        self.registry = self.short / "registry"
        self.plugins = self.short / "plugin"
        self.cdi = tmp / "cdi"
        self.state = tmp / "state"
        self.kmsg = tmp / "kmsg"
        self.kmsg.write_text("")
        self.config = config or host.write_config()
        self.api = KubeApi()
        self.kubeconfig = self.api.kubeconfig(tmp / "kubeconfig")
        self.kubelet = Kubelet(self.registry, tmp / "protos")
        self.extra = extra
        self.process: subprocess.Popen | None = None
        self.stderr = tmp / "plugin.stderr"

    def command(self) -> list[str]:
        return [*PONYTAIL, "dra-plugin", "-config", str(self.config), "--node-name", NODE, "--kubeconfig", str(self.kubeconfig),
                "--plugin-dir", str(self.plugins), "--registry-dir", str(self.registry), "--cdi-dir", str(self.cdi),
                "--state-dir", str(self.state), "--kmsg", str(self.kmsg), "--hook-path", PONYTAIL[0], *self.extra]

    def start(self, register: bool = True) -> None:
        with open(self.stderr, "ab") as err:
            self.process = subprocess.Popen(self.command(), stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL)
        if register:
            try:
                self.kubelet.register()
            except TimeoutError:
                self.stop()
                raise AssertionError(f"the plugin did not register: {self.log()}") from None

    def log(self) -> str:
        return self.stderr.read_text() if self.stderr.exists() else ""

    def wait_log(self, text: str, timeout: float = 20.0) -> str:
        deadline = time.monotonic() + timeout
        while text not in self.log():
            if time.monotonic() > deadline:
                raise AssertionError(f"{text!r} not in the plugin's log: {self.log()}")
            time.sleep(0.05)
        return self.log()

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=30)
            self.process = None

    def stop(self) -> int:
        if self.process is None:
            return 0
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout=30)
        self.process = None
        return code

    def close(self) -> None:
        self.kubelet.close()
        if self.process is not None:
            self.kill()
        self.api.close()
        shutil.rmtree(self.short, ignore_errors=True)

    def slice(self) -> dict:
        [found] = self.api.slices.values()
        return found

    def spec_files(self) -> list[str]:
        return sorted(os.listdir(self.cdi)) if self.cdi.exists() else []
