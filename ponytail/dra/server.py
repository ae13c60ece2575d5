"""``ponytail dra-plugin``: the kubelet plugin of ponytail's DRA driver.

At start it removes what a prepare killed midway left (ponytail.dra.prepare), probes the GPUs,
publishes the node's ResourceSlice, serves the DRA service (``v1.DRAPlugin``) and the health stream
(``DRAResourceHealth``, as v1alpha1 and v1beta1) on ``<plugin dir>/dra.sock``, and then the kubelet's
registration service on ``<registry dir>/<driver>-reg.sock`` (the kubelet watches that directory), with
ponytail.dra.grpcserver (HTTP/2 on ``h2``: no thread runs while nothing is asked).
Threads follow the node: one probes again on the driver's events (the guard's sources: uevents, the
nodes in /dev) and one every ``resync`` seconds, republishing the slice when the GPUs, the driver or
the trees changed; one reads the kernel log for Xids
(ponytail.dra.health), marks the GPU unhealthy on the health stream, taints its slice device and
names the container that caused it (noting the Xid beside its record, for ``ponytail guard``). SIGTERM removes both sockets (the kubelet then deregisters the
driver); the slice stays for the next start.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import stat
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ponytail.apply.containerrecord import note_xid
from ponytail.config import Config
from ponytail.dra import health, protos
from ponytail.dra.claims import claim_work
from ponytail.dra.grpcserver import Server
from ponytail.dra.kube import Kube, KubeError
from ponytail.dra.prepare import Preparer
from ponytail.dra.slices import DeviceEntry, device_entries, slice_name, slice_object
from ponytail.errors import PonytailError, ProbeError, UsageError, one_line, os_failure
from ponytail.guard.events import FifoEvents, NodeEvents, UdevEvents, relevant
from ponytail.host.cuda import cuda_driver_version, format_cuda_version
from ponytail.host.driver_search import find_driver_file
from ponytail.host.driver_trees import describe_trees
from ponytail.host.probe import probe_gpus

DEFAULT_DRIVER = "gpu.ponytail.example.com"
NVIDIA_DRIVER = "gpu.nvidia.com"
SUPPORTED_VERSIONS = ["v1.DRAPlugin"]
HEALTH_PACKAGES = ("v1alpha1", "v1beta1")  # kubelet 1.34-1.36 call v1alpha1, later ones v1beta1
HEALTH_RESEND_S = 300.0  # the stream is sent again this often even without news...
HEALTH_TIMEOUT_S = 900  # ...well inside the timeout it gives the kubelet
RETRY_S = 10.0  # a failed publication is tried again this soon
SETTLE_S = 0.3  # the driver's events come in bursts


@dataclass
class Settings:
    driver: str = DEFAULT_DRIVER
    node: str = ""
    plugin_dir: str = ""  # default /var/lib/kubelet/plugins/<driver>
    registry_dir: str = "/var/lib/kubelet/plugins_registry"
    cdi_dir: str = "/var/run/cdi"
    state_dir: str = "/var/lib/ponytail/dra"
    kmsg: str = "/dev/kmsg"
    kubeconfig: str | None = None
    service_account_dir: str | None = None
    resync_s: float = 60.0
    hook_command: str = ""
    xid_effects: dict[int, str] = field(default_factory=dict)
    events: str = ""  # tests: events from this FIFO instead of the kernel's and /dev's


class Plugin:
    def __init__(self, settings: Settings, config: Config) -> None:
        self.s, self.config = settings, config
        if not settings.plugin_dir:
            settings.plugin_dir = f"/var/lib/kubelet/plugins/{settings.driver}"
        self.registration_socket = os.path.join(settings.registry_dir, f"{settings.driver}-reg.sock")
        self.dra_socket = os.path.join(settings.plugin_dir, "dra.sock")
        self.kube = Kube(settings.kubeconfig, settings.service_account_dir)
        self.preparer = Preparer(config, settings.driver, settings.cdi_dir, settings.state_dir, settings.hook_command)
        self.stopping = threading.Event()
        self.changed = threading.Condition()
        self.health_version = 0
        self.entries: dict[str, DeviceEntry] = {}
        self.unhealthy: dict[str, tuple[str, list[dict]]] = {}  # device -> (message, taints)
        self.published: dict | None = None
        self.probe_key: tuple = ()
        self.servers: list[Any] = []
        self.publishing = threading.Lock()  # the resync and kernel-log threads both publish
        self.resyncing = threading.Lock()  # the resync and events threads both probe

    # -- start and stop --------------------------------------------------------------------------

    def start(self) -> None:
        self._refuse_beside_another()
        for line in self.preparer.recover():
            self.say(line)
        self.resync(force=True)

        os.makedirs(self.s.plugin_dir, mode=0o750, exist_ok=True)
        os.makedirs(self.s.registry_dir, mode=0o750, exist_ok=True)
        # one server on both sockets (the kubelet asks each only for its own services), ponytail.dra.grpcserver's:
        # it sleeps in select() when idle, where grpcio's server woke five times a second
        server = Server(on_cancel=self._wake_streams)
        self._registration_service(server)
        self._dra_service(server)
        for package in HEALTH_PACKAGES:
            self._health_service(server, package)
        _bind(server, self.dra_socket)
        _bind(server, self.registration_socket)  # last: the kubelet registers the plugin once this socket appears
        server.start()
        self.servers = [server]
        threading.Thread(target=self._kept, args=(self._resync_loop,), name="resync", daemon=True).start()
        sources = self._event_sources()
        if sources:
            threading.Thread(target=self._kept, args=(lambda: self._events_loop(sources),), name="events", daemon=True).start()
        if self.s.kmsg:
            threading.Thread(target=self._kept, args=(self._kmsg_loop,), name="kmsg", daemon=True).start()
        self.say(f"serving {self.s.driver} on node {self.s.node}: {len(self.entries)} device(s), registration {self.registration_socket}")

    def stop(self) -> None:
        self.stopping.set()
        self._wake_streams()
        for server in self.servers:
            server.stop()
        for path in (self.registration_socket, self.dra_socket):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass

    def _wake_streams(self) -> None:
        """Wake the health streams' waits: the plugin stops, or a client cancelled one."""
        with self.changed:
            self.changed.notify_all()

    def say(self, line: str) -> None:
        print(f"ponytail dra-plugin: {line}", file=sys.stderr, flush=True)

    def _refuse_beside_another(self) -> None:
        """Another live plugin on the registration socket (NVIDIA's, with its driver name) is an
        error; a stale socket of an earlier run is removed."""
        if not os.path.exists(self.registration_socket):
            return
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(self.registration_socket)
        except OSError:
            os.unlink(self.registration_socket)  # nobody answers: an earlier run's
            return
        finally:
            probe.close()
        who = "NVIDIA's DRA kubelet plugin" if self.s.driver == NVIDIA_DRIVER else "another kubelet plugin"
        raise UsageError(f"{who} already serves driver {self.s.driver} on this node ({self.registration_socket} answers): "
                         "remove it first, or give ponytail's plugin its own --driver-name")

    # -- the node's devices -----------------------------------------------------------------------

    def resync(self, force: bool = False) -> bool:
        """Probe again; publish the slice when something changed (or ``force``). False when publishing failed."""
        with self.resyncing:
            return self._resync(force)

    def _resync(self, force: bool) -> bool:
        try:
            found = probe_gpus(self.config, udev=False, allow_lost=True)
        except PonytailError as e:
            self.say(f"probe failed: {e.message}; no devices published until it works")
            found = None
        if found is None:
            entries: list[DeviceEntry] = []
            key: tuple = ("no driver",)
        else:
            trees = sorted(t.name for t, _, problem in describe_trees(self.config, found.driver_version) if problem is None)
            key = (found.driver_version, found.gpus, tuple(trees))
            if key == self.probe_key and not force:
                return True
            entries = device_entries(found.gpus, found.driver_version, self._cuda_version(found.driver_version), trees)
        self.probe_key = key
        self.entries = {e.name: e for e in entries}
        return self.publish()

    def _cuda_version(self, driver_version: str) -> str | None:
        try:
            libcuda = find_driver_file(self.config, driver_version, "libcuda", "libcuda.so.1").path
            return format_cuda_version(cuda_driver_version(self.config.driver_root, libcuda, self.config.cache_dir, self.config.timeout_probe))
        except PonytailError as e:
            self.say(f"no cudaDriverVersion attribute: {e.message}")
            return None

    def publish(self) -> bool:
        """Make the node's slice say ``entries`` with their taints (and remove any other of this driver's for the node)."""
        with self.publishing:
            return self._publish()

    def _publish(self) -> bool:
        taints = {name: t for name, (_, t) in self.unhealthy.items() if name in self.entries and t}
        name = slice_name(self.s.node, self.s.driver)
        try:
            existing = self.kube.slices(self.s.node, self.s.driver)
            mine = next((s for s in existing if s.get("metadata", {}).get("name") == name), None)
            for other in existing:
                if other is not mine:
                    self.kube.delete_slice(other["metadata"]["name"])
            generation = int(((mine or {}).get("spec") or {}).get("pool", {}).get("generation", 0))
            wanted = slice_object(self.s.driver, self.s.node, generation or 1, list(self.entries.values()), taints)
            if mine is not None and mine.get("spec", {}).get("devices", []) == wanted["spec"]["devices"]:
                self.published = mine
                return True
            if mine is None:
                self.published = self.kube.create_slice(wanted)
            else:
                wanted["spec"]["pool"]["generation"] = generation + 1
                wanted["metadata"]["resourceVersion"] = mine["metadata"].get("resourceVersion", "")
                self.published = self.kube.replace_slice(wanted)
            self.say(f"published ResourceSlice {name}: {len(self.entries)} device(s), {len(taints)} tainted")
            return True
        except (KubeError, KeyError, TypeError, ValueError) as e:
            self.say(f"cannot publish the ResourceSlice {name}: {one_line(str(e))}; trying again in {RETRY_S:.0f} s")
            return False

    def _kept(self, loop: Any) -> None:
        """Run a background ``loop`` (resync, driver events, kernel log) until the plugin stops: an
        error it did not expect is said in one line and the loop starts again after RETRY_S, so the
        slice and the health never stop silently while the plugin serves."""
        while not self.stopping.is_set():
            try:
                loop()
                return
            except Exception as e:  # noqa: BLE001 - a background loop must outlive its bug: said, then started again
                name = threading.current_thread().name
                self.say(f"the {name} loop failed: {type(e).__name__}: {one_line(str(e))}; starting it again in {RETRY_S:.0f} s")
                self.stopping.wait(RETRY_S)

    def _resync_loop(self) -> None:
        ok = True
        while not self.stopping.wait(self.s.resync_s if ok else min(RETRY_S, self.s.resync_s)):
            ok = self.resync(force=not ok)

    def _event_sources(self) -> list[Any]:
        """The guard's event sources (ponytail.guard.events): the kernel's uevents and the driver's
        nodes in /dev, or a test FIFO; one that cannot be opened is said, and the resync still runs."""
        if self.s.events:
            return [FifoEvents(self.s.events)]
        sources: list[Any] = []
        for name, make in (("the kernel's uevents", UdevEvents), ("/dev", lambda: NodeEvents(self.config.dev_root))):
            try:
                sources.append(make())
            except (OSError, ImportError) as e:
                self.say(f"no events from {name} ({e}): the GPUs are probed every {self.s.resync_s:g} s only")
        return sources

    def _events_loop(self, sources: list[Any]) -> None:
        """A probe on each burst of the driver's events (modules, GPUs added or removed, MIG's nodes): as the guard."""
        while not self.stopping.is_set():
            ready, _, _ = select.select(sources, [], [])
            events = [e for source in sources if source in ready for e in source.receive() if relevant(e)]
            if not events:
                continue
            time.sleep(SETTLE_S)  # a module load makes every node: act once the burst is over
            events += [e for source in sources for e in source.receive() if relevant(e)]
            self.say(f"{len(events)} driver event(s) ({', '.join(' '.join(e) for e in events[:3])}): probing again")
            self.resync()

    # -- health -----------------------------------------------------------------------------------

    def _kmsg_loop(self) -> None:
        while not self.stopping.is_set():
            try:
                fd = os.open(self.s.kmsg, os.O_RDONLY | os.O_CLOEXEC)
            except OSError as e:
                self.say(f"cannot read the kernel log {self.s.kmsg}: {e.strerror}; no GPU health from it")
                return
            regular = stat.S_ISREG(os.fstat(fd).st_mode)
            pending = b""
            try:
                while not self.stopping.is_set():
                    try:
                        chunk = os.read(fd, 8192)
                    except BrokenPipeError:  # /dev/kmsg: records were overwritten before we read them
                        continue
                    if not chunk:
                        if not regular:
                            break  # a FIFO's writer went away: open it again
                        time.sleep(1.0)
                        continue
                    lines = (pending + chunk).split(b"\n")  # /dev/kmsg gives a record per read, a file or FIFO any bytes
                    pending = lines.pop()
                    for line in lines:
                        self.on_kernel_line(line.decode("utf-8", "replace"))
            finally:
                os.close(fd)

    def on_kernel_line(self, line: str) -> None:
        event = health.parse_kmsg(line)
        if event is None:
            return
        device = next((e for e in self.entries.values() if health.matches_bus(event.bus_id, e.bus_id)), None)
        effect = health.effect_of(event.xid, self.s.xid_effects)
        record = health.record_of_pid(self.config.records_dir, event.pid) if event.pid else None
        container = str(record["id"]) if record else None
        who = f", pid {event.pid} ({event.process or '?'})" + (f" in container {container}" if container else "") if event.pid else ""
        if record is not None:
            self._note_xid(record, event, device)
        if device is None:
            self.say(f"Xid {event.xid} on {event.bus_id}, not a device of this plugin{who}: {event.text}")
            return
        self.say(f"Xid {event.xid} on {device.name} ({device.gpu_uuid}){who}: {event.text} -> "
                 f"{'reported only' if effect == 'None' else effect}")
        if effect == "None":
            return
        names = [e.name for e in self.entries.values() if e.gpu_uuid == device.gpu_uuid]  # a GPU's MIG devices fall with it
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        for name in names:
            message, taints = self.unhealthy.get(name, ("", []))
            key = f"{self.s.driver}/xid"
            if not any(t["key"] == key and t["value"] == str(event.xid) for t in taints):
                taints = [t for t in taints if t["key"] != key or t["effect"] != effect] + [
                    {"key": key, "value": str(event.xid), "effect": effect, "timeAdded": stamp}]
            self.unhealthy[name] = (f"Xid {event.xid}{who}: {event.text}"[:1024], taints)
        with self.changed:
            self.health_version += 1
            self.changed.notify_all()
        self.publish()

    def _note_xid(self, record: dict, event: health.XidEvent, device: DeviceEntry | None) -> None:
        """Note the Xid beside the container's record, for ``ponytail guard`` to show."""
        xid = {"xid": event.xid, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "bus_id": event.bus_id,
               "gpu": device.gpu_uuid if device else event.bus_id, "device": device.name if device else "",
               "pid": event.pid, "process": event.process[:64], "text": event.text[:256], "driver": self.s.driver}
        try:
            note_xid(self.config.records_dir, record, xid)
        except (OSError, ValueError) as e:
            self.say(f"cannot note Xid {event.xid} for container {record.get('id')} in {self.config.records_dir}: {e}")

    def health_response(self, api: Any) -> Any:
        response = api.NodeWatchResourcesResponse()
        now = int(time.time())
        for name in sorted(self.entries):
            bad = self.unhealthy.get(name)
            item = response.devices.add(health=2 if bad else 1, last_updated_time=now, health_check_timeout_seconds=HEALTH_TIMEOUT_S,
                                        message=bad[0] if bad else "")
            item.device.pool_name, item.device.device_name = self.s.node, name
        return response

    # -- gRPC -----------------------------------------------------------------------------------

    def _registration_service(self, server: Any) -> None:
        api = protos.load("pluginregistration.proto")

        def get_info(request: Any, context: Any) -> Any:
            return api.PluginInfo(type="DRAPlugin", name=self.s.driver, endpoint=self.dra_socket, supported_versions=SUPPORTED_VERSIONS)

        def notify(request: Any, context: Any) -> Any:
            if request.plugin_registered:
                self.say("registered with the kubelet")
            else:
                self.say(f"the kubelet refused the registration: {request.error}")
            return api.RegistrationStatusResponse()

        _serve(server, api, "pluginregistration.Registration", {"GetInfo": get_info, "NotifyRegistrationStatus": notify})

    def _dra_service(self, server: Any) -> None:
        api = protos.load("dra_v1.proto")

        def prepare(request: Any, context: Any) -> Any:
            response = api.NodePrepareResourcesResponse()
            for claim in request.claims:
                out = response.claims[claim.uid]
                try:
                    devices = self.preparer.prepare(
                        lambda c=claim: claim_work(self.kube.claim(c.namespace, c.name), c.uid, self.s.driver, self.s.node),
                        claim.uid, claim.namespace, claim.name, dict(self.entries))
                except (PonytailError, OSError) as e:
                    out.error = one_line(e.message if isinstance(e, PonytailError) else f"{e.filename}: {e.strerror}")
                    self.say(f"prepare {claim.namespace}/{claim.name} ({claim.uid}) failed: {out.error}")
                    continue
                for d in devices:
                    out.devices.add(request_names=[d.request], pool_name=d.pool, device_name=d.device, cdi_device_ids=list(d.cdi_ids))
                self.say(f"prepared {claim.namespace}/{claim.name} ({claim.uid}): {', '.join(i for d in devices for i in d.cdi_ids)}")
            return response

        def unprepare(request: Any, context: Any) -> Any:
            response = api.NodeUnprepareResourcesResponse()
            for claim in request.claims:
                out = response.claims[claim.uid]
                try:
                    self.preparer.unprepare(claim.uid)
                    self.say(f"unprepared {claim.namespace}/{claim.name} ({claim.uid})")
                except (PonytailError, OSError) as e:
                    out.error = one_line(e.message if isinstance(e, PonytailError) else f"{e.filename}: {e.strerror}")
            return response

        _serve(server, api, "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin", {"NodePrepareResources": prepare, "NodeUnprepareResources": unprepare})

    def _health_service(self, server: Any, package: str) -> None:
        api = protos.load("dra_health.proto", package)

        def watch(request: Any, context: Any) -> Any:
            seen = [-1]  # the version last sent
            while not self.stopping.is_set() and context.is_active():
                with self.changed:
                    self.changed.wait_for(lambda: self.health_version != seen[0] or self.stopping.is_set() or not context.is_active(),
                                          timeout=HEALTH_RESEND_S)
                    seen[0] = self.health_version
                if self.stopping.is_set() or not context.is_active():
                    return
                yield self.health_response(api)

        _serve(server, api, f"{package}.DRAResourceHealth", {"NodeWatchResources": watch})


def _serve(server: Any, api: protos.Api, service: str, functions: dict[str, Any]) -> None:
    for method in api.services[service]:
        server.add_method(service, method.name, method.request, functions[method.name], method.server_streaming)


def _bind(server: Any, path: str) -> None:
    if len(path.encode()) > 107:
        raise UsageError(f"socket path {path} is longer than the 107 bytes a Unix socket allows: choose a shorter directory")
    server.bind(path)


def run(settings: Settings, config: Config) -> int:
    """Run until SIGTERM or SIGINT; the exit status."""
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    try:
        plugin = Plugin(settings, config)
        plugin.start()
    except OSError as e:  # a directory that cannot be made, a socket that cannot be bound

        raise os_failure(f"dra-plugin cannot start ({e.filename or 'a socket'})", e, ProbeError) from None
    try:
        done.wait()
    finally:
        plugin.say("stopping")
        plugin.stop()
    return 0
