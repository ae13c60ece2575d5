"""Plans as a CDI spec: plain data (dicts, lists, strings, ints), for JSON or YAML.

Pure. The shared edits are the plan for no GPU at all (control nodes, libraries, binaries,
firmware, sockets; its SONAME links, masked /proc/driver/nvidia and linker cache become the
arguments of one createContainer hook, ``ponytail cdi-hook``); each device's edits are the
device nodes its own plan adds to those. Nothing here looks at the host: the plans did.

The spec declares the lowest cdiVersion whose features it uses (``required_version``), as the
CDI specification's version table defines them, so older engines (podman 4.3 reads 0.3.0 to
0.5.0 and silently drops newer specs) take it. ``problems`` checks a spec against what the
specification requires of it.
"""

from __future__ import annotations

from ponytail.plan.operations import LinkerCache, Mount, Operation, Plan, ProcMask, Symlink

KIND = "nvidia.com/gpu"
VOID_ENV = "NVIDIA_VISIBLE_DEVICES=void"  # so the legacy prestart hook injects nothing as well
HOOK_STAGE = "createContainer"
# every released version, oldest first; engines accept 0.3.0 and later
VERSIONS = ("0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0")
HOOK_NAMES = ("prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop")
DEVICE_PERMISSIONS = "rw"  # as the plan's AllowDevices rules


def build_spec(
    shared: Plan, devices: list[tuple[str, Plan]], hook_command: str, hook_options: list[str], device_hook_options: list[str] | None = None,
    kind: str = KIND,
) -> dict:
    """The spec of ``kind`` offering ``devices`` (name, the plan for that device alone) beside
    the ``shared`` plan (for no device); its hook runs ``hook_command cdi-hook *hook_options``.
    A device whose plan links its nodes (a GPU's /dev/dri/by-path links) has a hook of its own,
    ``hook_command cdi-hook *device_hook_options --device-link ...``: a container given that
    device gets its links and no other's."""
    shared_nodes = _device_nodes(shared.operations)
    shared_paths = {node["path"] for node in shared_nodes}
    entries = []
    for name, plan in devices:
        nodes = [node for node in _device_nodes(plan.operations) if node["path"] not in shared_paths]
        device_edits: dict = {"deviceNodes": nodes}
        device_hooks = _hooks(plan, hook_command, device_hook_options or [])
        if device_hooks:
            device_edits["hooks"] = device_hooks
        entries.append({"name": name, "containerEdits": device_edits})
    edits: dict = {"env": [VOID_ENV]}
    edits["deviceNodes"] = shared_nodes
    edits["mounts"] = [_mount(op) for op in shared.operations if isinstance(op, Mount) and op.kind != "device"]
    hooks = _hooks(shared, hook_command, hook_options)
    if hooks:
        edits["hooks"] = hooks
    spec = {"cdiVersion": "", "kind": kind, "devices": entries, "containerEdits": edits}
    spec["cdiVersion"] = required_version(spec)
    return spec


def build_feature_spec(kind: str, devices: list[tuple[str, list[Mount]]]) -> dict:
    """The spec of an opt-in feature's ``kind`` (``nvidia.com/gds``): each device its nodes and
    read-only files, nothing shared and no hook (a feature needs no work inside the container)."""
    entries = []
    for name, ops in devices:
        edits: dict = {"deviceNodes": _device_nodes(tuple(ops))}
        mounts = [_mount(op) for op in ops if op.kind != "device"]
        if mounts:
            edits["mounts"] = mounts
        entries.append({"name": name, "containerEdits": edits})
    spec = {"cdiVersion": "", "kind": kind, "devices": entries}
    spec["cdiVersion"] = required_version(spec)
    return spec


def _hooks(plan: Plan, hook_command: str, options: list[str]) -> list[dict]:
    """The createContainer hook doing ``plan``'s in-container work, if it has any."""
    args = hook_arguments(plan, options)
    return [{"hookName": HOOK_STAGE, "path": hook_command, "args": ["ponytail", "cdi-hook", *args]}] if args else []


def hook_arguments(plan: Plan, options: list[str]) -> list[str]:
    """The plan's in-container work (SONAME links, a device node's links, the masked
    /proc/driver/nvidia, the linker cache) as ``ponytail cdi-hook`` arguments; empty when there
    is none."""
    args: list[str] = []
    for op in plan.operations:
        if isinstance(op, Symlink):
            args += ["--link", op.target, op.link_to, op.library] if op.library else ["--device-link", op.target, op.link_to]
        elif isinstance(op, ProcMask):
            args.append("--mask-proc")
        elif isinstance(op, LinkerCache):
            args += ["--ldconfig", op.ldconfig]
            for directory in op.directories:
                args += ["--directory", directory]
            for soname, path in op.sonames:
                args += ["--check", soname, path]
    return options + args if args else []


def required_version(spec: dict) -> str:
    """The lowest cdiVersion that has every feature ``spec`` uses (the specification's table:
    0.4.0 a mount's ``type``; 0.5.0 a device node's ``hostPath``, a device name starting with
    a digit; 0.6.0 annotations, a dot in the kind's class; 0.7.0 ``intelRdt``,
    ``additionalGids``; 1.1.0 ``netDevices``, ``intelRdt.schemata``/``enableMonitoring``)."""
    devices = spec.get("devices") or []
    edits = [spec.get("containerEdits") or {}] + [d.get("containerEdits") or {} for d in devices]
    rdts = [e["intelRdt"] for e in edits if e.get("intelRdt") is not None]
    if any(e.get("netDevices") for e in edits) or any(r.get("schemata") is not None or r.get("enableMonitoring") for r in rdts):
        return "1.1.0"
    if rdts or any(e.get("additionalGids") for e in edits):
        return "0.7.0"
    if spec.get("annotations") or any(d.get("annotations") for d in devices) or "." in str(spec.get("kind", "")).partition("/")[2]:
        return "0.6.0"
    if any(str(d.get("name", ""))[:1].isdigit() for d in devices) or any(n.get("hostPath") for e in edits for n in e.get("deviceNodes") or []):
        return "0.5.0"
    if any(m.get("type") for e in edits for m in e.get("mounts") or []):
        return "0.4.0"
    return "0.3.0"


_ALNUM = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")


def _name_of(text: str, inner: str) -> bool:
    """``text`` begins and ends with an ASCII letter or digit, with only those and the
    characters of ``inner`` between (the CDI specification's name syntax; plain string
    work, so that ``cdi generate`` and the CDI hook import no ``re``)."""
    return bool(text) and text[0] in _ALNUM and text[-1] in _ALNUM and all(c in _ALNUM or c in inner for c in text)


def _label(text: str) -> bool:
    return _name_of(text, "-")


def _class(text: str) -> bool:
    return _name_of(text, "_.-")


def _device_name(text: str) -> bool:
    return _name_of(text, "_.:-")


def problems(spec: object) -> list[str]:
    """What in ``spec`` the CDI specification does not allow (empty: a valid spec)."""
    if not isinstance(spec, dict):
        return ["a CDI spec is an object"]
    found: list[str] = []
    version = spec.get("cdiVersion")
    if version not in VERSIONS:
        found.append(f"cdiVersion {version!r} is not a released CDI version ({', '.join(VERSIONS)})")
    kind = spec.get("kind")
    found += kind_problems(kind)
    unknown = set(spec) - {"cdiVersion", "kind", "annotations", "devices", "containerEdits"}
    if unknown:
        found.append(f"unknown field(s) {', '.join(sorted(unknown))}")
    devices = spec.get("devices")
    if not isinstance(devices, list) or not devices:
        found.append("'devices' must list at least one device")
        devices = []
    seen: set[str] = set()
    for device in devices:
        name = device.get("name") if isinstance(device, dict) else None
        if not isinstance(name, str) or not _device_name(name):
            found.append(f"device name {name!r}: letters, digits, '_', '-', '.', ':', beginning and ending with a letter or digit")
            continue
        if name in seen:
            found.append(f"device {name!r} is listed twice")
        seen.add(name)
        edits = device.get("containerEdits")
        if not isinstance(edits, dict) or not any(edits.get(k) for k in ("env", "deviceNodes", "hooks", "mounts", "intelRdt", "additionalGids", "netDevices")):
            found.append(f"device {name!r} has no container edits")
        else:
            found += [f"device {name!r}: {p}" for p in _edit_problems(edits)]
    shared = spec.get("containerEdits")
    if shared is not None:
        found += _edit_problems(shared) if isinstance(shared, dict) else ["'containerEdits' must be an object"]
    if version in VERSIONS and not found:
        needed = required_version(spec)
        if VERSIONS.index(needed) > VERSIONS.index(version):
            found.append(f"cdiVersion {version} is too low for the features used: they need {needed}")
    return found


def kind_problems(kind: object) -> list[str]:
    """``vendor/class``: the vendor a DNS subdomain, the class a name of at most 63 characters."""
    if not isinstance(kind, str) or kind.count("/") != 1:
        return [f"kind {kind!r} must be vendor/class (e.g. {KIND})"]
    vendor, name = kind.split("/")
    found = []
    if not vendor or len(vendor) > 253 or not all(_label(label) for label in vendor.split(".")) or not vendor[0].isalpha():
        found.append(f"kind {kind!r}: the vendor {vendor!r} must be a DNS subdomain starting with a letter")
    if not name or len(name) > 63 or not _class(name) or not name[0].isalpha():
        found.append(f"kind {kind!r}: the class {name!r} must be a name of at most 63 characters starting with a letter")
    return found


def _edit_problems(edits: dict) -> list[str]:
    for key in ("env", "deviceNodes", "mounts", "hooks"):
        items = edits.get(key)
        if items is not None and (not isinstance(items, list) or not all(isinstance(i, str if key == "env" else dict) for i in items)):
            return [f"'{key}' must be a list of {'strings' if key == 'env' else 'objects'}"]
    found = []
    for item in edits.get("env") or []:
        if not isinstance(item, str) or "=" not in item:
            found.append(f"env entry {item!r} is not VAR=VALUE")
    for node in edits.get("deviceNodes") or []:
        if not node.get("path"):
            found.append("a device node without 'path'")
        if node.get("type", "") not in ("", "b", "c", "u", "p"):
            found.append(f"device node {node.get('path')!r}: type {node.get('type')!r}")
        if node.get("permissions", "").strip("rwm"):
            found.append(f"device node {node.get('path')!r}: permissions {node.get('permissions')!r} (r, w, m)")
    for mount in edits.get("mounts") or []:
        if not mount.get("hostPath") or not mount.get("containerPath"):
            found.append(f"mount {mount!r} needs 'hostPath' and 'containerPath'")
    for hook in edits.get("hooks") or []:
        if hook.get("hookName") not in HOOK_NAMES:
            found.append(f"hook name {hook.get('hookName')!r} is none of {', '.join(HOOK_NAMES)}")
        if not str(hook.get("path", "")).startswith("/"):
            found.append(f"hook path {hook.get('path')!r} must be absolute")
        if not all(isinstance(e, str) and "=" in e for e in hook.get("env") or []):
            found.append("a hook env entry is not VAR=VALUE")
    return found


def _device_nodes(operations: tuple[Operation, ...]) -> list[dict]:
    """The CDI deviceNodes of the device-node mounts among ``operations``, in order."""
    nodes = []
    for op in operations:
        if isinstance(op, Mount) and op.kind == "device" and op.rdev is not None:
            node: dict = {"path": op.target}
            if op.source != op.target:
                node["hostPath"] = op.source
            node.update(type="c", major=op.rdev[0], minor=op.rdev[1], permissions=DEVICE_PERMISSIONS)
            nodes.append(node)
    return nodes


def _mount(op: Mount) -> dict:
    return {"hostPath": op.source, "containerPath": op.target, "options": [*op.options, "bind"]}

