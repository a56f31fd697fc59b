"""Alembic environment: runs on the connection tokenbench hands it (bench.store.migrations).

Run by hand with `alembic -x url=... upgrade head` too, where it makes its own engine.
"""

from alembic import context

from bench.store.models import Base

config = context.config
target_metadata = Base.metadata


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is None:
        from bench.store.engine import make_engine

        url = context.get_x_argument(as_dictionary=True).get("url")
        with make_engine(url).connect() as conn:
            _run(conn)
            conn.commit()
        return
    _run(connection)


def _run(connection) -> None:  # noqa: ANN001
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    raise SystemExit("tokenbench migrations run online only")
run_migrations_online()
