"""Alembic environment: migrates the connection handed over by migrate.upgrade, else the configured URL."""
from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, create_engine, pool

from specscope.backend.store.models import Base


def run_migrations(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=Base.metadata,
                      render_as_batch=connection.dialect.name == "sqlite")
    with context.begin_transaction():
        context.run_migrations()


config = context.config
shared = config.attributes.get("connection")
if shared is not None:
    run_migrations(shared)
else:
    url = context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option("sqlalchemy.url")
    if not url:
        raise SystemExit("no database: pass -x url=<SQLAlchemy URL>")
    with create_engine(url, poolclass=pool.NullPool).connect() as connection:
        run_migrations(connection)
