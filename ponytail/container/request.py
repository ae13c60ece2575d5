"""What a container asks for (which GPUs that means on this host: ponytail.plan.select)."""

from __future__ import annotations

from ponytail.capabilities import FeatureAsk
from ponytail.container.gpu_markers import VISIBLE_DEVICES_VAR, env_selector, is_void, swarm_devices
from ponytail.errors import InputError, UsageError, quoted
from ponytail.lite.records import record

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported on the hook's path: for type checkers only
    from ponytail.config import Config
    from ponytail.container.oci import Container, Spec


@record(frozen=True)
class DeviceRequest:
    """``selector`` as written (``all``, ``none``, ``void``, ``0,GPU-...``) and who wrote it."""

    selector: str
    source: str

    @property
    def is_void(self) -> bool:
        """Not a GPU container at all: inject nothing."""
        return is_void(self.selector)


def device_request(
    cli_device: str | None, env: dict[str, str] | None, plugin: tuple[str, str] | None = None, accept_env: bool = True,
    swarm_variables: tuple[str, ...] = (),
) -> DeviceRequest:
    """``-device`` wins; then the device plugin's list (volume mounts, CDI annotations); then the
    container's env: NVIDIA_VISIBLE_DEVICES, or Docker Swarm's variables named by ``[request]
    swarm_resource`` where they name fewer GPUs (ponytail.container.gpu_markers.env_selector);
    then ``all``. Without ``accept_env`` (an unprivileged container under ``[request]
    accept_env_when_unprivileged = false``) the env (Swarm's variables too) and the default
    select nothing: only the device plugin gives GPUs."""
    if cli_device is not None:
        return DeviceRequest(cli_device, "-device")
    if plugin is not None:
        return DeviceRequest(*plugin)
    if not accept_env:
        swarm = swarm_devices(env, swarm_variables) if env else None
        asked = env.get(VISIBLE_DEVICES_VAR) if env else None
        what = f"{VISIBLE_DEVICES_VAR}={asked!r}" if asked is not None else "the default (all)"
        if swarm is not None:
            what = f"{swarm[1]}={swarm[0]!r}"
        return DeviceRequest("void", f"{what} refused: unprivileged container and [request] accept_env_when_unprivileged = false")
    try:
        selected = env_selector(env, swarm_variables) if env else None
    except ValueError as e:
        raise InputError(str(e)) from None
    if selected is not None:
        return DeviceRequest(*selected)
    return DeviceRequest("all", "default")


def is_number(text: str) -> bool:
    """ASCII digits only: str.isdigit() also takes '²', which int() refuses."""
    return text.isascii() and text.isdigit()


@record(frozen=True)
class Request:
    """Everything a container asks for, read from its env (or the command line)."""

    devices: DeviceRequest
    capabilities: tuple[str, ...]
    capabilities_source: str
    unknown_capabilities: tuple[str, ...] = ()
    requirements: tuple[tuple[str, str], ...] = ()  # (variable, constraint expression)
    mig_config: DeviceRequest | None = None
    mig_monitor: DeviceRequest | None = None
    # opt-in features (ponytail.capabilities.FEATURES): (name, "all" or channel numbers, who asked)
    features: tuple[FeatureAsk, ...] = ()


def request_for(
    container: Container | Spec, config: Config, *, cli_device: str | None = None, cli_capabilities: str | None = None,
) -> Request:
    """What ``container`` asks for: the hook's Container (from the OCI state) or ponytail-runtime's
    Spec (a bundle's config.json) alike, read by build_request with the container's environment,
    privilege and device-plugin list, and whether its environment is believed ([request]
    accept_env_when_unprivileged, env_namespaces); ``cli_*``: the hook's -device and -capabilities."""
    from ponytail.container.deviceplugin import accepts_env

    return build_request(
        cli_device=cli_device, cli_capabilities=cli_capabilities, env=container.env, privileged=container.privileged,
        plugin=container.plugin_devices, accept_env_when_unprivileged=accepts_env(config, container.annotations),
        plugin_features=container.plugin_features, swarm_variables=config.swarm_resource,
    )


def build_request(
    *, cli_device: str | None = None, cli_capabilities: str | None = None, env: dict[str, str] | None = None, privileged: bool = True,
    plugin: tuple[str, str] | None = None, accept_env_when_unprivileged: bool = True,
    plugin_features: tuple[FeatureAsk, ...] = (), swarm_variables: tuple[str, ...] = (),
) -> Request:
    """Read the NVIDIA conventions: NVIDIA_VISIBLE_DEVICES, NVIDIA_DRIVER_CAPABILITIES,
    NVIDIA_REQUIRE_* (unless NVIDIA_DISABLE_REQUIRE), NVIDIA_MIG_CONFIG_DEVICES and
    NVIDIA_MIG_MONITOR_DEVICES (privileged containers only); ``plugin``: the device plugin's
    list (see device_request). A container's request: request_for."""
    from ponytail.capabilities import DRIVER_CAPABILITIES_VAR, parse_capabilities

    env = env or {}
    if cli_capabilities is not None:
        caps_text, caps_source = cli_capabilities, "--capabilities"
    elif DRIVER_CAPABILITIES_VAR in env:
        caps_text, caps_source = env[DRIVER_CAPABILITIES_VAR], DRIVER_CAPABILITIES_VAR
    else:
        caps_text, caps_source = None, "default"
    capabilities, unknown = parse_capabilities(caps_text)
    if unknown and cli_capabilities is not None:  # an operator's typo is refused; an image's unknown name is a warning
        raise UsageError(unknown_capabilities_message(unknown, caps_source, cli_capabilities))
    mig: dict[str, DeviceRequest] = {}
    for var in (MIG_CONFIG_VAR, MIG_MONITOR_VAR):
        value = env.get(var, "").strip()
        if value and value.lower() not in ("void", "none"):
            if not privileged:
                raise InputError(f"{var}={value!r} is only honoured for privileged containers (with CAP_SYS_ADMIN)")
            mig[var] = DeviceRequest(value, var)
    return Request(
        devices=device_request(cli_device, env, plugin, privileged or accept_env_when_unprivileged, swarm_variables),
        capabilities=capabilities,
        capabilities_source=caps_source,
        unknown_capabilities=unknown,
        requirements=requirements_from_env(env),
        mig_config=mig.get(MIG_CONFIG_VAR),
        mig_monitor=mig.get(MIG_MONITOR_VAR),
        features=requested_features(env if privileged or accept_env_when_unprivileged else {}, plugin_features),
    )


def unknown_capabilities_message(unknown: tuple[str, ...], source: str, text: str | None) -> str:
    """What is wrong with ``source``=``text`` and which names it may hold."""
    from ponytail.capabilities import ALL

    names = ", ".join(quoted(n) for n in unknown)
    return (f"unknown driver capabilit{'ies' if len(unknown) > 1 else 'y'} {names} in {source}={quoted(text or '')}: "
            f"the capabilities are {', '.join(ALL)}, or all")


ENABLED = ("enabled", "true", "yes", "1")


def feature_options(options: tuple[str, ...], option: str = "--feature") -> dict[str, str]:
    """``option NAME[=SELECTOR]`` (repeatable: ``ponytail list``) as the variables a container
    would set (``imex-channel=0,1`` -> NVIDIA_IMEX_CHANNELS=0,1; ``gds`` -> NVIDIA_GDS=enabled), for
    requested_features to read. An IMEX channel list's default is ``all``; the other features take
    no selector. An unknown name is a usage error naming the known ones."""
    from ponytail.capabilities import FEATURES, IMEX_FEATURE

    env: dict[str, str] = {}
    for text in options:
        name, eq, selector = text.partition("=")
        feature = FEATURES.get(name.strip())
        if feature is None:
            raise UsageError(f"{option} {quoted(text)}: unknown feature {quoted(name)}; the features are {', '.join(FEATURES)}")
        if name.strip() == IMEX_FEATURE:
            if eq and not selector.strip():
                raise UsageError(f"{option} {quoted(text)}: name the IMEX channels (all, or numbers such as 0,1)")
            env[feature.variable] = selector if eq else "all"
        elif eq and selector.strip().lower() not in ENABLED:
            raise UsageError(f"{option} {quoted(text)}: {name.strip()} takes no selector (use {option} {name.strip()})")
        else:
            env[feature.variable] = "enabled"
    return env


def requested_features(env: dict[str, str], plugin_features: tuple[FeatureAsk, ...] = ()) -> tuple[FeatureAsk, ...]:
    """The opt-in features asked for: the device plugin's (ponytail.container.deviceplugin) first,
    then each feature's variable (``enabled``; NVIDIA_IMEX_CHANNELS: ``all`` or channel numbers;
    unset, empty, ``none`` or ``void`` ask for nothing). A channel that is not a number is bad input."""
    from ponytail.capabilities import FEATURES, IMEX_FEATURE

    found = {ask.name: ask for ask in plugin_features}
    for name, feature in FEATURES.items():
        value = env.get(feature.variable, "").strip()
        if name in found or value.lower() in ("", "none", "void"):
            continue
        if name != IMEX_FEATURE:
            if value.lower() in ENABLED:  # anything else (disabled, false) asks for nothing
                found[name] = FeatureAsk(name, "all", f"{feature.variable}={value}")
            continue
        if value.lower() == "all":
            found[name] = FeatureAsk(name, "all", f"{feature.variable}={value}")
            continue
        channels = [c.strip() for c in value.split(",") if c.strip()]
        bad = next((c for c in channels if not is_number(c) or len(c) > 9), None)
        if bad is not None:
            raise InputError(f"{feature.variable}={quoted(value)}: {quoted(bad)} is not an IMEX channel number; use all, or numbers such as 0,1")
        found[name] = FeatureAsk(name, ",".join(dict.fromkeys(str(int(c)) for c in channels)), f"{feature.variable}={value}")
    return tuple(found[name] for name in FEATURES if name in found)


MIG_CONFIG_VAR = "NVIDIA_MIG_CONFIG_DEVICES"
MIG_MONITOR_VAR = "NVIDIA_MIG_MONITOR_DEVICES"
REQUIRE_PREFIX = "NVIDIA_REQUIRE_"
DISABLE_REQUIRE_VAR = "NVIDIA_DISABLE_REQUIRE"


def requirements_from_env(env: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """NVIDIA_REQUIRE_* constraints, sorted by name; none when NVIDIA_DISABLE_REQUIRE is true.

    An image that predates NVIDIA_REQUIRE_CUDA but sets CUDA_VERSION (a legacy CUDA
    image) requires a driver supporting at least that CUDA major.minor.
    """
    if env.get(DISABLE_REQUIRE_VAR, "").strip().lower() in ("1", "true", "yes", "on"):
        return ()
    found = sorted((k, v) for k, v in env.items() if k.startswith(REQUIRE_PREFIX) and v.strip())
    if "NVIDIA_REQUIRE_CUDA" not in env and env.get("CUDA_VERSION", "").strip():
        parts = env["CUDA_VERSION"].strip().split(".")
        if len(parts) >= 2 and parts[0].isdigit() and parts[1].isdigit():
            found.append(("CUDA_VERSION", f"cuda>={parts[0]}.{parts[1]}"))
    return tuple(found)
