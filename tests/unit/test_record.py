"""governor/record.py: the run time's data classes behave like frozen/mutable dataclasses."""

from __future__ import annotations

import re
from typing import Literal

import pytest

from governor.record import (
    FrozenRecordError,
    asdict,
    check_types,
    field,
    fields,
    record,
    replace,
)


@record(frozen=True)
class Point:
    x: int
    y: int = 0
    tags: tuple[str, ...] = ()


@record
class Counter:
    name: str
    seen: list[int] = field(default_factory=list)
    total: int = field(default=0, init=False)
    hidden: str = field(default="", repr=False)

    def __post_init__(self) -> None:
        self.total = sum(self.seen)


@record(frozen=True)
class Line:
    a: Point
    b: Point


def test_fields_defaults_and_keywords_fill_like_a_dataclass() -> None:
    assert Point(1) == Point(x=1, y=0, tags=())
    assert Point(1, 2).y == 2
    assert [f.name for f in fields(Point)] == ["x", "y", "tags"]


def test_frozen_records_refuse_assignment_and_hash_by_value() -> None:
    p = Point(1, 2)
    with pytest.raises(FrozenRecordError):
        p.x = 3  # type: ignore[misc]  # the point of the test
    assert isinstance(FrozenRecordError(), AttributeError)
    assert hash(p) == hash(Point(1, 2))
    assert {p, Point(1, 2)} == {p}


def test_mutable_records_are_unhashable_and_run_post_init() -> None:
    c = Counter("a", [1, 2])
    assert c.total == 3
    c.total = 5
    assert c.total == 5
    with pytest.raises(TypeError):
        hash(c)
    assert Counter("b").seen == [] and Counter("b").seen is not Counter("b").seen


def test_bad_calls_are_type_errors() -> None:
    with pytest.raises(TypeError, match="missing value for field 'x'"):
        Point()  # type: ignore[call-arg]  # the point of the test
    with pytest.raises(TypeError, match="unexpected"):
        Point(1, z=2)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="twice"):
        Point(1, x=2)  # type: ignore[misc]
    with pytest.raises(TypeError, match="takes 3 arguments"):
        Point(1, 2, (), 4)  # type: ignore[call-arg]


def test_replace_asdict_and_repr() -> None:
    line = Line(Point(1), Point(2, 3, ("t",)))
    assert replace(line, a=Point(9)).a == Point(9)
    assert replace(line, a=Point(9)).b is line.b
    assert asdict(line) == {
        "a": {"x": 1, "y": 0, "tags": ()},
        "b": {"x": 2, "y": 3, "tags": ("t",)},
    }
    assert repr(Point(1)) == "Point(x=1, y=0, tags=())"
    assert "hidden" not in repr(Counter("a"))
    with pytest.raises(ValueError, match="not set by __init__"):
        replace(Counter("a"), total=3)
    assert Point(1) != (1, 0, ())  # type: ignore[comparison-overlap]  # not equal to a tuple


Mode = Literal["a", "b"]


@record(frozen=True)
class Typed:
    line: Line
    mode: Mode
    name: str | None = None
    ratio: float = 0.0
    env: dict[str, str] = field(default_factory=dict)


def test_check_types_names_the_field_that_holds_another_type() -> None:
    good = Typed(Line(Point(1), Point(2, 3, ("t",))), "a", "n", 1, {"k": "v"})
    check_types(good)  # an int where a float is annotated is a number all the same
    bad = {
        "line.b.x": Typed(Line(Point(1), Point("2")), "a"),  # type: ignore[arg-type]
        "line.a.tags": Typed(Line(Point(1, 0, (3,)), Point(2)), "a"),  # type: ignore[arg-type]
        "mode": Typed(Line(Point(1), Point(2)), "c"),  # type: ignore[arg-type]
        "name": Typed(Line(Point(1), Point(2)), "a", 0),  # type: ignore[arg-type]
        "ratio": Typed(Line(Point(1), Point(2)), "a", None, True),
        "env": Typed(Line(Point(1), Point(2)), "a", None, 0.0, {"k": 1}),  # type: ignore[dict-item]
        "line": Typed((1, 2), "a"),  # type: ignore[arg-type]
    }
    for where, value in bad.items():
        with pytest.raises(TypeError, match=rf"^{re.escape(where)}: "):
            check_types(value)
