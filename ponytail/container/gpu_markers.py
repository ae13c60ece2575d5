"""When a container asks for GPUs: the annotation the hooks.d file and ponytail-runtime
match on, and the NVIDIA_VISIBLE_DEVICES convention. Plain data, no imports on the hot path."""

from __future__ import annotations

GPU_ANNOTATION = "com.example.gpu"
GPU_ANNOTATION_VALUE = "true"
VISIBLE_DEVICES_VAR = "NVIDIA_VISIBLE_DEVICES"
DRIVER_VAR = "PONYTAIL_DRIVER"  # a registered [drivers.NAME] tree (ponytail.container.driver_trees)
DRIVER_ANNOTATION = "com.example.gpu.driver"


def swarm_devices(env: dict[str, str], variables: tuple[str, ...]) -> tuple[str, str] | None:
    """Docker Swarm's GPU request: (the ids, the variables that named them) from the variables
    ``[request] swarm_resource`` names (e.g. ``DOCKER_RESOURCE_GPU``; Swarm sets
    ``DOCKER_RESOURCE_<KIND>`` from the node's ``node-generic-resources`` it gave the task), ids
    merged in order; None when none is set or none is named (the default: like NVIDIA's
    ``swarm-resource``, off unless configured)."""
    found = [(name, env[name]) for name in variables if name in env]
    if not found:
        return None
    ids = dict.fromkeys(i.strip() for _, value in found for i in value.split(",") if i.strip())
    return ",".join(ids), "+".join(k for k, _ in found)


def env_selector(env: dict[str, str], swarm_variables: tuple[str, ...] = ()) -> tuple[str, str] | None:
    """The GPUs the container's env names and who named them: NVIDIA_VISIBLE_DEVICES, or Swarm's
    variables (swarm_devices), whichever names fewer. The process env merges the image's ENV with
    what the engine set, and nothing in it says which is which, so neither may widen the other:
    Swarm's list replaces an absent NVIDIA_VISIBLE_DEVICES or ``all`` (what CUDA images set), a
    list inside the other's is taken, and two lists neither of which holds the other are refused
    (``ValueError``, its message one line)."""
    visible = env.get(VISIBLE_DEVICES_VAR)
    swarm = swarm_devices(env, swarm_variables)
    if swarm is None:
        return None if visible is None else (visible, VISIBLE_DEVICES_VAR)
    if visible is None or _ids(visible) == {"all"}:
        return swarm
    if is_void(visible) or _ids(visible) == {"none"}:
        return visible, VISIBLE_DEVICES_VAR
    if _ids(swarm[0]) <= _ids(visible) or _ids(swarm[0]) == {"none"}:
        return swarm
    if "all" in _ids(swarm[0]) or _ids(visible) <= _ids(swarm[0]):
        return visible, VISIBLE_DEVICES_VAR
    raise ValueError(
        f"{swarm[1]}={swarm[0]!r} and {VISIBLE_DEVICES_VAR}={visible!r} name different GPUs and either may come from the "
        f"image: ponytail never lets one widen the other; name the same GPUs (or a subset) in both, or leave one unset"
    )


def _ids(selector: str) -> set[str]:
    return {i.strip().lower() if i.strip().lower() in ("all", "none") else i.strip() for i in selector.split(",") if i.strip()}


def is_void(selector: str) -> bool:
    """NVIDIA_VISIBLE_DEVICES=void or empty: not a GPU container at all; also the device
    plugin's /var/run/nvidia-container-devices, which means "the list is in the volume mounts"
    (read from there, ponytail.container.deviceplugin) and, without them, no GPUs."""
    return selector.strip().lower() in ("", "void", "/var/run/nvidia-container-devices")


def asks_for_gpus(env: dict[str, str], annotations: dict[str, str], swarm_variables: tuple[str, ...] = ()) -> bool:
    """The GPUs the env names (env_selector), set and not void/empty, or named in two ways that
    disagree (the hook refuses the start, saying why); or the GPU annotation set to true."""
    if annotations.get(GPU_ANNOTATION) == GPU_ANNOTATION_VALUE:
        return True
    try:
        selected = env_selector(env, swarm_variables)
    except ValueError:
        return True
    return selected is not None and not is_void(selected[0])
