"""ponytail.lite.records behaves as dataclasses does for what ponytail uses."""

from __future__ import annotations

import copy
import dataclasses
import pickle

import pytest

from ponytail.lite import records


def make_pair(module):  # type: ignore[no-untyped-def]
    """The same two classes, built by ``module`` (dataclasses or ponytail.lite.records)."""

    @decorator(module)(frozen=True)
    class Node:
        name: str
        minor: int
        tags: tuple[str, ...] = ()
        problem: str | None = None

    @decorator(module)
    class Outcome:
        done: list[str] = module.field(default_factory=list)
        count: int = 0
        note: str = module.field(default="", compare=False)
        handles: list[int] = module.field(default_factory=list, repr=False)

    return Node, Outcome


def decorator(module):  # type: ignore[no-untyped-def]
    """dataclasses.dataclass, or its stand-in records.record."""
    return module.dataclass if module is dataclasses else module.record


@pytest.mark.parametrize("module", [dataclasses, records], ids=["dataclasses", "records"])
def test_construction_defaults_equality_and_hash(module) -> None:  # type: ignore[no-untyped-def]
    Node, Outcome = make_pair(module)
    a = Node("nvidia0", 0)
    b = Node(name="nvidia0", minor=0, tags=(), problem=None)
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert a != Node("nvidia0", 1) and a != ("nvidia0", 0, (), None)
    assert repr(Node("x", 1, ("t",))) == "make_pair.<locals>.Node(name='x', minor=1, tags=('t',), problem=None)"
    with pytest.raises(AttributeError):
        a.minor = 3  # type: ignore[misc]
    with pytest.raises(AttributeError):
        del a.name  # type: ignore[misc]
    one, two = Outcome(), Outcome()
    one.done.append("mount")
    assert two.done == [] and one != two and Outcome(["mount"]) == one
    one.count += 1
    assert one.count == 1
    assert Outcome(["x"], 1, "a") == Outcome(["x"], 1, "b") and Outcome.note == ""
    assert repr(Outcome(["x"], 1, "a", [3])).endswith("Outcome(done=['x'], count=1, note='a')")
    with pytest.raises(TypeError):
        hash(one)
    assert copy.deepcopy(a) == a and copy.copy(one) == one


@pytest.mark.parametrize("module", [dataclasses, records], ids=["dataclasses", "records"])
@pytest.mark.parametrize(
    "args, kwargs",
    [((), {}), (("a", 1, (), None, "extra"), {}), (("a",), {"name": "b", "minor": 1}), (("a", 1), {"colour": 1})],
    ids=["missing", "too many", "twice", "unknown"],
)
def test_wrong_arguments_are_type_errors(module, args, kwargs) -> None:  # type: ignore[no-untyped-def]
    Node, _ = make_pair(module)
    with pytest.raises(TypeError):
        Node(*args, **kwargs)


def test_non_default_after_default_is_refused() -> None:
    with pytest.raises(TypeError, match="follows default"):

        @records.record
        class Bad:
            a: int = 0
            b: int  # type: ignore[misc]


def test_fields_replace_and_match() -> None:
    @records.record(frozen=True)
    class Gpu:
        index: int
        minor: int
        seen: list[int] = records.field(default_factory=list)

    gpu = Gpu(0, 2, [2])
    assert records.fields(gpu) == ("index", "minor", "seen")
    moved = records.replace(gpu, minor=5)
    assert (moved.index, moved.minor, moved.seen) == (0, 5, [2]) and gpu.minor == 2
    assert Gpu.__match_args__ == ("index", "minor", "seen")
    match gpu:
        case Gpu(0, minor):
            assert minor == 2
        case _:
            raise AssertionError("no match")


def test_a_class_with_post_init_is_refused_not_built_without_calling_it() -> None:
    class Base:
        def __post_init__(self) -> None:
            raise AssertionError("never called")

    for cls in (type("Own", (), {"__annotations__": {"a": "int"}, "__post_init__": Base.__post_init__}),
                type("Inherited", (Base,), {"__annotations__": {"a": "int"}})):
        with pytest.raises(TypeError, match="__post_init__"):
            records.record(cls)


@pytest.mark.parametrize("module", [dataclasses, records], ids=["dataclasses", "records"])
def test_inheritance_and_fields_left_out_of_comparison(module) -> None:  # type: ignore[no-untyped-def]
    @decorator(module)(frozen=True)
    class Base:
        name: str
        extras: dict = module.field(default_factory=dict, compare=False)

    @decorator(module)(frozen=True)
    class Child(Base):
        minor: int = 0

    a, b = Child("x", {"k": 1}, 2), Child("x", {}, 2)
    assert a == b and hash(a) == hash(b) and a != Child("x", {}, 3)
    assert repr(b).endswith("Child(name='x', extras={}, minor=2)")
    assert Child("y").extras == {} and Child("y").extras is not Child("y").extras


def test_pickle_round_trip() -> None:
    assert pickle.loads(pickle.dumps(PICKLED))  # noqa: S301 - what it just pickled == PICKLED


@records.record(frozen=True)
class _Picklable:
    name: str
    value: int = 1


PICKLED = _Picklable("x", 2)
