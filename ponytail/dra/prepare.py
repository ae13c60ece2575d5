"""Prepare and unprepare claims: one CDI spec per claim, from the plan the hooks make, checkpointed.

A claim's spec is ``<cdi dir>/ponytail-dra_<claim uid>.json`` (JSON: a tenth of YAML's cost to write), kind ``<driver>/claim``, one CDI device
per allocated device (``<claim uid>-<device name>``: its own nodes), the claim's shared edits (the
driver's files from the claim's driver tree, the createContainer hook ``ponytail cdi-hook``) beside
them; it is made by the code ``cdi generate`` uses (ponytail.plan.cdi.build_spec on build_plan's
plans) after make_plan, the hooks' own, has checked the claim: the driver tree (registered, trusted,
the kernel module's version), the capabilities and the requirements.

The checkpoint (``<state dir>/checkpoint.json``, replaced atomically) records each claim as
``preparing`` before its spec is written and ``prepared`` with its CDI names after: a second
prepare answers from it, unprepare removes exactly the claim's spec, and a plugin killed
mid-prepare finds the ``preparing`` entry at its next start and removes what it may have written
(the kubelet prepares the claim again). A claim that fails leaves nothing behind. Nothing is
fsynced: a killed plugin's writes are in the page cache, and a node that crashes loses the specs too
(/var/run/cdi is a tmpfs), so an entry whose spec is gone is prepared again, never believed.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass

from ponytail.capabilities import CAPABILITIES
from ponytail.cdi.files import node_arguments, render
from ponytail.config import Config
from ponytail.container.request import build_request
from ponytail.dra.claims import ClaimWork
from ponytail.dra.slices import DeviceEntry
from ponytail.errors import InputError, PonytailError, ProbeError
from ponytail.fs.atomic import replace_file
from ponytail.fs.trust import Untrusted, read_private_file
from ponytail.host.driver_search import find_ldconfig
from ponytail.host.probe import probe_gpus
from ponytail.lite.records import replace
from ponytail.plan.cdi import build_spec, problems
from ponytail.plan.make import make_plan
from ponytail.plan.operations import build_plan
from ponytail.plan.select import Selection

CHECKPOINT = "checkpoint.json"
CHECKPOINT_VERSION = 1
SPEC_PREFIX = "ponytail-dra_"
TYPE_CHECKING = False
if TYPE_CHECKING:
    from ponytail.host.records import Host

_UID_CHARACTERS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-")


@dataclass(frozen=True)
class PreparedDevice:
    request: str
    pool: str
    device: str
    cdi_ids: tuple[str, ...]


class Preparer:
    """Claims in and out, one at a time (a lock: the kubelet may call from several threads)."""

    def __init__(self, config: Config, driver: str, cdi_dir: str, state_dir: str, hook_command: str) -> None:
        self.config, self.driver, self.cdi_dir, self.state_dir, self.hook_command = config, driver, cdi_dir, state_dir, hook_command
        self.lock = threading.Lock()
        os.makedirs(state_dir, mode=0o700, exist_ok=True)
        self.claims: dict[str, dict] = self._read()

    # -- the checkpoint -------------------------------------------------------------------------

    def _read(self) -> dict[str, dict]:
        path = os.path.join(self.state_dir, CHECKPOINT)
        try:  # root's alone, no link followed: the checkpoint decides which specs are removed
            raw = read_private_file(self.state_dir, CHECKPOINT, 1 << 24)
            if raw is None and os.path.lexists(path):
                raise OSError(f"{path} cannot be read")
            data = json.loads(raw) if raw is not None else {"version": CHECKPOINT_VERSION, "claims": {}}
        except (OSError, ValueError, Untrusted) as e:
            raise ProbeError(f"cannot read the DRA checkpoint {path}: {e}; move it aside to start afresh "
                             f"(the claims' specs are {self.cdi_dir}/{SPEC_PREFIX}*.json)") from e
        if not isinstance(data, dict) or data.get("version") != CHECKPOINT_VERSION or not isinstance(data.get("claims"), dict):
            raise ProbeError(f"the DRA checkpoint {path} is not version {CHECKPOINT_VERSION}; move it aside to start afresh")
        return data["claims"]

    def _write(self) -> None:
        data = {"version": CHECKPOINT_VERSION, "driver": self.driver, "claims": self.claims}
        replace_file(os.path.join(self.state_dir, CHECKPOINT), (json.dumps(data, indent=1, sort_keys=True) + "\n").encode(), 0o600,
                     durable=False)  # see the module's docstring

    def recover(self) -> list[str]:
        """At start: remove what a prepare killed midway may have left (its spec, its entry); what was done."""
        done = []
        for uid, entry in list(self.claims.items()):
            check_uid(uid)  # it names the spec file removed
            if entry.get("state") != "prepared":
                self._remove_spec(uid)
                del self.claims[uid]
                done.append(f"claim {entry.get('namespace')}/{entry.get('name')} ({uid}) was being prepared when the plugin stopped: "
                            "its spec removed, the kubelet prepares it again")
        if done:
            self._write()
        return done

    # -- prepare / unprepare -----------------------------------------------------------------------

    def prepare(self, work_of: object, uid: str, namespace: str, name: str, devices: dict[str, DeviceEntry]) -> list[PreparedDevice]:
        """The claim's devices and their CDI names; ``work_of()`` reads the claim (ClaimWork) only
        when it is not prepared yet. PonytailError (one line) when it cannot be; nothing is left then."""
        check_uid(uid)
        with self.lock:
            entry = self.claims.get(uid)
            if entry is not None and entry.get("state") == "prepared" and os.path.exists(self.spec_path(uid)):
                return [PreparedDevice(d["request"], d["pool"], d["device"], tuple(d["cdi_ids"])) for d in entry["devices"]]
            work: ClaimWork = work_of()  # type: ignore[operator]  # a callable, typed loosely for the server's lambda
            self.claims[uid] = {"state": "preparing", "namespace": namespace, "name": name}
            self._write()
            try:
                spec, prepared = self._spec(work, devices)
                os.makedirs(self.cdi_dir, mode=0o755, exist_ok=True)
                replace_file(self.spec_path(uid), render(spec, "json"), 0o644, durable=False)
            except (PonytailError, OSError) as e:
                self._remove_spec(uid)
                del self.claims[uid]
                self._write()
                if isinstance(e, OSError):
                    raise ProbeError(f"cannot write {self.spec_path(uid)}: {e.strerror}") from e
                raise
            self.claims[uid] = {"state": "prepared", "namespace": namespace, "name": name,
                                "devices": [{"request": d.request, "pool": d.pool, "device": d.device, "cdi_ids": list(d.cdi_ids)}
                                            for d in prepared]}
            self._write()
            return prepared

    def unprepare(self, uid: str) -> None:
        """Remove the claim's spec and entry (nothing to do for a claim not prepared here)."""
        check_uid(uid)
        with self.lock:
            self._remove_spec(uid)
            if self.claims.pop(uid, None) is not None:
                self._write()

    def spec_path(self, uid: str) -> str:
        return os.path.join(self.cdi_dir, f"{SPEC_PREFIX}{uid}.json")

    def _remove_spec(self, uid: str) -> None:
        try:
            os.unlink(self.spec_path(uid))
        except FileNotFoundError:
            pass

    # -- the spec ----------------------------------------------------------------------------------

    def _spec(self, work: ClaimWork, devices: dict[str, DeviceEntry]) -> tuple[dict, list[PreparedDevice]]:
        where = f"claim {work.namespace}/{work.name}"
        wanted = []
        for allocated in work.devices:
            entry = devices.get(allocated.device)
            if entry is None:
                raise InputError(f"{where}: device {allocated.device} is not among this node's devices (published: "
                                 f"{', '.join(sorted(devices)) or 'none'}); it was removed after the claim was allocated")
            wanted.append((allocated, entry))

        present = {g.uuid: g for g in probe_gpus(self.config, udev=False, allow_lost=True).gpus}
        for allocated, entry in wanted:
            if entry.gpu_uuid not in present:
                raise ProbeError(f"{where}: GPU {entry.gpu_uuid} ({allocated.device}) is no longer on this node; "
                                 "the claim cannot be prepared here: delete the pod so that it is scheduled again")
        env = {"NVIDIA_REQUIRE_CLAIM": work.require} if work.require else {}
        try:
            request = build_request(cli_device=_selector(wanted, present), cli_capabilities=work.capabilities, env=env)
            driver = (work.driver_tree, f"claim {work.namespace}/{work.name} driverTree") if work.driver_tree else None
            plan, host = make_plan(self.config, request, dry_run=False, udev=False, driver=driver)
        except PonytailError as e:
            raise type(e)(f"{where}: {e.message}") from None
        ldconfig = find_ldconfig(self.config.ldconfig)
        ldconfig = os.path.abspath(ldconfig) if ldconfig else None
        shared = build_plan(host, request, Selection(), {}, ldconfig)
        own_nodes = replace(request, capabilities=tuple(c for c in request.capabilities if CAPABILITIES[c].dri_nodes))
        planned, prepared = [], []
        kind = f"{self.driver}/claim"
        for allocated, entry in wanted:
            selection = _selection(host, entry)
            if selection is None:
                raise ProbeError(f"{where}: GPU {entry.gpu_uuid} ({allocated.device}) is no longer on this node; "
                                 "the claim cannot be prepared here: delete the pod so that it is scheduled again")
            device_plan = build_plan(host, own_nodes, selection, {}, ldconfig, nodes_only=True)
            if device_plan.problems:
                raise ProbeError(f"{where}: device {allocated.device}: {device_plan.problems[0]}")
            cdi_name = f"{work.uid}-{allocated.device}"
            planned.append((cdi_name, device_plan))
            prepared.append(PreparedDevice(allocated.request, allocated.pool, allocated.device, (f"{kind}={cdi_name}",)))
        config_option = ["-config", os.path.abspath(self.config.path)] if self.config.path else []
        options = config_option + ["--driver-version", host.driver_version] + node_arguments(self.config, host)
        spec = build_spec(shared, planned, self.hook_command, options, config_option, kind=kind)
        found = problems(spec)
        if found:  # a bug: never write a spec the engines would refuse
            raise ProbeError(f"{where}: the claim's spec is not valid CDI: {found[0]}")
        del plan  # make_plan's checks were the point; the spec is made of build_plan's plans
        return spec, prepared


def check_uid(uid: str) -> None:
    """A claim UID is a plain name (it becomes part of a file name and of CDI names)."""
    if not 0 < len(uid) <= 64 or not set(uid) <= _UID_CHARACTERS or uid[0] == "-":
        raise InputError(f"claim uid {uid!r} is not a Kubernetes UID")


def _selector(wanted: list, present: dict) -> str:
    """The request's device selector: each GPU by UUID (indices shift), a MIG device as GPU:GI:CI with its GPU's index now."""
    items = []
    for _, entry in wanted:
        items.append(entry.gpu_uuid if entry.mig is None else f"{present[entry.gpu_uuid].index}:{entry.mig[0]}:{entry.mig[1]}")
    return ",".join(dict.fromkeys(items))


def _selection(host: Host, entry: DeviceEntry) -> Selection | None:
    gpu = next((g for g in host.gpus if g.uuid == entry.gpu_uuid), None)
    if gpu is None:
        return None
    if entry.mig is None:
        return Selection((gpu,))
    mig = next((m for m in gpu.mig_devices if (m.gi, m.ci) == entry.mig), None)
    return None if mig is None else Selection((), (mig,))
