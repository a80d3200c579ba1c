"""Postgres for the ledger's tests: one pgserver for the session, a fresh database per test.

Imported by tests/conftest.py, so every test module has them (a module may define its own);
a test that takes ``dsn`` skips cleanly where pgserver or psycopg is not installed.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The superuser DSN of a Postgres server that lives as long as the test session."""
    pgserver = pytest.importorskip("pgserver")
    pytest.importorskip("psycopg")
    postgres = pgserver.get_server(tmp_path_factory.mktemp("pgdata"), cleanup_mode="stop")
    yield postgres.get_uri()
    postgres.cleanup()


@pytest.fixture
def dsn(server: str) -> str:
    """A fresh, empty database."""
    import psycopg
    from psycopg import sql
    from psycopg.conninfo import make_conninfo

    name = f"gae_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return make_conninfo(server, dbname=name)
