"""Engine factory: SQLite file by default, any SQLAlchemy URL (PostgreSQL via psycopg 3).

Resolution order: an explicit URL or path, then $TOKENBENCH_DB, then results/tokenbench.db
relative to the current directory. A plain path means a SQLite file. SQLite runs in WAL mode
so the dashboard can read while a run writes, with synchronous=NORMAL (a commit survives a
killed process; only an OS crash can lose the last commits) and a bounded busy timeout so a
locked database becomes an error instead of a hang. URLs shown to users hide the password.
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

from sqlalchemy import create_engine, event
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.exc import ArgumentError, DatabaseError, NoSuchModuleError

from bench.store.errors import DamagedDatabaseError, StoreError, describe

ENV_VAR = "TOKENBENCH_DB"
DEFAULT_PATH = Path("results") / "tokenbench.db"
DEFAULT_BUSY_TIMEOUT_S = 10.0

_cache: dict[str, Engine] = {}
_cache_lock = threading.Lock()


def resolve_url(db: str | None = None) -> URL:
    """The URL a command will use: explicit, else $TOKENBENCH_DB, else the default file."""
    raw = db or os.environ.get(ENV_VAR) or str(DEFAULT_PATH)
    if "://" not in raw:
        return URL.create("sqlite", database=str(Path(raw).expanduser().resolve()))
    try:
        url = make_url(raw)
    except ArgumentError:
        raise StoreError(f"--db {safe_url_text(raw)!r} is not a database URL or path") from None
    if url.drivername in ("postgresql", "postgres"):
        url = url.set(drivername="postgresql+psycopg")  # psycopg 3, not psycopg2
    database = url.database or ""
    is_file = database not in ("", ":memory:") and not database.startswith("file:")
    if url.drivername.startswith("sqlite") and is_file:
        url = url.set(database=str(Path(database).expanduser().resolve()))
    return url


def safe_url_text(url: str | URL) -> str:
    """A URL fit for messages and logs: the password replaced by ***."""
    try:
        parsed = make_url(url) if isinstance(url, str) else url
    except ArgumentError:
        return "<unparseable database URL>"
    return parsed.render_as_string(hide_password=True)


def missing_sqlite_file(url: URL) -> Path | None:
    """The SQLite file `url` names when it does not exist yet, else None (other databases,
    in-memory ones and existing files). Read-only commands check this so they never create
    a database or its folder."""
    if url.get_backend_name() != "sqlite":
        return None
    database = url.database or ""
    if database in ("", ":memory:") or database.startswith("file:"):
        return None
    path = Path(database)
    return None if path.exists() else path


def make_engine(
    db: str | URL | None = None, *, busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S
) -> Engine:
    """A new Engine for the URL/path (creating the SQLite file's folder); no schema check."""
    url = db if isinstance(db, URL) else resolve_url(db)
    if url.drivername == "postgresql+psycopg":
        from bench.extras import MissingExtraError, require

        try:
            require("psycopg", "a PostgreSQL database")
        except MissingExtraError as exc:
            raise StoreError(f"--db {safe_url_text(url)}: {exc}") from None
    try:
        return _make_engine(url, busy_timeout_s)
    except (ArgumentError, NoSuchModuleError, ImportError) as exc:
        raise StoreError(f"--db {safe_url_text(url)}: cannot use this database ({exc})") from None


def _make_engine(url: URL, busy_timeout_s: float) -> Engine:
    if url.get_backend_name() == "sqlite":
        database = url.database or ""
        is_file = database and database != ":memory:" and not database.startswith("file:")
        if is_file and read_only_place(Path(database)):
            # WAL needs a -shm file beside the database; where none can be created SQLite
            # cannot even read without immutable=1 (nobody can change the file there anyway).
            # With both -wal and -shm present, read-only mode reads the WAL's commits too.
            wal, shm = Path(database + "-wal"), Path(database + "-shm")
            has_wal = wal.is_file() and wal.stat().st_size > 0 and shm.is_file()
            mode = "mode=ro" if has_wal else "mode=ro&immutable=1"
            url = url.set(database=f"file:{database}?{mode}", query={"uri": "true"})
        elif is_file:
            _check_folder(Path(database))
        engine = create_engine(
            url, connect_args={"timeout": busy_timeout_s, "check_same_thread": False}
        )
        _install_sqlite_pragmas(engine, busy_timeout_s)
        return engine
    if url.get_backend_name() == "postgresql":
        connect_args = {"connect_timeout": 10, "application_name": "tokenbench"}
        return create_engine(url, pool_pre_ping=True, connect_args=connect_args)
    return create_engine(url)


def _check_folder(database: Path) -> None:
    """Create the default results/ folder when missing; any other missing folder is an
    error naming it: a mistyped --db (sqlite:////nonexistent/dir/x.db) must not quietly
    create folders and store the run where nobody will look for it."""
    folder = database.parent
    if folder.is_dir():
        return
    if folder == DEFAULT_PATH.parent.resolve():
        folder.mkdir(parents=True, exist_ok=True)
        return
    raise StoreError(
        f"database {database}: the folder {folder} does not exist (a mistyped --db or "
        f"${ENV_VAR}?); create it first, or give a path in an existing folder"
    )


def read_only_place(path: Path) -> bool:
    """True for an existing database file on a read-only filesystem or not writable by us."""
    if not path.is_file():
        return False
    try:
        if os.statvfs(path).f_flag & os.ST_RDONLY:
            return True
    except (OSError, AttributeError):
        return False
    return not (os.access(path, os.W_OK) and os.access(path.parent, os.W_OK))


def _install_sqlite_pragmas(engine: Engine, busy_timeout_s: float) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record) -> None:  # noqa: ANN001 - DBAPI objects
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
        # A read-only file cannot switch journal mode; it keeps the one it has.
        with contextlib.suppress(Exception):
            cur.execute("PRAGMA journal_mode = WAL")
        cur.execute("PRAGMA synchronous = NORMAL")
        cur.execute("PRAGMA foreign_keys = ON")
        cur.execute("PRAGMA temp_store = MEMORY")
        cur.execute("PRAGMA cache_size = -65536")  # 64 MiB page cache
        cur.close()


def check_integrity(engine: Engine) -> None:
    """Refuse a damaged SQLite file before writing to it: writing spreads the damage.

    PRAGMA quick_check reads every page (about 1.5 s per GB); RunWriter calls it once per
    run, reads do not pay it (they get the same advice if they meet a damaged page).
    """
    if engine.url.get_backend_name() != "sqlite" or engine.url.database in (None, "", ":memory:"):
        return
    try:
        with engine.connect() as conn:
            problems = [str(r) for r in conn.exec_driver_sql("PRAGMA quick_check(3)").scalars()]
    except DatabaseError as exc:
        problems = [str(getattr(exc, "orig", exc))]
    if problems != ["ok"]:
        raise DamagedDatabaseError(damaged_message(engine, "; ".join(problems)))


def damaged_message(engine: Engine, problem: str) -> str:
    path = engine.url.database
    return (
        f"{describe(engine)} is damaged ({problem[:300]}); nothing more is written to it. "
        f"Recover what it holds with `sqlite3 {path} .recover | sqlite3 recovered.db`, "
        "or use another --db"
    )


def fault_message(exc: DatabaseError, db: str | Engine | None = None) -> str:
    """What a user is told about a database fault met while reading (a damaged page, a
    lost server): the database's name, the driver's first line, and for a damaged SQLite
    file how to recover it. `exc` is the DatabaseError the query raised."""
    engine = get_engine(db)
    problem = str(getattr(exc, "orig", exc)).strip().splitlines()[0]
    if "malformed" in problem or "not a database" in problem:
        return damaged_message(engine, problem)
    return f"{describe(engine)}: {problem}"


def get_engine(db: str | Engine | None = None) -> Engine:
    """The shared, schema-checked Engine for db (an Engine passes through after a check).

    Creates the schema in an empty database; raises SchemaTooNewError / SchemaOutdatedError
    when the database's revision is not this code's.
    """
    from bench.store.migrations import ensure_schema

    if isinstance(db, Engine):
        ensure_schema(db)
        return db
    url = resolve_url(db)
    key = url.render_as_string(hide_password=False)
    with _cache_lock:
        engine = _cache.get(key)
        if engine is None:
            engine = make_engine(url)
            ensure_schema(engine)
            _cache[key] = engine
    return engine


def dispose_all() -> None:
    """Close every cached engine (tests, and before deleting a database file)."""
    with _cache_lock:
        for engine in _cache.values():
            engine.dispose()
        _cache.clear()
