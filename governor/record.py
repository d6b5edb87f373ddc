"""Plain data classes for the run time, without dataclasses' cost at import.

``@dataclass`` writes each class's ``__init__``, ``__repr__``, ``__eq__`` and ``__hash__`` as
source text and compiles it with exec() when the module is imported: ~1 ms a class here, and
the launch path defined ~50 of them (a quarter of `governor launch`'s own time), and the module
pulls in ``inspect``, ``ast``, ``dis`` and ``tokenize`` (~1.5 MiB that the supervisor holds
for the engine's whole run). ``@record`` gives the same behaviour from generic methods that
read the class's field table: class creation costs microseconds, instances cost a little more
to build (the run time builds a few hundred).

Supported: field defaults, ``field(default_factory=..., init=False, repr=False)``,
``__post_init__``, ``frozen=True`` (FrozenRecordError, an AttributeError, on assignment; hashable),
inheritance of fields, and the helpers :func:`replace`, :func:`asdict`, :func:`fields`. Type
checkers see a dataclass (``typing.dataclass_transform``).
"""

from __future__ import annotations

import sys
from typing import Any, Literal, TypeVar, dataclass_transform, overload

_MISSING: Any = object()
T = TypeVar("T")


class FrozenRecordError(AttributeError):
    """Assignment to a field of a frozen record."""


class Field:
    __slots__ = ("default", "factory", "init", "name", "repr")

    def __init__(self, default: Any, factory: Any, init: bool, repr: bool) -> None:
        self.name = ""
        self.default = default
        self.factory = factory
        self.init = init
        self.repr = repr

    def value(self) -> Any:
        if self.default is not _MISSING:
            return self.default
        if self.factory is not _MISSING:
            return self.factory()
        raise TypeError(f"missing value for field {self.name!r}")


def field(
    *,
    default: Any = _MISSING,
    default_factory: Any = _MISSING,
    init: bool = True,
    repr: bool = True,
) -> Any:
    return Field(default, default_factory, init, repr)


def _init(self: Any, *args: Any, **kwargs: Any) -> None:
    cls = type(self)
    setter = object.__setattr__
    init_fields: tuple[Field, ...] = cls.__record_init__
    if len(args) > len(init_fields):
        raise TypeError(f"{cls.__name__}() takes {len(init_fields)} arguments, got {len(args)}")
    for i, f in enumerate(init_fields):
        if i < len(args):
            if f.name in kwargs:
                raise TypeError(f"{cls.__name__}() got {f.name!r} twice")
            setter(self, f.name, args[i])
        elif f.name in kwargs:
            setter(self, f.name, kwargs.pop(f.name))
        else:
            setter(self, f.name, f.value())
    if len(kwargs) > 0:
        raise TypeError(f"{cls.__name__}() got unexpected field(s): {', '.join(kwargs)}")
    for f in cls.__record_fields__:
        if not f.init and (f.default is not _MISSING or f.factory is not _MISSING):
            setter(self, f.name, f.value())  # else __post_init__ sets it, as with dataclasses
    post = getattr(self, "__post_init__", None)
    if post is not None:
        post()


def _values(self: Any) -> tuple[Any, ...]:
    return tuple(getattr(self, f.name) for f in type(self).__record_fields__)


def _eq(self: Any, other: object) -> Any:
    if other.__class__ is not self.__class__:
        return NotImplemented
    return _values(self) == _values(other)


def _hash(self: Any) -> int:
    return hash(_values(self))


def _repr(self: Any) -> str:
    shown = ", ".join(
        f"{f.name}={getattr(self, f.name)!r}" for f in type(self).__record_fields__ if f.repr
    )
    return f"{type(self).__qualname__}({shown})"


def _frozen_setattr(self: Any, name: str, value: Any) -> None:
    raise FrozenRecordError(f"cannot assign to field {name!r} of a frozen {type(self).__name__}")


def _frozen_delattr(self: Any, name: str) -> None:
    raise FrozenRecordError(f"cannot delete field {name!r} of a frozen {type(self).__name__}")


def _make(cls: type[T], frozen: bool) -> type[T]:
    c: Any = cls  # the methods are set on the class object itself
    inherited: dict[str, Field] = {}
    for base in reversed(cls.__mro__[1:]):
        for f in getattr(base, "__record_fields__", ()):
            inherited[f.name] = f
    own: dict[str, Any] = vars(cls).get("__annotations__", {})
    for name, annotation in own.items():
        if str(annotation).startswith(("ClassVar", "typing.ClassVar")):
            continue
        spec = vars(cls).get(name, _MISSING)
        if isinstance(spec, Field):
            f = spec
            if f.default is _MISSING:
                delattr(cls, name)
            else:
                setattr(cls, name, f.default)
        else:
            f = Field(spec, _MISSING, True, True)
        f.name = name
        inherited.pop(name, None)
        inherited[name] = f
    all_fields = tuple(inherited.values())
    c.__record_fields__ = all_fields
    c.__record_init__ = tuple(f for f in all_fields if f.init)
    c.__init__ = _init
    c.__eq__ = _eq
    c.__repr__ = _repr
    setattr(c, "__match_args__", tuple(f.name for f in all_fields if f.init))  # noqa: B010
    if frozen:
        c.__setattr__ = _frozen_setattr
        c.__delattr__ = _frozen_delattr
        c.__hash__ = _hash
    else:
        c.__hash__ = None  # mutable and compared by value: unhashable, like a dataclass
    return cls


@overload
def record(cls: type[T], /) -> type[T]: ...
@overload
def record(*, frozen: bool = False) -> Any: ...


@dataclass_transform(field_specifiers=(field, Field))
def record(cls: type[T] | None = None, /, *, frozen: bool = False) -> Any:
    """``@record`` / ``@record(frozen=True)``: a data class (see the module's docstring)."""
    if cls is None:
        return lambda c: _make(c, frozen)
    return _make(cls, frozen)


def fields(obj: Any) -> tuple[Field, ...]:
    cls: Any = obj if isinstance(obj, type) else type(obj)
    return tuple(cls.__record_fields__)


def is_record(obj: Any) -> bool:
    return hasattr(obj if isinstance(obj, type) else type(obj), "__record_fields__")


def replace(obj: T, /, **changes: Any) -> T:
    """A copy of ``obj`` with ``changes`` (init fields only, like dataclasses.replace; a real
    dataclass goes to dataclasses.replace)."""
    cls: Any = type(obj)
    if not is_record(obj):
        import dataclasses

        return dataclasses.replace(obj, **changes)  # type: ignore[type-var]
    for f in cls.__record_fields__:
        if not f.init and f.name in changes:
            raise ValueError(f"field {f.name!r} is not set by __init__")
        if f.init and f.name not in changes:
            changes[f.name] = getattr(obj, f.name)
    out: T = cls(**changes)
    return out


def asdict(obj: Any) -> Any:
    """Records to dicts, recursively (tuples stay tuples, lists lists, dicts dicts)."""
    if is_record(obj) and not isinstance(obj, type):
        return {f.name: asdict(getattr(obj, f.name)) for f in type(obj).__record_fields__}
    if isinstance(obj, tuple):
        return tuple(asdict(v) for v in obj)
    if isinstance(obj, list):
        return [asdict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: asdict(v) for k, v in obj.items()}
    return obj


def check_types(obj: Any, where: str = "") -> None:
    """TypeError naming the field when a field of the record ``obj`` (recursively) holds what
    its annotation does not allow. Checked: str, int, float (an int too), bool, None, Literal,
    ``tuple[X, ...]``, ``dict[str, str]``, records and Literal aliases of the record's module,
    and unions of these; any other annotation is taken as it is. For records read from a file
    another process may write (a state's plan): a value of the wrong type must be refused where
    the file is read, not crash the reader that uses it."""
    cls: Any = type(obj)
    namespace = vars(sys.modules[cls.__module__])
    for f in cls.__record_fields__:
        spec = _annotation(cls, f.name)
        value = getattr(obj, f.name)
        if spec is not None and not _fits(value, spec, namespace, f"{where}{f.name}"):
            raise TypeError(f"{where}{f.name}: {str(value)[:40]!r} is not {spec}")


def _annotation(cls: Any, name: str) -> str | None:
    for base in cls.__mro__:
        spec = vars(base).get("__annotations__", {}).get(name)
        if spec is not None:
            return spec if isinstance(spec, str) else None
    return None


def _split(spec: str, sep: str) -> list[str]:
    """``spec`` split at ``sep`` outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(spec):
        depth += (ch == "[") - (ch == "]")
        if ch == sep and depth == 0:
            parts.append(spec[start:i].strip())
            start = i + 1
    parts.append(spec[start:].strip())
    return parts


def _literal(word: str) -> Any:
    if word[:1] in "\"'":
        return word[1:-1]
    return int(word) if word.lstrip("-").isdigit() else word


def _fits(value: Any, spec: str, namespace: dict[str, Any], where: str) -> bool:
    alternatives = _split(spec, "|")
    if len(alternatives) > 1:
        return any(_fits(value, a, namespace, where) for a in alternatives)
    if spec == "None":
        return value is None
    if spec == "str":
        return isinstance(value, str)
    if spec == "bool":
        return isinstance(value, bool)
    if spec == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if spec == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if spec.startswith("Literal[") and spec.endswith("]"):
        return value in [_literal(w) for w in _split(spec[8:-1], ",")]
    if spec.startswith("tuple[") and spec.endswith(", ...]"):
        inner = spec[6:-6]
        return isinstance(value, tuple) and all(
            _fits(v, inner, namespace, f"{where}[{i}]") for i, v in enumerate(value)
        )
    if spec == "dict[str, str]":
        return isinstance(value, dict) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        )
    target = namespace.get(spec)
    if isinstance(target, type) and is_record(target):
        if not isinstance(value, target):
            return False
        check_types(value, f"{where}.")
        return True
    args = getattr(target, "__args__", None)
    if args is not None and getattr(target, "__origin__", None) is Literal:
        return value in args
    return True  # an annotation this check does not read
