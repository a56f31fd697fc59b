"""Optional extras: one place that knows which pip extra brings which module.

The base install (`pip install tokenbench`) runs, stores, sweeps, compares and serves the
dashboard. PowerPoint, Excel, Parquet and images need `tokenbench[export]`, PostgreSQL needs
`tokenbench[pg]`, Ray `tokenbench[ray]`, NVML `tokenbench[gpu]`, fitting the simulator to
measured points (scipy) `tokenbench[calibrate]`. A feature whose extra is
missing fails with one line naming the pip command, never a ModuleNotFoundError traceback.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

# module -> (extra, the pip distribution that provides it)
EXTRAS: dict[str, tuple[str, str]] = {
    "pptx": ("export", "python-pptx"),
    "lxml": ("export", "lxml"),
    "openpyxl": ("export", "openpyxl"),
    "pyarrow": ("export", "pyarrow"),
    "kaleido": ("export", "kaleido"),
    "psycopg": ("pg", "psycopg"),
    "ray": ("ray", "ray"),
    "pynvml": ("gpu", "nvidia-ml-py"),
    "scipy": ("calibrate", "scipy"),
}


class MissingExtraError(ValueError):
    """A feature needs an optional extra that is not installed; the message names it.

    A ValueError so that every command which already turns bad input into one line does
    the same with this; the API answers it with 400 and the same text.
    """


def install_hint(module: str) -> str:
    """The pip command that brings `module`, e.g. pip install 'tokenbench[export]'."""
    extra, _ = EXTRAS[module]
    return f"pip install 'tokenbench[{extra}]'"


def missing_message(module: str, feature: str) -> str:
    """'<feature> needs <dist>: pip install 'tokenbench[<extra>]''."""
    _, dist = EXTRAS[module]
    return f"{feature} needs {dist}: {install_hint(module)}"


def available(module: str) -> bool:
    """Whether `module` can be imported, without importing it (for pages that offer it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # ValueError: sys.modules[module] is None
        return False


def require(module: str, feature: str) -> ModuleType:
    """Import `module` or raise MissingExtraError: '<feature> needs <dist>: pip install ...'."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingExtraError(missing_message(module, feature)) from None
