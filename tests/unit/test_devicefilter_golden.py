"""The cgroup v2 device programs ponytail generates, instruction by instruction, against golden
listings (as runc's devicefilter_test.go holds its generated programs): the allow block for the
device rules of real plans (one GPU; every GPU with the control nodes; MIG devices with their
nvidia-caps nodes) and a runc program extended with it. A change to the generated code shows here as a
diff of readable instructions; when it is meant, regenerate the files and review their diff:

    PONYTAIL_UPDATE_GOLDEN=1 .venv/bin/python -m pytest -q tests/unit/test_devicefilter_golden.py
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ponytail.plan.devicefilter import allow_block, extend, verdict
from ponytail.plan.operations import AllowDevices, Plan

from support.bpfprograms import listing, runc_style
from support.hostdata import MIG_GPUS, make_host, plan_for

GOLDEN = Path(__file__).resolve().parent / "golden"
UPDATE = os.environ.get("PONYTAIL_UPDATE_GOLDEN") == "1"
RUNC_DEFAULTS = ((1, 3), (1, 5), (1, 7), (1, 8), (1, 9), (5, 0), (5, 1), (5, 2), (136, 0))  # null zero full random urandom tty console ptmx pts/0


def rules(plan: Plan) -> tuple[tuple[int, int], ...]:
    [allow] = [op for op in plan.operations if isinstance(op, AllowDevices)]
    return allow.devices


def one_gpu() -> tuple[tuple[int, int], ...]:
    return rules(plan_for("0"))


def every_gpu() -> tuple[tuple[int, int], ...]:
    return rules(plan_for("all"))


def mig() -> tuple[tuple[int, int], ...]:
    return rules(plan_for("2:1:0,2:2:0", host=make_host(gpus=MIG_GPUS)))


CASES = {
    "one-gpu": lambda: allow_block(one_gpu()),
    "every-gpu-and-control-nodes": lambda: allow_block(every_gpu()),
    "mig-caps": lambda: allow_block(mig()),
    "runc-program-extended": lambda: extend(runc_style(*RUNC_DEFAULTS), one_gpu()),
}


def golden_text(name: str) -> str:
    devices = {"one-gpu": one_gpu, "every-gpu-and-control-nodes": every_gpu, "mig-caps": mig, "runc-program-extended": one_gpu}[name]()
    program = CASES[name]()
    assert program is not None
    header = "# allows: " + " ".join(f"c {major}:{minor} rw" for major, minor in devices) + "\n"
    return header + listing(program)


@pytest.mark.parametrize("name", sorted(CASES))
def test_generated_program_matches_its_golden_listing(name: str) -> None:
    path = GOLDEN / f"devicefilter-{name}.txt"
    text = golden_text(name)
    if UPDATE:
        path.write_text(text)
    assert path.exists(), f"{path} is missing: regenerate with PONYTAIL_UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"the generated program differs from {path.name}: if that is meant, regenerate with PONYTAIL_UPDATE_GOLDEN=1 and review the diff"


def test_the_golden_programs_allow_exactly_their_rules() -> None:
    """What the listings show is what they do: each program, run by the interpreter, allows its rules
    (and, extended, runc's) and still denies a GPU node it does not name."""
    for name, devices in (("one-gpu", one_gpu()), ("every-gpu-and-control-nodes", every_gpu()), ("mig-caps", mig())):
        program = CASES[name]() + runc_style()  # the block falls through to a deny-all
        assert all(verdict(program, *device) for device in devices), name
        assert verdict(program, 195, 200) is False, name
    extended = CASES["runc-program-extended"]()
    assert extended is not None
    assert all(verdict(extended, *device) for device in one_gpu() + RUNC_DEFAULTS)
    assert verdict(extended, 195, 200) is False
