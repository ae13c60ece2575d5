"""Whose cdi.k8s.io/* annotations a config.json holds: the device plugin's hand-over comes only from the
kubelet's container annotations, never from a pod's own. The annotation sets are built the way each CRI
implementation writes them (CRI-O: internal/factory/container SpecAddAnnotations; containerd: the
runtime entry's pod_annotations and container_annotations pass-through, then its own CRI annotations)."""

from __future__ import annotations

import fnmatch
import json

import pytest

from ponytail.config import parse_config
from ponytail.container.deviceplugin import CRIO_CONTAINER_ANNOTATIONS, handover_annotations
from ponytail.container.oci import read_spec

HOSTILE = {"cdi.k8s.io/x": "nvidia.com/gpu=all,nvidia.com/imex-channel=all", "com.example.gpu": "true"}
PLUGIN = {"cdi.k8s.io/nvidia-device-plugin_abc": "nvidia.com/gpu=1"}
KUBELET = {"io.kubernetes.container.hash": "5d1e", "io.kubernetes.container.restartCount": "0"}
LABELS = {"io.kubernetes.pod.name": "p", "io.kubernetes.pod.namespace": "default", "io.kubernetes.container.name": "c"}


def crio(pod: dict[str, str], container: dict[str, str]) -> dict[str, str]:
    """config.json's annotations as CRI-O writes them: the pod's, CRI-O's own, the container's as JSON
    and again one by one, then the kubelet's container labels."""
    out = dict(pod)
    out.update({"io.kubernetes.cri-o.SandboxID": "f00", "io.kubernetes.cri-o.ContainerType": "container"})
    out[CRIO_CONTAINER_ANNOTATIONS] = json.dumps(container)
    out.update(container)
    out.update(LABELS)
    return out


def containerd(pod: dict[str, str], container: dict[str, str], pod_patterns: tuple[str, ...] = (),
               container_patterns: tuple[str, ...] = ("cdi.k8s.io/*",)) -> dict[str, str]:
    """config.json's annotations as containerd's CRI plugin writes them (path.Match: '*' stops at '/')."""
    def passed(source: dict[str, str], patterns: tuple[str, ...]) -> dict[str, str]:
        return {k: v for k, v in source.items() if any(k.count("/") == p.count("/") and fnmatch.fnmatchcase(k, p) for p in patterns)}

    return {**passed(pod, pod_patterns), **passed(container, container_patterns),
            "io.kubernetes.cri.container-type": "container", "io.kubernetes.cri.sandbox-namespace": "default"}


def strict(cri: str = "") -> object:
    text = "[request]\naccept_env_when_unprivileged = false\n" + (f'cri = "{cri}"\n' if cri else "")
    return parse_config(text.encode(), "config.toml")


def spec(annotations: dict[str, str], privileged: bool = False) -> dict:
    caps = ["CAP_CHOWN", "CAP_SYS_ADMIN"] if privileged else ["CAP_CHOWN"]
    return {"process": {"env": ["PATH=/bin"], "capabilities": {"bounding": caps}}, "annotations": annotations}


CASES = [
    # (what, annotations, [request] cri, the list the strict policy takes, features)
    ("CRI-O, a pod's own annotation", crio(HOSTILE, KUBELET), "cri-o", None, ()),
    ("CRI-O, the kubelet's", crio({}, {**KUBELET, **PLUGIN}), "cri-o", "1", ()),
    ("CRI-O, both", crio(HOSTILE, {**KUBELET, **PLUGIN}), "cri-o", "1", ()),
    ("CRI-O, the pod's under the plugin's key", crio({"cdi.k8s.io/nvidia-device-plugin_abc": "nvidia.com/gpu=all"}, {**KUBELET, **PLUGIN}),
     "cri-o", "1", ()),
    ("CRI-O, a pod forging the JSON", crio({**HOSTILE, CRIO_CONTAINER_ANNOTATIONS: json.dumps(HOSTILE)}, KUBELET), "cri-o", None, ()),
    ("CRI-O shape, CRI unknown", crio({}, {**KUBELET, **PLUGIN}), "", None, ()),
    ("containerd, the kubelet's", containerd(HOSTILE, {**KUBELET, **PLUGIN}), "containerd", "1", ()),
    ("containerd, a pod's own (not let through)", containerd(HOSTILE, KUBELET), "containerd", None, ()),
    ("containerd shape, CRI unknown", containerd({}, {**KUBELET, **PLUGIN}), "", None, ()),
    ("containerd shape read as CRI-O", containerd({}, {**KUBELET, **PLUGIN}), "cri-o", None, ()),
    ("IMEX channels from the kubelet on CRI-O", crio(HOSTILE, {"cdi.k8s.io/imex": "nvidia.com/imex-channel=2"}), "cri-o", None,
     (("imex-channel", "2"),)),
]


@pytest.mark.parametrize(("what", "annotations", "cri", "expected", "features"), CASES, ids=[c[0] for c in CASES])
def test_only_the_kubelets_annotations_hand_over_gpus(what: str, annotations: dict[str, str], cri: str, expected: str | None,
                                                      features: tuple) -> None:
    read = read_spec(spec(annotations), "config.json", strict(cri))
    assert (read.plugin_devices[0] if read.plugin_devices else None) == expected, (what, read.handover, read.handover_refused)
    assert tuple((f.name, f.selector) for f in read.plugin_features) == features, what
    hostile_there = any(annotations.get(k) == v for k, v in HOSTILE.items() if k.startswith("cdi.k8s.io/"))
    assert (read.handover_refused is not None) == (hostile_there or (expected is None and any(k.startswith("cdi.k8s.io/") for k in annotations))), \
        (what, read.handover_refused)


def test_the_refusal_says_which_and_why() -> None:
    _, line = handover_annotations(crio(HOSTILE, KUBELET), "cri-o", False)
    assert line == ("cdi.k8s.io/x refused: not among the container's own annotations (io.kubernetes.cri-o.Annotations); "
                    "a pod annotation CRI-O copied is not the device plugin's")
    _, line = handover_annotations({"cdi.k8s.io/x": "nvidia.com/gpu=0"}, "cri-o", False)
    assert line is not None and "no io.kubernetes.cri-o.Annotations" in line
    _, line = handover_annotations(containerd({}, PLUGIN), "", False)
    assert line is not None and "[request] cri is not set" in line and 'cri = "containerd" or "cri-o"' in line
    many = {f"cdi.k8s.io/k{i}": "nvidia.com/gpu=all" for i in range(50)}
    _, line = handover_annotations(crio(many, KUBELET), "cri-o", False)
    assert line is not None and line.count("cdi.k8s.io/") == 3 and "and 47 more" in line
    assert handover_annotations({"other": "x"}, "", False) == ({}, None)  # nothing handed over: nothing to say


def test_a_container_whose_word_is_believed_needs_no_cri() -> None:
    """Privileged, or the built-in policy: its env could ask for as much, so the CRI need not be known;
    the CRI-O rule still holds where CRI-O's JSON is there."""
    plain = {"cdi.k8s.io/x": "nvidia.com/gpu=0"}  # podman run --annotation, docker
    assert handover_annotations(plain, "", True) == (plain, None)
    assert read_spec(spec(plain), "config.json").plugin_devices == ("0", "CDI annotations (cdi.k8s.io/*)")  # the built-in config
    assert read_spec(spec(plain, privileged=True), "config.json", strict()).plugin_devices is not None
    believed, line = handover_annotations(crio(HOSTILE, {**KUBELET, **PLUGIN}), "", True)
    assert believed == PLUGIN and line is not None


@pytest.mark.parametrize("value", ["", "not json", "[1]", '{"cdi.k8s.io/x": 1}', '"cdi.k8s.io/x"', "{" * 200])
def test_a_malformed_crio_json_believes_nothing(value: str) -> None:
    annotations = {**HOSTILE, CRIO_CONTAINER_ANNOTATIONS: value}
    believed, line = handover_annotations(annotations, "cri-o", False)
    assert believed == {} and line is not None
