"""The bundle edit for a GPU container: the ponytail prestart hook and the device rules.

Pure: a config.json object in, a new one out. The device rules
(``linux.resources.devices``) put the injected nodes in the engine's own device
cgroup (v1 rules, v2 program, and under the systemd cgroup driver the scope's
DeviceAllow=, which is what survives ``systemctl daemon-reload``); the hook allows
the same nodes itself as well (ponytail.apply.cgroup).
"""

from __future__ import annotations

import copy

from ponytail.container.gpu_markers import asks_for_gpus
from ponytail.container.oci import Spec
from ponytail.errors import InputError


def spec_asks_for_gpus(spec: Spec, accept_env_when_unprivileged: bool = True, swarm_variables: tuple[str, ...] = ()) -> bool:
    """The device plugin's list (volume mounts, CDI annotations; not when the engine's CDI has
    injected what the annotations name); else, unless the policy refuses an unprivileged
    container's env, NVIDIA_VISIBLE_DEVICES in process.env (or the Swarm variables ``[request] swarm_resource``
    names; set, not void/empty) or the GPU annotation."""
    from ponytail.container.gpu_markers import is_void
    from ponytail.container.oci import device_plugin_list

    plugin = device_plugin_list(spec)
    if plugin is not None:
        return not is_void(plugin[0])
    if not accept_env_when_unprivileged and not spec.privileged:
        return False
    return asks_for_gpus(spec.env, spec.annotations, swarm_variables)


def add_gpu_hook(spec: dict, hook: dict, devices: tuple[tuple[int, int], ...]) -> dict:
    """``spec`` with ``hook`` added to hooks.prestart (once) and an allow rule per device."""
    edited = copy.deepcopy(spec)
    hooks = _object(edited, "hooks")
    prestart = hooks.setdefault("prestart", [])
    if not isinstance(prestart, list):
        raise InputError("config.json: 'hooks.prestart' is not a list")
    if not any(isinstance(h, dict) and h.get("path") == hook["path"] for h in prestart):
        prestart.append(hook)
    rules = _object(_object(edited, "linux"), "resources").setdefault("devices", [])
    if not isinstance(rules, list):
        raise InputError("config.json: 'linux.resources.devices' is not a list")
    for major, minor in devices:
        rules.append({"allow": True, "type": "c", "major": major, "minor": minor, "access": "rwm"})
    return edited


def _object(parent: dict, key: str) -> dict:
    value = parent.setdefault(key, {})
    if not isinstance(value, dict):
        raise InputError(f"config.json: '{key}' is not an object")
    return value
