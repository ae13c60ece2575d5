"""Who wrote a CDI spec, and the numbers the CDI runtime gives a device node that leaves them out."""

from __future__ import annotations

import os

import pytest

from ponytail.cdi.files import runtime_numbers
from ponytail.cdi.owners import NVIDIA_CTK, OTHER, PONYTAIL, SpecFile, clashes, generator_of


def _spec(*hooks: dict) -> dict:
    return {"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "devices": [{"name": "0", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}}],
            "containerEdits": {"hooks": list(hooks)}}


@pytest.mark.parametrize(("hook", "expected"), [
    ({"hookName": "createContainer", "path": "/usr/local/bin/ponytail", "args": ["ponytail", "cdi-hook", "--ldconfig"]}, PONYTAIL),
    ({"hookName": "createContainer", "path": "/usr/bin/nvidia-cdi-hook", "args": ["nvidia-cdi-hook", "update-ldcache"]}, NVIDIA_CTK),
    ({"hookName": "createContainer", "path": "/usr/bin/nvidia-ctk", "args": ["nvidia-ctk", "hook", "update-ldcache"]}, NVIDIA_CTK),
    ({"hookName": "createContainer", "path": "/opt/x/hook", "args": ["hook"]}, OTHER),
])
def test_the_generator_is_told_by_the_hooks(hook: dict, expected: str) -> None:
    assert generator_of(_spec(hook), "/etc/cdi/nvidia.yaml") == expected


def test_a_spec_without_hooks_is_another_generators_unless_named_ponytail() -> None:
    assert generator_of(_spec(), "/etc/cdi/nvidia.yaml") == OTHER
    assert generator_of(_spec(), "/etc/cdi/ponytail-gds.yaml") == PONYTAIL


def test_numbers_as_the_cdi_runtime_fills_them() -> None:
    assert runtime_numbers({"path": "/dev/nvidia0", "major": 195}) == (195, 0)  # nvidia-ctk: 'minor: 0' left out
    assert runtime_numbers({"path": "/dev/nvidia1", "major": 195, "minor": 1}) == (195, 1)
    null = os.stat("/dev/null").st_rdev
    assert runtime_numbers({"path": "/dev/x", "hostPath": "/dev/null"}) == (os.major(null), os.minor(null))  # no major: the node's
    assert runtime_numbers({"path": "/dev/no-such-node-here"}) is None


def test_a_kind_of_two_files_is_a_clash() -> None:
    a = SpecFile("/etc/cdi/nvidia.yaml", "nvidia.com/gpu", NVIDIA_CTK, ("0",), None)
    b = SpecFile("/var/run/cdi/nvidia.yaml", "nvidia.com/gpu", PONYTAIL, ("0",), None)
    c = SpecFile("/etc/cdi/gds.yaml", "nvidia.com/gds", PONYTAIL, ("all",), None)
    assert clashes([a, b, c]) == {"nvidia.com/gpu": [a, b]}


@pytest.mark.parametrize(("out", "expected"), [
    ("containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+deb12u3\n", ("1.6.20~ds1", (1, 6))),
    ("containerd github.com/containerd/containerd/v2 v2.3.4 abcdef\n", ("2.3.4", (2, 3))),
    ("containerd github.com/containerd/containerd v1.7.27 05044ec0a9a75232cad458027ca83437aae3f4da\n", ("1.7.27", (1, 7))),
    ("", None),
    ("garbage here\n", None),
])
def test_containerd_versions_are_read(out: str, expected: tuple | None) -> None:
    from ponytail.doctor.beside import parse_containerd_version

    assert parse_containerd_version(out) == expected
