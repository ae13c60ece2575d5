"""NVIDIA_REQUIRE_* and NVIDIA_DISABLE_REQUIRE, table by table: which constraints a container's
env carries, and whether a host meets them (cuda, driver, arch, brand; space is OR, comma is
AND). Pure: the host's facts are plain values; no root, no files (pytest -m unit runs these as
any user)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ponytail.container.request import requirements_from_env
from ponytail.container.require import Facts, RequirementNotMet, arch_of, brand_of, check_requirements
from ponytail.errors import InputError

from support.cudaimages import CUDA_11_8, CUDA_12_2, CUDA_12_2_SBSA

DRIVER = "550.54.15"
CUDA = "12.4"


def facts(models: tuple[str, ...] = ("Tesla T4",), cuda: str = CUDA) -> Facts:
    return Facts(DRIVER, lambda: cuda, models)


def meets(expression: str, models: tuple[str, ...] = ("Tesla T4",), var: str = "NVIDIA_REQUIRE_CUDA") -> bool:
    try:
        check_requirements(((var, expression),), facts(models))
    except RequirementNotMet:
        return False
    return True


@pytest.mark.parametrize(
    ("expression", "met"),
    [
        ("cuda>=12.0", True),
        ("cuda>=12.4", True),
        ("cuda>=12.5", False),
        ("cuda>12.4", False),
        ("cuda<13", True),
        ("cuda=12", True),  # = compares as many parts as it names
        ("cuda==12.4", True),
        ("cuda=12.3", False),
        ("cuda!=12.4", False),
        ("driver>=550", True),
        ("driver>=550.54.15", True),
        ("driver>550.54.15", False),
        ("driver>=550.100", False),  # numerically, not as text
        ("driver<551", True),
        ("driver=550", True),
        ("driver=550.54", True),
        ("driver!=550", False),
        ("driver<=470", False),
        ("brand=tesla", True),
        ("brand==tesla", True),
        ("brand=geforce", False),
        ("brand!=geforce", True),
        ("brand!=tesla", False),
        ("arch>=7.5", True),
        ("arch=7.5", True),
        ("arch>=8.0", False),
        # a space is OR, a comma is AND
        ("cuda>=12.5 driver>=550", True),
        ("cuda>=12.5 cuda>=13", False),
        ("cuda>=12.0,driver>=550", True),
        ("cuda>=12.0,driver<500", False),
        ("cuda>=12.4 brand=tesla,driver>=470,driver<471", True),  # every nvidia/cuda image's form
        ("cuda>=12.5 brand=tesla,driver>=470,driver<471", False),
        ("cuda>=12.5 brand=tesla,driver>=550,driver<551", True),
        ("", True),  # nothing asked
    ],
)
def test_a_constraint_is_met_or_not(expression: str, met: bool) -> None:
    assert meets(expression) is met


@pytest.mark.parametrize(
    ("models", "expression", "met"),
    [
        (("NVIDIA H100 80GB HBM3",), "arch>=9.0", True),
        (("NVIDIA A100-SXM4-40GB",), "arch=8.0", True),
        (("NVIDIA A10",), "arch=8.6", True),
        (("NVIDIA GeForce RTX 4090",), "arch=8.9", True),
        (("NVIDIA GeForce RTX 4090",), "brand=geforce", True),
        (("NVIDIA RTX A6000",), "brand=nvidiartx", True),
        (("Tesla T4", "Tesla V100-SXM2-16GB"), "arch>=7.5", False),  # must hold for every selected GPU
        (("Tesla T4", "Tesla V100-SXM2-16GB"), "arch>=7.0", True),
        (("Tesla T4", "NVIDIA GeForce RTX 4090"), "brand=tesla", False),
        (("Some Future GPU",), "arch>=1.0", False),  # an unknown architecture meets no arch constraint
        (("Some Future GPU",), "brand=nvidia", True),
        ((), "arch>=9.0", True),  # no GPU selected: nothing to hold for
    ],
)
def test_arch_and_brand_hold_for_every_selected_gpu(models: tuple[str, ...], expression: str, met: bool) -> None:
    assert meets(expression, models) is met


@pytest.mark.parametrize(
    ("driver", "cuda", "models", "expression", "met"),
    [
        # a 470 driver (CUDA 11.4) meets an 11.8 image by the brand rows, each GPU by its own row
        ("470.256.02", "11.4", ("Tesla T4",), CUDA_11_8, True),
        ("470.256.02", "11.4", ("NVIDIA GeForce RTX 3090",), CUDA_11_8, True),
        ("470.256.02", "11.4", ("Tesla T4", "NVIDIA GeForce RTX 3090"), CUDA_11_8, True),  # as NVIDIA: per GPU
        ("470.256.02", "11.4", ("Tesla T4", "NVIDIA GeForce RTX 3090"), CUDA_12_2, True),
        ("470.256.02", "11.4", ("Tesla T4", "NVIDIA GeForce RTX 3090"), CUDA_12_2_SBSA, False),
        ("535.309.01", "12.2", ("Tesla T4", "NVIDIA GeForce RTX 3090"), CUDA_11_8, True),  # by cuda>=11.8
        ("535.309.01", "12.2", ("Tesla T4", "NVIDIA GeForce RTX 3090"), CUDA_12_2, True),
        ("525.147.05", "12.0", ("Tesla T4", "NVIDIA GeForce RTX 3090"), CUDA_12_2, True),  # by the 525 rows
        ("525.147.05", "12.0", ("Tesla T4", "NVIDIA GeForce RTX 3090"), CUDA_11_8, True),
        # every GPU must meet it: an arch row that only one GPU meets is not met
        ("535.309.01", "12.2", ("Tesla T4", "Tesla V100-SXM2-16GB"), "arch>=7.5", False),
        ("535.309.01", "12.2", ("Tesla T4", "Tesla V100-SXM2-16GB"), "arch>=7.5 driver>=535", True),
    ],
)
def test_real_images_requirements_are_met_per_gpu_as_nvidia_evaluates_them(
    driver: str, cuda: str, models: tuple[str, ...], expression: str, met: bool
) -> None:
    try:
        check_requirements((("NVIDIA_REQUIRE_CUDA", expression),), Facts(driver, lambda: cuda, models))
    except RequirementNotMet:
        assert not met
    else:
        assert met


def test_with_several_gpus_the_error_names_the_gpu_that_does_not_meet_it() -> None:
    with pytest.raises(RequirementNotMet) as raised:
        check_requirements((("NVIDIA_REQUIRE_CUDA", "brand=tesla"),), facts(("Tesla T4", "NVIDIA GeForce RTX 3090")))
    assert raised.value.message.startswith(
        "this host does not meet NVIDIA_REQUIRE_CUDA='brand=tesla' for its NVIDIA GeForce RTX 3090 GPU: unmet brand=tesla"
    )


@pytest.mark.parametrize(
    ("model", "arch", "brand"),
    [
        ("Tesla T4", "7.5", "tesla"),
        ("Tesla V100-SXM2-16GB", "7.0", "tesla"),
        ("NVIDIA H100 80GB HBM3", "9.0", "nvidia"),
        ("NVIDIA GH200 480GB", "9.0", "nvidia"),
        ("NVIDIA B200", "10.0", "nvidia"),
        ("NVIDIA L40S", "8.9", "nvidia"),
        ("NVIDIA L4", "8.9", "nvidia"),
        ("NVIDIA A40", "8.6", "nvidia"),
        ("Quadro RTX 6000", "7.5", "quadro"),
        ("NVIDIA TITAN V", "7.0", "titan"),
        ("NVIDIA GeForce GTX 1080", "6.1", "geforce"),
        ("NVIDIA GeForce RTX 5090", "12.0", "geforce"),
        ("Unknown", None, "nvidia"),
    ],
)
def test_arch_and_brand_by_model_name(model: str, arch: str | None, brand: str) -> None:
    assert (arch_of(model), brand_of(model)) == (arch, brand)


def test_several_variables_must_all_hold_and_the_error_names_the_first_unmet() -> None:
    requirements = (("NVIDIA_REQUIRE_CUDA", "cuda>=12.0"), ("NVIDIA_REQUIRE_DRIVER", "driver>=560 driver<500"))
    with pytest.raises(RequirementNotMet) as raised:
        check_requirements(requirements, facts())
    assert raised.value.message == (
        "this host does not meet NVIDIA_REQUIRE_DRIVER='driver>=560 driver<500': unmet driver>=560 or driver<500 "
        f"(driver {DRIVER}, CUDA {CUDA}); use a matching image, or set NVIDIA_DISABLE_REQUIRE=true to skip the check"
    )


def test_the_cuda_version_is_asked_only_for_a_cuda_constraint() -> None:
    def no_cuda() -> str:
        raise AssertionError("the CUDA version was asked for")

    check_requirements((("NVIDIA_REQUIRE_DRIVER", "driver>=550 brand=tesla arch>=7.0"),), Facts(DRIVER, no_cuda, ("Tesla T4",)))
    asked = []
    check_requirements((("A", "cuda>=12"), ("B", "cuda>=11")), Facts(DRIVER, lambda: asked.append(1) or CUDA, ("Tesla T4",)))
    assert asked == [1]  # once for the run
    with pytest.raises(RequirementNotMet) as raised:
        check_requirements((("NVIDIA_REQUIRE_DRIVER", "driver>=560"),), Facts(DRIVER, no_cuda, ()))
    assert "(driver 550.54.15);" in raised.value.message  # no CUDA version in the message when none was asked


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("cuda~12", "NVIDIA_REQUIRE_CUDA: cannot parse constraint 'cuda~12'"),
        ("gpu>=1", "NVIDIA_REQUIRE_CUDA: cannot parse constraint 'gpu>=1'"),
        ("cuda>=", "NVIDIA_REQUIRE_CUDA: '=' in 'cuda>=' is not a version"),  # read as cuda > '='
        ("brand>=tesla", "NVIDIA_REQUIRE_CUDA: brand only compares with = or != ('brand>=tesla')"),
        ("driver>=abc", "NVIDIA_REQUIRE_CUDA: 'abc' in 'driver>=abc' is not a version"),
        ("cuda>=12.", "NVIDIA_REQUIRE_CUDA: '12.' in 'cuda>=12.' is not a version"),
        ("arch>=9.0x", "NVIDIA_REQUIRE_CUDA: '9.0x' in 'arch>=9.0x' is not a version"),
        ("cuda>=12." + "4" * 5000, "NVIDIA_REQUIRE_CUDA: '12.4444"),  # int() would raise ValueError: bad input, not a crash
    ],
)
def test_an_expression_that_cannot_be_parsed_is_bad_input(expression: str, message: str) -> None:
    with pytest.raises(InputError) as raised:
        check_requirements((("NVIDIA_REQUIRE_CUDA", expression),), facts())
    assert raised.value.message.startswith(message)
    assert not isinstance(raised.value, RequirementNotMet)


@pytest.mark.parametrize(
    ("env", "requirements"),
    [
        ({}, ()),
        ({"NVIDIA_REQUIRE_CUDA": "cuda>=12.0"}, (("NVIDIA_REQUIRE_CUDA", "cuda>=12.0"),)),
        (  # sorted by name
            {"NVIDIA_REQUIRE_DRIVER": "driver>=550", "NVIDIA_REQUIRE_CUDA": "cuda>=12.0", "NVIDIA_REQUIRE_ARCH": "arch>=8.0"},
            (("NVIDIA_REQUIRE_ARCH", "arch>=8.0"), ("NVIDIA_REQUIRE_CUDA", "cuda>=12.0"), ("NVIDIA_REQUIRE_DRIVER", "driver>=550")),
        ),
        ({"NVIDIA_REQUIRE_CUDA": "  "}, ()),  # empty values ask nothing
        ({"NVIDIA_REQUIRE_CUDA": "cuda>=12.0", "NVIDIA_DISABLE_REQUIRE": "true"}, ()),
        ({"NVIDIA_REQUIRE_CUDA": "cuda>=12.0", "NVIDIA_DISABLE_REQUIRE": "1"}, ()),
        ({"NVIDIA_REQUIRE_CUDA": "cuda>=12.0", "NVIDIA_DISABLE_REQUIRE": " Yes "}, ()),
        ({"NVIDIA_REQUIRE_CUDA": "cuda>=12.0", "NVIDIA_DISABLE_REQUIRE": "on"}, ()),
        ({"NVIDIA_REQUIRE_CUDA": "cuda>=12.0", "NVIDIA_DISABLE_REQUIRE": "false"}, (("NVIDIA_REQUIRE_CUDA", "cuda>=12.0"),)),
        ({"NVIDIA_REQUIRE_CUDA": "cuda>=12.0", "NVIDIA_DISABLE_REQUIRE": ""}, (("NVIDIA_REQUIRE_CUDA", "cuda>=12.0"),)),
        # a legacy CUDA image: CUDA_VERSION without NVIDIA_REQUIRE_CUDA asks for that major.minor
        ({"CUDA_VERSION": "11.8.0"}, (("CUDA_VERSION", "cuda>=11.8"),)),
        ({"CUDA_VERSION": "11.8.0", "NVIDIA_REQUIRE_CUDA": "cuda>=12.0"}, (("NVIDIA_REQUIRE_CUDA", "cuda>=12.0"),)),
        ({"CUDA_VERSION": "11.8.0", "NVIDIA_DISABLE_REQUIRE": "true"}, ()),
        ({"CUDA_VERSION": "eleven"}, ()),
        ({"CUDA_VERSION": "11"}, ()),
        ({"NVIDIA_REQUIRES_CUDA": "cuda>=99"}, ()),  # not the prefix
    ],
)
def test_the_requirements_a_containers_env_carries(env: dict[str, str], requirements: tuple) -> None:
    assert requirements_from_env(env) == requirements


def test_a_legacy_cuda_image_on_a_host_that_is_too_old_is_refused() -> None:
    requirements = requirements_from_env({"CUDA_VERSION": "12.6.1"})
    with pytest.raises(RequirementNotMet) as raised:
        check_requirements(requirements, facts())
    assert raised.value.message.startswith("this host does not meet CUDA_VERSION='cuda>=12.6': unmet cuda>=12.6")


CONSTRAINT_RE = re.compile(r"^(cuda|driver|arch|brand)(>=|<=|!=|==|=|<|>)(\S+)$")
VERSION_RE = re.compile(r"^\d+(\.\d+)*$")


def outcome(constraint: str) -> str:
    """What checking one constraint does: "ok" (met or unmet), or which bad input."""
    try:
        check_requirements((("NVIDIA_REQUIRE_X", constraint),), facts(("Tesla A100",)))
    except RequirementNotMet:
        return "ok"
    except InputError as e:
        message = str(e)
        if "cannot parse constraint" in message:
            return "cannot parse"
        return "not a version" if "is not a version" in message else "brand operator"
    return "ok"


def outcome_by_regex(constraint: str) -> str:
    """The same, by the regular expressions the constraint syntax was first written with."""
    m = CONSTRAINT_RE.match(constraint)
    if not m:
        return "cannot parse"
    key, op, wanted = m.groups()
    if key == "brand":
        return "ok" if op in ("=", "==", "!=") else "brand operator"
    return "ok" if VERSION_RE.match(wanted) else "not a version"
@given(
    st.sampled_from(["cuda", "driver", "arch", "brand", "cud", "Driver", "x", ""]),
    st.text(alphabet="<>=!", max_size=3),
    st.text(alphabet=list(".0123456789٣xtesla=<"), max_size=8),
)
def test_constraints_parse_as_the_regular_expressions_did(key: str, op: str, value: str) -> None:
    constraint = key + op + value
    if not constraint:
        return
    assert outcome(constraint) == outcome_by_regex(constraint), constraint
