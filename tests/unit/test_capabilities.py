"""NVIDIA_DRIVER_CAPABILITIES, table by table: which capabilities a value means (the default,
all, implied ones, unknown names), and that every capability's nodes are in the one registry
of control nodes. Pure: no root, no files (pytest -m unit runs these as any user)."""

from __future__ import annotations

import pytest

from ponytail.capabilities import ALL, CAPABILITIES, CONTROL_NODES, DEFAULT, parse_capabilities


@pytest.mark.parametrize(
    ("text", "capabilities", "unknown"),
    [
        (None, ("compute", "utility"), ()),  # the default, in ALL's order
        ("", ("compute", "utility"), ()),
        (" ", ("compute", "utility"), ()),
        ("utility", ("utility",), ()),
        ("UTILITY, Graphics", ("graphics", "utility"), ()),
        ("video", ("compute", "video"), ()),  # video implies compute
        ("video,compute", ("compute", "video"), ()),
        ("display", ("display",), ()),
        ("compat32,utility", ("compat32", "utility"), ()),
        ("all", ALL, ()),
        ("compute,all", ALL, ()),
        ("all,bogus", ALL, ("bogus",)),  # all wins; the unknown name is still reported
        ("utility,bogus", ("utility",), ("bogus",)),
        ("bogus", (), ("bogus",)),
        ("utility,,utility", ("utility",), ()),
        ("Bogus,VIDEO", ("compute", "video"), ("bogus",)),
    ],
)
def test_a_capabilities_value_means(text: str | None, capabilities: tuple[str, ...], unknown: tuple[str, ...]) -> None:
    assert parse_capabilities(text) == (capabilities, unknown)


def test_all_and_the_default_name_known_capabilities() -> None:
    assert set(ALL) == set(CAPABILITIES)
    assert set(DEFAULT) == {"utility", "compute"}


@pytest.mark.parametrize("name", sorted(CAPABILITIES))
def test_every_capability_names_only_registered_nodes_and_known_capabilities(name: str) -> None:
    capability = CAPABILITIES[name]
    assert set(capability.nodes) <= set(CONTROL_NODES), "a node the probe does not look at"
    assert set(capability.required_nodes) <= set(capability.nodes), "a required node the capability does not bring"
    assert set(capability.implies) <= set(CAPABILITIES)
    for soname in capability.required_libraries:
        assert soname.split(".so")[0] in capability.libraries, f"{soname} is required but never searched for"


@pytest.mark.parametrize(
    ("name", "libraries", "nodes"),
    [
        ("utility", {"libnvidia-ml"}, set()),
        ("compute", {"libcuda", "libnvidia-ptxjitcompiler"}, {"nvidia-uvm", "nvidia-uvm-tools"}),
        ("graphics", {"libGLX_nvidia", "libEGL_nvidia", "libnvidia-glcore"}, set()),
        ("video", {"libnvcuvid", "libnvidia-encode"}, set()),
        ("display", set(), {"nvidia-modeset"}),
        ("ngx", {"libnvidia-ngx"}, set()),
    ],
)
def test_what_each_capability_brings(name: str, libraries: set[str], nodes: set[str]) -> None:
    assert libraries <= set(CAPABILITIES[name].libraries)
    assert set(CAPABILITIES[name].nodes) == nodes


def test_the_control_nodes_registry() -> None:
    assert CONTROL_NODES == {
        "nvidiactl": ("nvidia", 255),
        "nvidia-modeset": ("nvidia", 254),
        "nvidia-uvm": ("nvidia-uvm", 0),
        "nvidia-uvm-tools": ("nvidia-uvm", 1),
    }
