"""Storage: every request's timings in SQL (SQLite by default, PostgreSQL for teams).

    writer = RunWriter(db, name=..., endpoint=..., model=..., secrets=[api_key])
    writer.start_load_point(0, target_rate=10)
    writer.submit(record)            # from the event loop: O(1), never blocks
    writer.finish("completed", summary)
    cols = load_columns(writer.run_id)   # -> metrics.summarize(cols)

See models.py for the schema and codec.py for how requests and token gaps are encoded.

The names below are the only way in from outside this package: all SQL, the models and
the engine stay behind them (tests/test_layering_store.py checks that no other module
imports SQLAlchemy or a bench.store submodule). A caller that needs something new from the
store gets a function here, not a query of its own.
"""

import importlib

# name -> submodule. Imported on first use (PEP 562), so `from bench.store import StoreError`
# does not pull in SQLAlchemy, Alembic and pandas (`tokenbench --help` stays fast).
_WHERE = {
    "DatabaseError": "engine",
    "ENV_VAR": "engine",
    "dispose_all": "engine",
    "fault_message": "engine",
    "get_engine": "engine",
    "make_engine": "engine",
    "missing_sqlite_file": "engine",
    "resolve_url": "engine",
    "safe_url_text": "engine",
    "DamagedDatabaseError": "errors",
    "MissingDatabaseError": "errors",
    "RunBusyError": "errors",
    "RunNotFoundError": "errors",
    "SchemaOutdatedError": "errors",
    "SchemaTooNewError": "errors",
    "StoreError": "errors",
    "ImportFormatError": "importers",
    "import_file": "importers",
    "upgrade": "migrations",
    "COMPLETED": "models",
    "FAILED": "models",
    "INTERRUPTED": "models",
    "RUNNING": "models",
    "RUN_STATUSES": "models",
    "RequestPage": "paging",
    "request_page": "paging",
    "export_raw": "raw_export",
    "LoadPointInfo": "read",
    "RunInfo": "read",
    "delete_run": "read",
    "refuse_if_busy": "read",
    "get_run": "read",
    "list_runs": "read",
    "load_artifact": "read",
    "load_artifacts": "read",
    "load_columns": "read",
    "load_records": "read",
    "requests_dataframe": "read",
    "resolve_run": "read",
    "save_artifact": "read",
    "Redactor": "redact",
    "strip_url": "redact",
    "RunWriter": "writer",
    "tool_version": "writer",
}


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'bench.store' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"bench.store.{_WHERE[name]}"), name)
    globals()[name] = value
    return value


__all__ = sorted(_WHERE)
