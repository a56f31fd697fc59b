"""API answer models derived from the library's dataclasses, so each shape is typed once.

An answer that is a library dataclass as it is (bench.plan.Demand, bench.cost.CostRow) is
used as the model itself. One that needs a little more (JSON has no infinity, a property
or method is part of the answer, a field has a description for /docs) is
`answer_model(Dataclass, ...)`: the dataclass's fields with their types and defaults,
with only the differences written here, so a field added to the dataclass reaches the API
and its schema without a second copy.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, create_model


def finite(v: float | None) -> float | None:
    """JSON has no infinity: an unbounded rate ("rate inf") reads as null plus its title."""
    return None if v is None or not math.isfinite(v) else v


# A float that is null when infinite; a method's value (Ratio.text) read as an attribute.
Finite = BeforeValidator(finite)
Called = BeforeValidator(lambda v: v() if callable(v) else v)


class Answer(BaseModel):
    """Base of derived answers: built from a library object's attributes with `of`."""

    model_config = ConfigDict(from_attributes=True)

    @classmethod
    def of(cls, obj: Any) -> Any:
        """The answer for `obj` (None for None)."""
        return None if obj is None else cls.model_validate(obj)


def answer_model(
    source: type,
    name: str,
    *,
    doc: str,
    drop: tuple[str, ...] = (),
    fields: dict[str, tuple[Any, Any]] | None = None,
) -> type[Answer]:
    """A model with `source`'s dataclass fields less `drop`; `fields` (name -> (type,
    default or Field(...))) replace a field of the same name in place or are added after
    (properties and methods of `source` are read like fields)."""
    hints = typing.get_type_hints(source)
    given = dict(fields or {})
    spec: dict[str, Any] = {}
    for f in dataclasses.fields(source):
        if f.name in drop:
            continue
        if f.name in given:
            spec[f.name] = given.pop(f.name)
        elif f.default is not dataclasses.MISSING:
            spec[f.name] = (hints[f.name], f.default)
        elif f.default_factory is not dataclasses.MISSING:
            spec[f.name] = (hints[f.name], Field(default_factory=f.default_factory))
        else:
            spec[f.name] = (hints[f.name], ...)
    spec.update(given)
    model = create_model(name, __base__=Answer, __module__=__name__, **spec)
    model.__doc__ = doc
    return model


__all__ = ["Annotated", "Answer", "Called", "Finite", "answer_model"]
