"""When a container asks for GPUs: the annotation the hooks.d file and ponytail-runtime
match on, and the NVIDIA_VISIBLE_DEVICES convention. Plain data, no imports on the hot path."""

from __future__ import annotations

GPU_ANNOTATION = "com.example.gpu"
GPU_ANNOTATION_VALUE = "true"
VISIBLE_DEVICES_VAR = "NVIDIA_VISIBLE_DEVICES"
DRIVER_VAR = "PONYTAIL_DRIVER"  # a registered [drivers.NAME] tree (ponytail.container.umd)
DRIVER_ANNOTATION = "com.example.gpu.driver"


def is_void(selector: str) -> bool:
    """NVIDIA_VISIBLE_DEVICES=void or empty: not a GPU container at all; also the device
    plugin's /var/run/nvidia-container-devices, which means "the list is in the volume mounts"
    (read from there, ponytail.container.deviceplugin) and, without them, no GPUs."""
    return selector.strip().lower() in ("", "void", "/var/run/nvidia-container-devices")


def asks_for_gpus(env: dict[str, str], annotations: dict[str, str]) -> bool:
    """NVIDIA_VISIBLE_DEVICES set and not void/empty, or the GPU annotation set to true."""
    if annotations.get(GPU_ANNOTATION) == GPU_ANNOTATION_VALUE:
        return True
    value = env.get(VISIBLE_DEVICES_VAR)
    return value is not None and not is_void(value)
