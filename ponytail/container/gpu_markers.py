"""When a container asks for GPUs: the annotation the hooks.d file and ponytail-runtime
match on, and the NVIDIA_VISIBLE_DEVICES convention. Plain data, no imports on the hot path."""

from __future__ import annotations

GPU_ANNOTATION = "com.example.gpu"
GPU_ANNOTATION_VALUE = "true"
VISIBLE_DEVICES_VAR = "NVIDIA_VISIBLE_DEVICES"
DRIVER_VAR = "PONYTAIL_DRIVER"  # a registered [drivers.NAME] tree (ponytail.container.driver_trees)
DRIVER_ANNOTATION = "com.example.gpu.driver"


SWARM_RESOURCE_PREFIX = "DOCKER_RESOURCE_"  # Docker Swarm's generic resources: DOCKER_RESOURCE_<KIND>=<id>,<id>


def swarm_devices(env: dict[str, str]) -> tuple[str, str] | None:
    """Docker Swarm's GPU request: (the ids, the variables that named them) from every
    DOCKER_RESOURCE_<KIND> whose kind has GPU in its name (GPU, NVIDIA-GPU, NVIDIA_GPU), ids
    merged in order; None when there is none. Swarm sets them from the node's
    ``node-generic-resources`` it gave the task; like NVIDIA's toolkit (its ``swarm-resource``),
    they take precedence over NVIDIA_VISIBLE_DEVICES, which CUDA images set to ``all``."""
    found = sorted((k, v) for k, v in env.items() if k.startswith(SWARM_RESOURCE_PREFIX) and "GPU" in k[len(SWARM_RESOURCE_PREFIX):].upper())
    if not found:
        return None
    ids = dict.fromkeys(i.strip() for _, value in found for i in value.split(",") if i.strip())
    return ",".join(ids), "+".join(k for k, _ in found)


def is_void(selector: str) -> bool:
    """NVIDIA_VISIBLE_DEVICES=void or empty: not a GPU container at all; also the device
    plugin's /var/run/nvidia-container-devices, which means "the list is in the volume mounts"
    (read from there, ponytail.container.deviceplugin) and, without them, no GPUs."""
    return selector.strip().lower() in ("", "void", "/var/run/nvidia-container-devices")


def asks_for_gpus(env: dict[str, str], annotations: dict[str, str]) -> bool:
    """Docker Swarm's GPU resources, else NVIDIA_VISIBLE_DEVICES, set and not void/empty; or the
    GPU annotation set to true."""
    if annotations.get(GPU_ANNOTATION) == GPU_ANNOTATION_VALUE:
        return True
    swarm = swarm_devices(env)
    value = swarm[0] if swarm is not None else env.get(VISIBLE_DEVICES_VAR)
    return value is not None and not is_void(value)
