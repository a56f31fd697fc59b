"""Alembic migrations shipped inside the package, driven from Python (no alembic.ini).

`upgrade(engine)` brings a database to this code's head revision (`tokenbench db upgrade`).
`ensure_schema(engine)` runs whenever a store opens a database: it creates the schema in an
empty database, and refuses, with a message saying what to do, a database stamped with a
revision this code does not know (made by a newer tokenbench) or an older one.
"""

from __future__ import annotations

import re
import threading
import weakref
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import inspect, text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError

from bench.store.errors import SchemaOutdatedError, SchemaTooNewError, StoreError, describe

if TYPE_CHECKING:
    from alembic.config import Config

HERE = Path(__file__).resolve().parent
# Engines whose schema was checked. Held weakly, never by id(): a freed engine's id is
# reused by the next one, which then skipped creating its tables ("no such table: runs").
_checked: weakref.WeakSet[Engine] = weakref.WeakSet()
_lock = threading.Lock()


def alembic_config() -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(HERE))
    return config


@cache
def _revision_graph() -> dict[str, str | None]:
    """revision -> down_revision, read from the version files' own assignments.

    Checking an existing database's revision is on every run's start; reading two lines per
    file costs microseconds where importing Alembic costs ~0.1 s. Alembic reads the same
    files when it migrates (upgrade()), so there is one source of truth.
    """
    graph: dict[str, str | None] = {}
    assign = r"^{}\s*(?::[^=]*)?=\s*(?:None|[\"']([^\"']+)[\"'])"
    for path in sorted((HERE / "versions").glob("[!_]*.py")):
        source = path.read_text()
        rev = re.search(assign.format("revision"), source, re.M)
        down = re.search(assign.format("down_revision"), source, re.M)
        if rev is None or rev.group(1) is None or down is None:
            raise RuntimeError(f"{path}: no revision/down_revision assignment")
        graph[rev.group(1)] = down.group(1)
    return graph


def head_revision() -> str:
    graph = _revision_graph()
    heads = set(graph) - {down for down in graph.values() if down}
    assert len(heads) == 1, f"migrations have {len(heads)} heads: {sorted(heads)}"
    return heads.pop()


def known_revisions() -> set[str]:
    return set(_revision_graph())


def current_revision(engine: Engine) -> str | None:
    """The database's stamped revision (None for a database tokenbench never touched)."""
    with engine.connect() as conn:
        if not inspect(conn).has_table("alembic_version"):
            return None
        return conn.execute(text("SELECT version_num FROM alembic_version")).scalar()


def upgrade(engine: Engine) -> str:
    """Migrate the database to the head revision and return it; refuses a newer database.

    It takes an Engine (bench.store.make_engine) rather than a URL: the engine factory
    checks schemas with this module, so this module does not import it back.
    """
    from alembic import command

    _refuse_newer(engine)
    config = alembic_config()
    try:
        with engine.begin() as conn:
            config.attributes["connection"] = conn
            command.upgrade(config, "head")
    except SQLAlchemyError as exc:
        raise StoreError(f"{describe(engine)}: upgrade failed: {exc.orig or exc}") from exc
    with _lock:
        _checked.add(engine)
    return head_revision()


def _refuse_newer(engine: Engine) -> str | None:
    try:
        rev = current_revision(engine)
    except SQLAlchemyError as exc:
        raise StoreError(f"cannot open {describe(engine)}: {exc.orig or exc}") from exc
    if rev is not None and rev not in known_revisions():
        raise SchemaTooNewError(
            f"{describe(engine)} has schema revision {rev}, made by a newer tokenbench than "
            f"this one (which knows up to {head_revision()}); upgrade tokenbench "
            "(pip install -U tokenbench) to read it"
        )
    return rev


def ensure_schema(engine: Engine) -> None:
    """Create the schema in an empty database; check the revision of an existing one."""
    with _lock:
        if engine in _checked:
            return
    rev = _refuse_newer(engine)
    if rev is None:
        try:
            existing = set(inspect(engine).get_table_names())
        except SQLAlchemyError as exc:
            raise StoreError(f"cannot open {describe(engine)}: {exc.orig or exc}") from exc
        if "runs" in existing:
            raise SchemaOutdatedError(
                f"{describe(engine)} has tokenbench tables but no schema revision; "
                "run `tokenbench db upgrade` after backing it up"
            )
        upgrade(engine)
        return
    if rev != head_revision():
        raise SchemaOutdatedError(
            f"{describe(engine)} has schema revision {rev}, older than this tokenbench's "
            f"{head_revision()}; run `tokenbench db upgrade --db ...` (back it up first)"
        )
    with _lock:
        _checked.add(engine)
