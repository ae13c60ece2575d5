"""The GPUs Kubernetes' device plugin chose for a container, as it hands them over.

NVIDIA's device plugin names the GPUs it allocated in one of three ways: the env
(``NVIDIA_VISIBLE_DEVICES``, which any pod can also set itself), volume mounts of /dev/null
under /var/run/nvidia-container-devices/<id> (``DEVICE_LIST_STRATEGY=volume-mounts``: only
the kubelet makes those unless pods may use hostPath volumes), or CDI annotations
``cdi.k8s.io/<key>: nvidia.com/gpu=<id>[,...]`` (``cdi-annotations``: passed by containerd
to the runtime for the annotations its runtime entry lets through). A list found here wins
over the env; with ``[request] accept_env_when_unprivileged = false`` it is the only way an
unprivileged container gets GPUs.

An engine that resolves CDI itself (containerd 2.x, 1.7 with ``enable_cdi``, CRI-O) has already
put the devices the annotations name into the container (``linux.devices``) when the runtime sees
them: then the list is ``void``, so that nothing is injected a second time over CDI's.

Plain data in, plain data out: on the hook's path, so nothing imported that the hook does not load anyway.
"""

from __future__ import annotations

from ponytail.host.driver import NVIDIA_MAJOR  # the GPU nodes' major: CDI's device nodes carry it

DEVICE_LIST_DIR = "/var/run/nvidia-container-devices"
CDI_ANNOTATION_PREFIX = "cdi.k8s.io/"
CDI_KINDS = ("nvidia.com/gpu", "nvidia.com/mig")
MOUNT_SOURCE = "/dev/null"  # what the device plugin mounts there; a pod's own volume is something else


def plugin_devices(mounts: object, annotations: dict[str, str], char_devices: tuple[tuple[int, int], ...] = ()) -> tuple[str, str] | None:
    """(selector, source) for the device plugin's list, or None when there is none.
    Volume mounts first, then CDI annotations, as NVIDIA's runtime reads them. ``char_devices``:
    major:minor of the spec's ``linux.devices``; NVIDIA nodes there mean the engine's CDI has
    injected what the annotations name: the list is then ``void``."""
    ids = _from_mounts(mounts)
    if ids:
        return ",".join(ids), f"volume mounts under {DEVICE_LIST_DIR}"
    ids = _from_cdi_annotations(annotations)
    if ids and any(major == NVIDIA_MAJOR for major, _ in char_devices):
        return "void", "CDI annotations (cdi.k8s.io/*) already resolved by the engine's CDI (NVIDIA nodes in linux.devices)"
    if ids:
        return ",".join(ids), "CDI annotations (cdi.k8s.io/*)"
    return None


def _from_mounts(mounts: object) -> list[str]:
    ids: list[str] = []
    if not isinstance(mounts, list):
        return ids
    prefix = DEVICE_LIST_DIR + "/"
    for mount in mounts:
        if not isinstance(mount, dict):
            continue
        destination = mount.get("destination")
        if not isinstance(destination, str) or not destination.startswith(prefix):
            continue
        name = destination[len(prefix):].strip("/")
        if not name or "/" in name or mount.get("source") != MOUNT_SOURCE:
            continue
        if name not in ids:
            ids.append(name)
    return ids


def _from_cdi_annotations(annotations: dict[str, str]) -> list[str]:
    ids: list[str] = []
    for key in sorted(annotations):
        if not key.startswith(CDI_ANNOTATION_PREFIX):
            continue
        for device in annotations[key].split(","):
            kind, sep, name = device.strip().partition("=")
            if sep and kind in CDI_KINDS and name and name not in ids:
                ids.append(name)
    return ids
