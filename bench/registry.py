"""Named registries of kinds: one place to add a load shape, a dialect, an export format, ...

Each seam of tokenbench (DESIGN.md, "Seams we keep") is a `Registry`: a name -> `Kind`
table, where a kind has a name, a one-line description (the README, --help and the API's
listing read it) and the object that does the work. A registry names a package of kinds;
every module in that package is imported the first time the registry is read, so adding a
kind is one new module in that package that calls `REGISTRY.register(...)`, and nothing
else changes: the scenario's validation, the CLI's help, the API's allowed values and the
README check all read the registry.

Modelled on guidellm's registries of backends and profiles (objects registered under a
name, and a package whose modules are imported to fill the registry).
"""

from __future__ import annotations

import importlib
import pkgutil
import threading
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, Generic, TypeVar

T = TypeVar("T")

# The modules that define a registry: `all_registries` imports them, so a test or a listing
# sees every registry whether or not anything else imported it yet.
REGISTRY_MODULES = (
    "bench.datasets",
    "bench.lengths",
    "bench.shapes",
    "bench.traces",
    "bench.backends.dialects",
    "bench.export.formats",
    "bench.telemetry.sources",
    "bench.telemetry.engines",
)


class UnknownKindError(ValueError):
    """A name no kind of the registry has; the message lists the names it has."""


@dataclass
class Kind(Generic[T]):
    """One registered kind: its name, a one-line description, and the object itself.

    A kind registered with `register_lazy` names its object as "module:attribute" and is
    imported when first used, so listing a registry (the CLI's --help) imports no numpy."""

    name: str
    description: str
    _obj: T | None = None
    _target: str | None = None

    @property
    def obj(self) -> T:
        if self._obj is None:
            module, _, attribute = (self._target or "").partition(":")
            self._obj = getattr(importlib.import_module(module), attribute)
        return self._obj


_REGISTRIES: dict[str, Registry] = {}


class Registry(Generic[T]):
    """Kinds of one seam by name, filled by the modules of `package` on first read.

    `noun` names the seam in messages ("load shape"); `where` says where a user gives the
    name (a flag or a scenario field), so an unknown name's error says where to fix it.
    """

    def __init__(self, noun: str, *, package: str | None, where: str, listed: bool = True) -> None:
        if listed and noun in _REGISTRIES:
            raise ValueError(f"a registry of {noun}s exists already")
        self.noun = noun
        self.where = where
        self.package = package
        self._kinds: dict[str, Kind[T]] = {}
        self._loaded = package is None
        self._loading = False
        self._lock = threading.RLock()
        if listed:  # `listed=False`: a registry all_registries leaves out (tests' own)
            _REGISTRIES[noun] = self

    # ------------------------------------------------------------ adding kinds

    def register(self, name: str, description: str, obj: T) -> T:
        """Add a kind; a second kind of the same name is an error (the first stays)."""
        self._add(Kind(name, description, _obj=obj))
        return obj

    def register_lazy(self, name: str, description: str, target: str) -> None:
        """Add a kind whose object is `target` ("module:attribute"), imported on first use."""
        if ":" not in target:
            raise ValueError(f"{self.noun} {name!r}: target {target!r} must be module:attribute")
        self._add(Kind(name, description, _target=target))

    def _add(self, kind: Kind[T]) -> None:
        name = kind.name
        if not name or name != name.strip() or " " in name:
            raise ValueError(f"{self.noun} name {name!r}: give a non-empty name without spaces")
        if not kind.description or "\n" in kind.description:
            raise ValueError(f"{self.noun} {name!r}: give a one-line description")
        if name in self._kinds:
            raise ValueError(f"{self.noun} {name!r} is registered already")
        self._kinds[name] = kind

    def unregister(self, name: str) -> None:
        """Remove a kind (tests add throwaway kinds and take them out again)."""
        self._load()
        if name not in self._kinds:
            raise self._unknown(name)
        del self._kinds[name]

    # ------------------------------------------------------------ reading

    def get(self, name: str) -> T:
        """The object of the kind called `name`, or UnknownKindError listing the known names."""
        self._load()
        found = self._kinds.get(name)
        if found is None:
            raise self._unknown(name)
        return found.obj

    def kinds(self) -> list[Kind[T]]:
        """Every kind, in the order registered."""
        self._load()
        return list(self._kinds.values())

    def names(self) -> tuple[str, ...]:
        self._load()
        return tuple(self._kinds)

    def describe(self) -> dict[str, str]:
        """name -> description, for listings (the API, --help); imports no kind's object."""
        self._load()
        return {k.name: k.description for k in self._kinds.values()}

    def help(self) -> str:
        """The names as a help text lists them: 'a, b or c'."""
        names = self.names()
        return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"

    def __contains__(self, name: object) -> bool:
        self._load()
        return name in self._kinds

    def names_where(self, only: Callable[[T], bool] | None = None) -> tuple[str, ...]:
        """The names of the kinds whose object passes `only` (all without it)."""
        if only is None:
            return self.names()
        return tuple(k.name for k in self.kinds() if only(k.obj))

    def name_type(self, only: Callable[[T], bool] | None = None) -> Any:
        """A pydantic type: a str that must name a kind (one passing `only`, when given),
        with those names as its JSON-schema enum.

        The enum is read when the schema is generated, not when the model is defined, so a
        kind registered later (a plugin module, a test's throwaway kind) is listed too.
        """
        return Annotated[str, _KindName(self, only)]

    def as_enum(self, name: str, only: Callable[[T], bool] | None = None) -> type[StrEnum]:
        """The names as a StrEnum, for a CLI option whose --help lists its choices."""
        return StrEnum(name, {n: n for n in self.names_where(only)})

    def _unknown(self, name: str) -> UnknownKindError:
        known = ", ".join(self._kinds) or "(none)"
        return UnknownKindError(
            f"unknown {self.noun} {name!r} ({self.where}): choose one of {known}"
        )

    def _load(self) -> None:
        """Import every module of the package once (a scraper thread may be first to read:
        others wait; a module that reads the registry while it is imported sees what is
        registered so far; a module that fails to import fails every read until fixed)."""
        if self._loaded:
            return
        with self._lock:
            if self._loaded or self._loading:
                return
            self._loading = True
            try:
                package = importlib.import_module(self.package)
                for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
                    if not info.name.startswith("_"):
                        importlib.import_module(f"{self.package}.{info.name}")
                self._loaded = True
            finally:
                self._loading = False


class _KindName:
    """pydantic hooks for Registry.name_type: validate against the registry, list its names."""

    def __init__(self, registry: Registry, only: Callable[[Any], bool] | None) -> None:
        self.registry = registry
        self.only = only

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> Any:
        from pydantic_core import PydanticCustomError, core_schema

        def check(value: str) -> str:
            names = self.registry.names_where(self.only)
            if value not in names:
                # pydantic names the field and the value; the message lists the choices.
                raise PydanticCustomError(
                    "unknown_kind",
                    "unknown {noun}; choose one of {choices}",
                    {"noun": self.registry.noun, "choices": ", ".join(names)},
                )
            return value

        return core_schema.no_info_after_validator_function(check, handler(source))

    def __get_pydantic_json_schema__(self, schema: Any, handler: Any) -> dict:
        out = handler(schema)
        out["enum"] = list(self.registry.names_where(self.only))
        return out


def all_registries() -> list[Registry]:
    """Every registry of tokenbench, each with its kinds loaded."""
    for module in REGISTRY_MODULES:
        importlib.import_module(module)
    order = {module: i for i, module in enumerate(REGISTRY_MODULES)}
    registries = sorted(_REGISTRIES.values(), key=lambda r: order.get(r.package, len(order)))
    for registry in registries:
        registry._load()
    return registries


def markdown() -> str:
    """Every registry and its kinds as the README lists them (tests check it is the same)."""
    lines = []
    for registry in all_registries():
        folder = (registry.package or "").replace(".", "/")
        lines.append(
            f"- **{registry.noun}** ({registry.where}; a new one: a module in `{folder}/`)"
        )
        lines += [f"  - `{name}`: {text}" for name, text in registry.describe().items()]
    return "\n".join(lines) + "\n"
