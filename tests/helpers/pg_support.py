"""PostgreSQL for the tests: a DSN from the environment, a throwaway schema per test, both drivers.

The PostgreSQL tests run when ``LONGRUN_TEST_POSTGRES_DSN`` holds a URL such as
``postgresql://user:password@127.0.0.1:5432/dbname`` for a database the tests may create schemas
in, and a driver (psycopg 3 or pg8000) is installed. Otherwise they skip, unless
``LONGRUN_REQUIRE_POSTGRES=1`` (CI sets it), which makes them fail instead: CI must never pass
by skipping them. The contract suite runs once per driver, so under that variable both psycopg
and pg8000 must be installed (``.ci/run`` installs both).
"""

from __future__ import annotations

import os
import secrets
from typing import Any, Callable

from longrun.stores._spec import postgres_connector

from .optional import installed, skip_or_fail

DSN_VARIABLE = "LONGRUN_TEST_POSTGRES_DSN"
REQUIRE_VARIABLE = "LONGRUN_REQUIRE_POSTGRES"
DRIVERS = ("psycopg", "pg8000")


def dsn() -> str | None:
    return os.environ.get(DSN_VARIABLE) or None


def available_drivers() -> list[str]:
    return [name for name in DRIVERS if installed(name)]


def check(driver: str | None = None) -> None:
    """Raise SkipTest (or, when PostgreSQL is required, fail) unless the tests can reach a server."""
    reason = None
    if dsn() is None:
        reason = f"set {DSN_VARIABLE} to run the PostgreSQL tests"
    elif driver is not None and driver not in available_drivers():
        reason = f"the {driver} driver is not installed"
    elif not available_drivers():
        reason = "no PostgreSQL driver (psycopg or pg8000) is installed"
    if reason is not None:
        skip_or_fail(REQUIRE_VARIABLE, reason)


def default_driver() -> str:
    drivers = available_drivers()
    return drivers[0] if drivers else DRIVERS[0]


class Schema:
    """A uniquely named schema: ``factory()`` makes connections whose tables live in it."""

    def __init__(self, driver: str | None = None, prefix: str = "lr_test"):
        url = dsn()
        assert url is not None
        self.driver = driver or default_driver()
        self.url = url
        self.name = f"{prefix}_{secrets.token_hex(6)}"
        self._connect = postgres_connector(url, driver=self.driver)
        self.execute(f"CREATE SCHEMA {self.name}", schema=False)

    def connect(self, *, schema: bool = True) -> Any:
        connection = self._connect()
        if schema:
            cursor = connection.cursor()
            cursor.execute(f"SET search_path TO {self.name}")
            connection.commit()
        return connection

    def factory(self) -> Callable[[], Any]:
        return self.connect

    @property
    def spec(self) -> str:
        """The store URL whose connections use this schema (``options=-csearch_path=...``)."""
        separator = "&" if "?" in self.url else "?"
        return f"{self.url}{separator}options=-csearch_path%3D{self.name}"

    def execute(self, statement: str, params: tuple = (), *, schema: bool = True) -> list[tuple]:
        """Run one statement in its own transaction; the rows it returned, if any."""
        connection = self.connect(schema=schema)
        try:
            cursor = connection.cursor()
            cursor.execute(statement, params)
            rows = [tuple(row) for row in cursor.fetchall()] if cursor.description else []
            connection.commit()
            return rows
        finally:
            connection.close()

    def drop(self) -> None:
        self.execute(f"DROP SCHEMA IF EXISTS {self.name} CASCADE", schema=False)


class SchemaPerTest:
    """A test-case mixin: skip (or fail, when required) without PostgreSQL, and give each test a
    throwaway schema in ``self.schema``, dropped afterwards. Set ``driver`` on the class."""

    driver: str | None = None

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()  # type: ignore[misc]
        check(cls.driver)

    def setUp(self) -> None:
        super().setUp()  # type: ignore[misc]
        self.schema = Schema(self.driver)
        self.addCleanup(self.schema.drop)  # type: ignore[attr-defined]
