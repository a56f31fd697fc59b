"""Store errors: one exception family, each message naming the database (never its password)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine


def describe(engine: Engine) -> str:
    """How error messages name a database: the SQLite file path or the URL without its
    password."""
    url = engine.url
    if url.get_backend_name() == "sqlite":
        return f"SQLite database {url.database}"
    return f"database {url.render_as_string(hide_password=True)}"


class StoreError(RuntimeError):
    """A database problem the user can act on: locked, read-only, full, unreachable, too new."""


class SchemaTooNewError(StoreError):
    """The database was migrated by a newer tokenbench than this one."""


class SchemaOutdatedError(StoreError):
    """The database predates this tokenbench's schema; `tokenbench db upgrade` fixes it."""


class RunNotFoundError(StoreError, LookupError):
    """No run matches the id, id prefix or name given (or more than one does)."""


class MissingDatabaseError(StoreError):
    """A read-only command was pointed at a SQLite file that does not exist (none is made)."""


class DamagedDatabaseError(StoreError):
    """The SQLite file is corrupt (a damaged page, a torn write); nothing is written to it."""


class RunBusyError(StoreError):
    """The run is still being written by a live process; deleting it would break that run."""
