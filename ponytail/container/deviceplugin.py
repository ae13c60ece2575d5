"""The GPUs Kubernetes' device plugin chose for a container, as it hands them over.

NVIDIA's device plugin names the GPUs it allocated in one of three ways: the env
(``NVIDIA_VISIBLE_DEVICES``, which any pod can also set itself), volume mounts of /dev/null
under /var/run/nvidia-container-devices/<id> (``DEVICE_LIST_STRATEGY=volume-mounts``: only
the kubelet makes those unless pods may use hostPath volumes), or CDI annotations
``cdi.k8s.io/<key>: nvidia.com/gpu=<id>[,...]`` (``cdi-annotations``: passed by containerd
to the runtime for the annotations its runtime entry lets through; the device plugin's own CDI
kind ``k8s.device-plugin.nvidia.com/gpu`` and ``/mig`` mean the same). A list found here wins
over the env; with ``[request] accept_env_when_unprivileged = false`` it is the only way an
unprivileged container gets GPUs, but for the pods of the namespaces named in
``[request] env_namespaces`` (management pods: the device plugin itself, dcgm-exporter, GPU
feature discovery), whose namespace ``management_namespace`` reads from the one annotation the
CRI implementation writes over whatever a pod brings.

An engine that resolves CDI itself (containerd 2.x, 1.7 with ``enable_cdi``, CRI-O) has already
put the devices the annotations name into the container (``linux.devices``) when the runtime sees
them: then the list is ``void``, so that nothing is injected a second time over CDI's.

Whose annotations these are (handover_annotations): the kubelet passes the device plugin's
annotations as the *container's* CRI annotations; a pod's own annotations are the pod author's.
containerd writes into config.json only the container annotations (and pod annotations) a runtime
entry lets through, all at top level: ponytail's entries let only container annotations through.
CRI-O copies every pod annotation to top level, then the container's own as JSON in
``io.kubernetes.cri-o.Annotations`` and again at top level (internal/factory/container
SpecAddAnnotations): there only a key of that JSON, with the same value, is the kubelet's.

Plain data in, plain data out: on the hook's path, so no imports.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported on the hook's path: for type checkers only
    from ponytail.capabilities import FeatureAsk
    from ponytail.config import Config

DEVICE_LIST_DIR = "/var/run/nvidia-container-devices"
CDI_ANNOTATION_PREFIX = "cdi.k8s.io/"
# CRI-O: the container's own CRI annotations (the kubelet's), as one JSON object, written over a pod's
CRIO_CONTAINER_ANNOTATIONS = "io.kubernetes.cri-o.Annotations"
CDI_SOURCE = "CDI annotations (cdi.k8s.io/*)"
CDI_KINDS = ("nvidia.com/gpu", "nvidia.com/mig", "k8s.device-plugin.nvidia.com/gpu", "k8s.device-plugin.nvidia.com/mig")
MOUNT_SOURCE = "/dev/null"  # what the device plugin mounts there; a pod's own volume is something else


def plugin_devices(mounts: object, annotations: dict[str, str], cdi_injected: bool = False) -> tuple[str, str] | None:
    """(selector, source) for the device plugin's list, or None when there is none.
    Volume mounts first, then CDI annotations, as NVIDIA's runtime reads them. ``cdi_injected``:
    the engine's CDI has injected GPUs (ponytail.container.oci.device_plugin_list tells): what the
    annotations name is then there already, and the list ``void``."""
    ids = _from_mounts(mounts)
    if ids:
        return ",".join(ids), f"volume mounts under {DEVICE_LIST_DIR}"
    ids = _from_cdi_annotations(annotations)
    if ids and cdi_injected:
        return "void", "CDI annotations (cdi.k8s.io/*) already resolved by the engine's CDI"
    if ids:
        return ",".join(ids), CDI_SOURCE
    return None


def plugin_features(mounts: object, annotations: dict[str, str]) -> tuple[FeatureAsk, ...]:
    """The opt-in features the device plugin hands over, as (feature, selector, source): IMEX
    channels as volume mounts under <DEVICE_LIST_DIR>/imex/<N>, and CDI annotations of the
    features' kinds (``nvidia.com/imex-channel=3``, ``nvidia.com/gds=all``)."""
    from ponytail.capabilities import FEATURES, IMEX_FEATURE, FeatureAsk

    found: dict[str, list[str]] = {}
    sources: dict[str, str] = {}
    channels = _from_mounts(mounts, f"{DEVICE_LIST_DIR}/imex")
    if channels:
        found[IMEX_FEATURE], sources[IMEX_FEATURE] = channels, f"volume mounts under {DEVICE_LIST_DIR}/imex"
    for key in sorted(annotations):
        if not key.startswith(CDI_ANNOTATION_PREFIX):
            continue
        for device in annotations[key].split(","):
            kind, sep, name = device.strip().partition("=")
            feature = kind.removeprefix("nvidia.com/")
            if sep and name and kind != feature and feature in FEATURES and feature not in sources:
                found.setdefault(feature, []).append(name)
    for feature in found:
        sources.setdefault(feature, CDI_SOURCE)
    return tuple(FeatureAsk(f, "all" if "all" in found[f] else ",".join(dict.fromkeys(found[f])), sources[f]) for f in FEATURES if f in found)


def handover_annotations(annotations: dict[str, str], cri: str, own_word_believed: bool) -> tuple[dict[str, str], str | None]:
    """The ``cdi.k8s.io/*`` annotations believed to be the kubelet's (the device plugin's hand-over),
    and a line saying which were refused and why (None: none was). ``cri`` is ``[request] cri``;
    ``own_word_believed``: the container's own NVIDIA_VISIBLE_DEVICES would be believed (privileged,
    ``accept_env_when_unprivileged``, a management namespace), so a pod's annotation could give it
    no more than its env can.

    CRI-O (``cri = "cri-o"``, or its JSON present and the CRI unknown): only a key of the container's
    own annotations (``io.kubernetes.cri-o.Annotations``) with the same value; the rest are pod
    annotations CRI-O copied. containerd, or neither: every key as written, except that under the
    strict policy an unknown CRI believes none (a pod's copy could not be told from the kubelet's)."""
    cdi = {k: v for k, v in annotations.items() if k.startswith(CDI_ANNOTATION_PREFIX)}
    if not cdi:
        return {}, None
    if not cri and not own_word_believed:
        return {}, (f"{CDI_SOURCE} refused: [request] cri is not set, so the kubelet's container annotations cannot be "
                    "told from a pod's own; set [request] cri = \"containerd\" or \"cri-o\"")
    if cri == "containerd" or (not cri and CRIO_CONTAINER_ANNOTATIONS not in annotations):
        return cdi, None
    own = _json_strings(annotations.get(CRIO_CONTAINER_ANNOTATIONS))
    believed = {k: v for k, v in cdi.items() if own.get(k) == v}
    refused = sorted(k for k in cdi if k not in believed)
    if not refused:
        return believed, None
    where = (f"not among the container's own annotations ({CRIO_CONTAINER_ANNOTATIONS})" if CRIO_CONTAINER_ANNOTATIONS in annotations
             else f"no {CRIO_CONTAINER_ANNOTATIONS} (the container's own annotations, which CRI-O writes) in config.json")
    names = ", ".join(refused[:3]) + (f" and {len(refused) - 3} more" if len(refused) > 3 else "")
    return believed, f"{names} refused: {where}; a pod annotation CRI-O copied is not the device plugin's"


def _json_strings(text: str | None) -> dict[str, str]:
    """A JSON object of strings, or {} for anything else (absent, malformed, other values)."""
    if not text:
        return {}
    from ponytail.lite.plainjson import loads_plain

    raw = text.encode("utf-8", "surrogatepass")
    value = loads_plain(raw)
    if value is None:
        import json

        try:
            value = json.loads(raw)
        except (ValueError, RecursionError, UnicodeDecodeError):
            return {}
    if not isinstance(value, dict):
        return {}
    return {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, str)}


def accepts_env(config: Config, annotations: dict[str, str]) -> bool:
    """Whether an unprivileged container's own NVIDIA_VISIBLE_DEVICES may select GPUs: ``[request]
    accept_env_when_unprivileged``, or its pod is in one of ``[request] env_namespaces``."""
    return config.accept_env_when_unprivileged or management_namespace(annotations, config.cri, config.env_namespaces) is not None


def management_namespace(annotations: dict[str, str], cri: str, namespaces: tuple[str, ...]) -> str | None:
    """The container's Kubernetes namespace when it is one of ``namespaces`` (``[request]
    env_namespaces``), read from the annotation the CRI implementation ``cri`` writes; else None."""
    from ponytail.config import NAMESPACE_ANNOTATIONS

    key = NAMESPACE_ANNOTATIONS.get(cri)
    if key is None or not namespaces:
        return None
    namespace = annotations.get(key)
    return namespace if namespace in namespaces else None


def _from_mounts(mounts: object, directory: str = DEVICE_LIST_DIR) -> list[str]:
    ids: list[str] = []
    if not isinstance(mounts, list):
        return ids
    prefix = directory + "/"
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
