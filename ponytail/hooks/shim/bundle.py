"""Prepare a bundle before the real runtime creates the container: if it asks for GPUs,
add the ponytail prestart hook and the device rules to its config.json (atomically)."""

from __future__ import annotations

import json
import os

from ponytail.config import Config
from ponytail.container.oci import Spec, device_plugin_list, read_bundle_config, read_spec
from ponytail.errors import InjectionError, InputError, PonytailError
from ponytail.fs.atomic import replace_file
from ponytail.hooks.shim.edit import add_gpu_hook, spec_asks_for_gpus
from ponytail.logfile import RunLog


def prepare_bundle(bundle: str, container_id: str | None, config: Config, config_error: PonytailError | None) -> None:
    """Edit ``bundle``/config.json for a GPU container; leave every other bundle untouched."""
    from ponytail.container.deviceplugin import accepts_env

    try:
        raw = read_bundle_config(bundle)
        spec = read_spec(raw, f"{bundle}/config.json", config)
        accept_env = accepts_env(config, spec.annotations)
        wanted = spec_asks_for_gpus(spec, accept_env, config.swarm_resource)
        refused = not wanted and not accept_env and spec_asks_for_gpus(spec, True, config.swarm_resource)
        plugin = device_plugin_list(spec)
    except InputError:
        return  # a bundle the runtime cannot use either: it reports that in its own words
    if spec.handover_refused is not None:  # a pod's own cdi.k8s.io/* annotations: no hook, no device rule for them
        _note(config, container_id, f"ponytail-runtime: {spec.handover_refused}", "warning")
    if plugin is not None and not wanted:  # the engine's CDI injected the devices: say so, add nothing
        _note(config, container_id, f"ponytail-runtime: not adding the hook: {plugin[1]}")
        return
    if refused:  # the container starts, without GPUs; say why where the operator looks
        _note(config, container_id, "ponytail-runtime: not a GPU container: its own NVIDIA_VISIBLE_DEVICES (or GPU annotation) "
              "refused: unprivileged container, [request] accept_env_when_unprivileged = false, and its pod's namespace "
              "is not one of [request] env_namespaces")
    if not wanted:
        return
    if config_error is not None:
        raise config_error
    from ponytail.hooks.command import installed_command

    command = installed_command("ponytail")
    if command is None:
        raise InjectionError("cannot find the ponytail command beside ponytail-runtime; reinstall ponytail")
    args = ["ponytail", "-config", config.path] if config.path else ["ponytail"]
    devices, note = device_rules(config, spec)
    write_bundle_config(bundle, add_gpu_hook(raw, {"path": command, "args": args}, devices))
    log = RunLog(config.log_file)
    log.context = container_id or "-"
    if note:
        log.write("warning", f"ponytail-runtime: no device rules ({note}); the hook will report it")
    log.write(
        "info",
        f"ponytail-runtime: GPU container: added the prestart hook ({command}) and {len(devices)} device rule(s) "
        f"to {bundle}/config.json",
    )
    log.close()


def _note(config: Config, container_id: str | None, text: str, level: str = "info") -> None:
    """One line in ponytail's log, for the container."""
    log = RunLog(config.log_file)
    log.context = container_id or "-"
    log.write(level, text)
    log.close()


def device_rules(config: Config, spec: Spec) -> tuple[tuple[tuple[int, int], ...], str]:
    """(major, minor) of every node the hook will inject: the plan's AllowDevices, and a note if none.

    The container's requirements (NVIDIA_REQUIRE_*) are left to the hook, which checks them."""
    from ponytail.container.request import request_for
    from ponytail.lite.records import replace
    from ponytail.plan.make import make_plan
    from ponytail.plan.operations import AllowDevices

    try:
        request = request_for(spec, config)
        if request.devices.is_void:
            return (), ""
        plan, _ = make_plan(config, replace(request, requirements=()), dry_run=True, udev=False)
    except PonytailError as e:
        return (), e.message
    return next((op.devices for op in plan.operations if isinstance(op, AllowDevices)), ()), ""


def write_bundle_config(bundle: str, spec: dict) -> None:
    """Replace ``bundle``/config.json in one rename, keeping its mode."""
    path = os.path.join(bundle, "config.json")
    try:
        replace_file(path, json.dumps(spec).encode(), keep_mode=True)
    except OSError as e:
        raise InjectionError(f"cannot rewrite {path}: {e.strerror}") from e
