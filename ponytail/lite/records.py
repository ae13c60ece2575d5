"""Plain-data classes, as ``dataclasses.dataclass`` makes them, without its start-up cost.

``dataclasses`` imports ``inspect`` and writes each class's methods as source text it
compiles with ``exec``, on every start of the hook (bench/importcost.py measures it).
``record`` builds the same methods from closures instead, for what ponytail uses:
fields from the class annotations in order, defaults and
``field(default=..., default_factory=..., compare=..., repr=...)``, positional or keyword
construction, ``repr``, ``==`` (same class, equal compared fields),
``frozen=True`` (assignment raises FrozenInstanceError; instances hash by their
compared fields) and inheritance; ``fields()`` and ``replace()`` as in dataclasses.
A class with ``__post_init__`` is refused (a TypeError), not built without calling it.
tests/unit/test_records.py holds it to dataclasses.
"""

from __future__ import annotations

from operator import attrgetter

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported at run time: for type checkers only
    from collections.abc import Callable
    from typing import Any

    from typing_extensions import dataclass_transform
else:

    def dataclass_transform(**_: object) -> Callable:
        return lambda function: function


_MISSING = object()


class FrozenInstanceError(AttributeError):
    """Assignment to a field of a frozen instance."""


class _Field:
    __slots__ = ("default", "factory", "compare", "repr")

    def __init__(self, default: Any, factory: Any, compare: bool, repr: bool) -> None:
        self.default = default
        self.factory = factory
        self.compare = compare
        self.repr = repr


def field(
    *, default: Any = _MISSING, default_factory: Callable[[], Any] | Any = _MISSING, compare: bool = True, repr: bool = True
) -> Any:
    """A field with options: a ``default``, or a ``default_factory`` called anew for each
    instance; ``compare=False`` leaves it out of ``==`` and the hash, ``repr=False`` out of repr()."""
    if default is not _MISSING and default_factory is not _MISSING:
        raise ValueError("cannot specify both default and default_factory")
    return _Field(default, default_factory, compare, repr)


@dataclass_transform(field_specifiers=(field,))
def record(cls: type | None = None, /, *, frozen: bool = False) -> Any:
    """Give ``cls`` an ``__init__``, ``__repr__`` and ``__eq__`` from its annotated fields."""

    def wrap(cls: type) -> type:
        return _build(cls, frozen)

    return wrap if cls is None else wrap(cls)


def fields(instance_or_class: object) -> tuple[str, ...]:
    """The field names, in order."""
    return instance_or_class.__record_fields__  # type: ignore[attr-defined]  # set by @record on the class


def replace(instance: Any, **changes: Any) -> Any:
    """A copy of ``instance`` with ``changes``."""
    values = {name: getattr(instance, name) for name in fields(instance)}
    values.update(changes)
    return type(instance)(**values)


def _build(cls: type, frozen: bool) -> type:
    if hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__qualname__}: a record has no __post_init__ (use dataclasses, or a function that makes it)")
    # inherited fields first, as dataclasses does
    base = next((b.__dict__["__record_spec__"] for b in cls.__mro__[1:] if "__record_spec__" in b.__dict__), None)
    names: list[str] = list(base[0]) if base else []
    defaults: dict[str, Any] = dict(base[1]) if base else {}
    factories: dict[str, Callable[[], Any]] = dict(base[2]) if base else {}
    ignored: set[str] = set(base[0]) - set(base[3]) if base else set()
    hidden: set[str] = set(base[0]) - set(base[4]) if base else set()
    for name, annotation in cls.__dict__.get("__annotations__", {}).items():
        if str(annotation).startswith(("ClassVar", "typing.ClassVar")):
            continue
        if name not in names:
            names.append(name)
        defaults.pop(name, None)
        factories.pop(name, None)
        ignored.discard(name)
        hidden.discard(name)
        value = cls.__dict__.get(name, _MISSING)
        if isinstance(value, _Field):
            if not value.compare:
                ignored.add(name)
            if not value.repr:
                hidden.add(name)
            if value.factory is not _MISSING:
                factories[name] = value.factory
            value = value.default
            if value is _MISSING:
                delattr(cls, name)
            else:
                setattr(cls, name, value)
        if value is not _MISSING:
            defaults[name] = value
    seen_default = False
    for name in names:
        if name in defaults or name in factories:
            seen_default = True
        elif seen_default:
            raise TypeError(f"non-default argument {name!r} follows default argument")
    compared = tuple(name for name in names if name not in ignored)
    shown = tuple(name for name in names if name not in hidden)
    cls.__record_spec__ = (tuple(names), defaults, factories, compared, shown)  # type: ignore[attr-defined]  # a new class attribute
    _add_methods(cls, tuple(names), defaults, factories, compared, shown, frozen)
    return cls


def _add_methods(
    cls: type,
    names: tuple[str, ...],
    defaults: dict[str, Any],
    factories: dict[str, Callable[[], Any]],
    compared: tuple[str, ...],
    shown: tuple[str, ...],
    frozen: bool,
) -> None:
    count = len(names)
    known = frozenset(names)
    title = cls.__qualname__
    values_of = attrgetter(*compared) if len(compared) > 1 else (lambda self: tuple(getattr(self, n) for n in compared))

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if not kwargs and len(args) == count:  # the usual call: every field, in order
            self.__dict__.update(zip(names, args, strict=True))
            return
        if len(args) > count:
            raise TypeError(f"{title}() takes {count} positional arguments but {len(args)} were given")
        values = dict(zip(names, args, strict=False))  # fewer arguments than fields: the rest by keyword or default
        for key, value in kwargs.items():
            if key not in known:
                raise TypeError(f"{title}() got an unexpected keyword argument {key!r}")
            if key in values:
                raise TypeError(f"{title}() got multiple values for argument {key!r}")
            values[key] = value
        if len(values) < count:
            for name in names:
                if name not in values:
                    if name in factories:
                        values[name] = factories[name]()
                    elif name in defaults:
                        values[name] = defaults[name]
                    else:
                        raise TypeError(f"{title}() missing required argument: {name!r}")
        self.__dict__.update(values)  # bypasses a frozen __setattr__, as dataclasses' __init__ does

    def __repr__(self: Any) -> str:
        return f"{type(self).__qualname__}({', '.join(f'{name}={getattr(self, name)!r}' for name in shown)})"

    def __eq__(self: Any, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return values_of(self) == values_of(other)

    methods: dict[str, Any] = {"__init__": __init__, "__repr__": __repr__, "__eq__": __eq__}
    if frozen:

        def __setattr__(self: Any, name: str, value: Any) -> None:
            raise FrozenInstanceError(f"cannot assign to field {name!r}")

        def __delattr__(self: Any, name: str) -> None:
            raise FrozenInstanceError(f"cannot delete field {name!r}")

        def __hash__(self: Any) -> int:
            return hash(values_of(self))

        methods.update(__setattr__=__setattr__, __delattr__=__delattr__, __hash__=__hash__)
    else:
        methods["__hash__"] = None  # mutable and compared by value: unhashable, as in dataclasses
    for name, method in methods.items():
        if name in cls.__dict__:
            continue  # the class's own method wins
        if method is not None:
            method.__qualname__ = f"{title}.{name}"
        setattr(cls, name, method)
    cls.__record_fields__ = names  # type: ignore[attr-defined]  # a new class attribute, read by fields()
    cls.__match_args__ = names  # type: ignore[attr-defined, misc]  # set on the decorated class, as dataclasses does
