"""Engine launchers: how `tokenbench tune` turns a setting combination into a command line.

Each launcher is a kind of LAUNCHERS (bench.registry): a serving engine's command (with a
`{port}` placeholder), the path its health check answers on, the settings that matter for it
(name -> flag) and how to ask its version. `command` is the general kind: the experiment
file's own template, with `{port}` and a `{NAME}` placeholder per setting. A new engine is one
new module in this package that calls `LAUNCHERS.register(...)`.

Launch templates come only from the experiment file given on the command line, never from an
API request: nothing in the service imports this package (tests/test_layering.py).
Starting, health-polling and stopping the process is bench.launchers._process (a module
whose name starts with '_', so the registry does not read it as a kind).
"""

from __future__ import annotations

import shlex
import string
from dataclasses import dataclass, field
from typing import Any

from bench.registry import Registry


class LaunchSpecError(ValueError):
    """An experiment's launch section that cannot become a command line (says what to fix)."""


@dataclass(frozen=True)
class Setting:
    """One engine setting: its flag, and whether it is a switch (a flag without a value).

    A switch set true adds `flag`; set false it adds `off` (vLLM's --no-... forms) or
    nothing."""

    flag: str
    help: str
    switch: bool = False
    off: str | None = None


@dataclass(frozen=True)
class Launcher:
    """One engine's launch template. `command` and `version` may hold `{port}`; `version`
    may hold `{argv0}` (the command's first word, so a `binary` override is asked too)."""

    command: tuple[str, ...]
    settings: dict[str, Setting] = field(default_factory=dict)
    health: str = "/health"
    version: tuple[str, ...] | None = None
    start_timeout_s: float = 600.0


LAUNCHERS: Registry[Launcher] = Registry(
    "engine launcher", package=__name__, where="tune experiment's launch.engine"
)


def _text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def fill(template: str, values: dict[str, Any], where: str) -> str:
    """`template` with its `{NAME}` placeholders filled from `values`; an unknown name is
    an error naming the placeholder and the names there are."""
    names = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    missing = [n for n in names if n not in values]
    if missing:
        known = ", ".join(sorted(values)) or "(none)"
        raise LaunchSpecError(
            f"{where}: placeholder {{{missing[0]}}} names no setting; the settings are {known}"
        )
    try:
        return template.format_map({k: _text(v) for k, v in values.items()})
    except (ValueError, IndexError) as exc:
        raise LaunchSpecError(f"{where}: {template!r} is not a template ({exc})") from None


def command_line(
    engine: str,
    *,
    template: str | None,
    binary: str | None,
    fixed: dict[str, Any],
    settings: dict[str, Any],
    port: int,
) -> list[str]:
    """The argv of one combination: the `command` kind fills `template`; a named engine
    appends each setting's flag (fixed settings first, then the combination's). A setting
    whose name starts with '-' is passed as that flag as it stands."""
    values = {**fixed, **settings, "port": port}
    if engine == "command":
        if not template:
            raise LaunchSpecError("launch.command: give the engine's command line")
        argv = [fill(word, values, "launch.command") for word in shlex.split(template)]
        unused = [n for n in settings if not any(f"{{{n}}}" in w for w in shlex.split(template))]
        if unused:
            raise LaunchSpecError(
                f"params.{unused[0]}: the launch.command has no {{{unused[0]}}} placeholder, "
                "so the setting would not change the engine; add it to the command"
            )
        return argv
    if template:
        raise LaunchSpecError(
            f"launch: give either engine: {engine} or command:, not both "
            "(engine: command takes a command template)"
        )
    launcher = LAUNCHERS.get(engine)
    argv = [fill(word, values, f"launch.engine {engine}") for word in launcher.command]
    if binary:
        argv[0] = binary
    positional: list[str] = []  # the model of vllm serve and trtllm-serve: before any flag
    flags: list[str] = []
    for name, value in {**fixed, **settings}.items():
        is_positional = launcher.settings.get(name, Setting("-", "")).flag == ""
        (positional if is_positional else flags).extend(flag_words(engine, launcher, name, value))
    return argv + positional + flags


def flag_words(engine: str, launcher: Launcher, name: str, value: Any) -> list[str]:
    """The words one setting adds to an engine's command line."""
    if name.startswith("-"):
        setting = Setting(name, "", switch=isinstance(value, bool))
    elif name in launcher.settings:
        setting = launcher.settings[name]
    else:
        known = ", ".join(launcher.settings)
        raise LaunchSpecError(
            f"setting {name!r} is not one {engine} knows ({known}); "
            f"give the flag itself as the name (e.g. '--{name.replace('_', '-')}') to pass it"
        )
    if setting.switch:
        if not isinstance(value, bool):
            raise LaunchSpecError(
                f"setting {name!r} is a switch: give true or false, not {value!r}"
            )
        if value:
            return [setting.flag]
        return [setting.off] if setting.off else []
    # an empty flag is a positional argument (trtllm-serve's MODEL)
    return [setting.flag, _text(value)] if setting.flag else [_text(value)]


def version_command(engine: str, argv: list[str], given: str | None) -> list[str] | None:
    """The command that prints the engine's version: the file's `launch.version`, else the
    launcher's own; None when neither says."""
    if given:
        return shlex.split(given)
    launcher = LAUNCHERS.get(engine)
    if launcher.version is None:
        return None
    return [w.replace("{argv0}", argv[0]) for w in launcher.version]
