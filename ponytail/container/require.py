"""NVIDIA_REQUIRE_* constraints: ``cuda``, ``driver``, ``arch`` and ``brand`` compared
with ``=``, ``!=``, ``<``, ``<=``, ``>``, ``>=``. Within one variable a space means OR
and a comma means AND; several variables are ANDed. As NVIDIA's libnvidia-container does
(src/cli/configure.c), the requirements are evaluated once per selected GPU, with that GPU's
``arch`` and ``brand``: each GPU must meet them, by any alternative of its own (an nvidia/cuda
11.8 image lists one alternative per brand, so a Tesla and a GeForce card pass together).

Example (every nvidia/cuda image has one):
    NVIDIA_REQUIRE_CUDA="cuda>=12.4 brand=tesla,driver>=470,driver<471"
"""

from __future__ import annotations

from ponytail.errors import InputError, PonytailError, quoted
from ponytail.lite.records import record

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported on the hook's path: for type checkers only
    from collections.abc import Callable

_KEYS = ("cuda", "driver", "arch", "brand")
_OPERATORS = (">=", "<=", "!=", "==", "=", "<", ">")  # longest first: "driver>=4" is >= 4

# Compute capability and NVML-style brand by model name, most specific first. The
# probe never loads NVML, so these come from the model name the driver reports.
_ARCH_BY_MODEL = (
    ("GB200", "10.0"), ("B200", "10.0"), ("B100", "10.0"), ("GH200", "9.0"), ("H200", "9.0"), ("H100", "9.0"),
    ("H800", "9.0"), ("H20", "9.0"), ("L40", "8.9"), ("L20", "8.9"), ("L4", "8.9"), ("RTX 40", "8.9"),
    ("RTX 6000 Ada", "8.9"), ("A100", "8.0"), ("A800", "8.0"), ("A30", "8.0"), ("A40", "8.6"), ("A16", "8.6"),
    ("A10", "8.6"), ("A2", "8.6"), ("RTX A", "8.6"), ("RTX 30", "8.6"), ("RTX 50", "12.0"), ("T4", "7.5"),
    ("RTX 20", "7.5"), ("Quadro RTX", "7.5"), ("V100", "7.0"), ("TITAN V", "7.0"), ("P100", "6.0"),
    ("P40", "6.1"), ("P4", "6.1"), ("GTX 10", "6.1"),
)
_BRAND_BY_MODEL = (
    ("Tesla", "tesla"), ("Quadro", "quadro"), ("GeForce", "geforce"), ("TITAN", "titan"), ("NVS", "nvs"),
    ("GRID", "grid"), ("RTX A", "nvidiartx"), ("NVIDIA RTX", "nvidiartx"),
)


class RequirementNotMet(PonytailError):
    """The container asks for a driver this host does not have."""


@record(frozen=True)
class Facts:
    driver: str
    cuda: Callable[[], str]  # asked only when a constraint names cuda
    models: tuple[str, ...]  # of the selected GPUs


MAX_VERSION_DIGITS = 18  # per part: int() of an image's 5,000-digit "version" would raise ValueError (over 4300 digits)


def check_requirements(requirements: tuple[tuple[str, str], ...], facts: Facts) -> None:
    """Raise RequirementNotMet naming the first unmet variable (and, with several GPUs, the GPU
    that does not meet it), its failed constraints and the driver's values; InputError for an
    expression that cannot be parsed."""
    cache: dict[str, str] = {}
    per_gpu: list[tuple[str, ...]] = [(model,) for model in facts.models]
    for models in per_gpu or [()]:
        one = Facts(facts.driver, facts.cuda, models)
        for var, expression in requirements:
            failures = _unmet(var, expression, one, cache)
            if failures:
                values = f"driver {facts.driver}" + (f", CUDA {cache['cuda']}" if "cuda" in cache else "")
                gpu = f" for its {models[0]} GPU" if len(facts.models) > 1 else ""
                raise RequirementNotMet(
                    f"this host does not meet {var}={quoted(expression)}{gpu}: unmet {' or '.join(failures)} "
                    f"({values}); use a matching image, or set NVIDIA_DISABLE_REQUIRE=true to skip the check"
                )


def _unmet(var: str, expression: str, facts: Facts, cache: dict[str, str]) -> list[str]:
    """The first failed constraint of each alternative of ``expression``, or [] when one holds
    (or there is none)."""
    failures = []
    for alternative in (alt for alt in expression.split() if alt):
        failed = [c for c in alternative.split(",") if c and not _holds(var, c, facts, cache)]
        if not failed:
            return []
        failures.append(failed[0])
    return failures


def _holds(var: str, constraint: str, facts: Facts, cache: dict[str, str]) -> bool:
    parsed = _parse_constraint(constraint.strip())
    if parsed is None:
        raise InputError(
            f"{var}: cannot parse constraint {quoted(constraint)} (expected cuda|driver|arch|brand, an operator, a value)"
        )
    key, op, wanted = parsed
    if key == "brand":
        if op not in ("=", "==", "!="):
            raise InputError(f"{var}: brand only compares with = or != ({constraint!r})")
        return all((brand_of(model) == wanted.lower()) == (op != "!=") for model in facts.models)
    if not all(part.isdecimal() and len(part) <= MAX_VERSION_DIGITS for part in wanted.split(".")):  # digits, dot-separated
        raise InputError(f"{var}: {quoted(wanted)} in {quoted(constraint)} is not a version")
    if key == "arch":
        archs = [arch_of(model) for model in facts.models]
        return all(a is not None and _compare(a, op, wanted) for a in archs)
    if key == "cuda":
        if "cuda" not in cache:
            cache["cuda"] = facts.cuda()
        return _compare(cache["cuda"], op, wanted)
    return _compare(facts.driver, op, wanted)


def _parse_constraint(text: str) -> tuple[str, str, str] | None:
    """(key, operator, value) of "driver>=470", or None; the value is one word. (Plain string
    work: the hook does not import ``re`` for this.)"""
    key = next((k for k in _KEYS if text.startswith(k)), None)
    if key is None:
        return None
    rest = text[len(key):]
    for op in _OPERATORS:
        value = rest[len(op):]
        if rest.startswith(op) and value and not any(c.isspace() for c in value):
            return key, op, value
    return None


def _compare(actual: str, op: str, wanted: str) -> bool:
    """Numeric version comparison. For = and != the actual version is cut to the length
    of the wanted one (driver=470 matches 470.82.01); ordering pads with zeros."""
    have = [int(p) for p in actual.split(".")]
    want = [int(p) for p in wanted.split(".")]
    if op in ("=", "==", "!="):
        equal = have[: len(want)] + [0] * (len(want) - len(have)) == want
        return equal if op != "!=" else not equal
    width = max(len(have), len(want))
    a, b = have + [0] * (width - len(have)), want + [0] * (width - len(want))
    return {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]


def arch_of(model: str) -> str | None:
    return next((arch for key, arch in _ARCH_BY_MODEL if key.lower() in model.lower()), None)


def brand_of(model: str) -> str:
    return next((brand for key, brand in _BRAND_BY_MODEL if key.lower() in model.lower()), "nvidia")
