"""``open_store``: one string names any store; PostgreSQL drivers are imported only when asked for."""

from __future__ import annotations

import importlib
import os
import unittest
from unittest import mock

from helpers import pg_support, support
from helpers.optional import skip_or_fail
from longrun import InvalidInputError, JsonFileStore, PostgresStore, SqliteStore
from longrun.stores import open_store
from longrun.stores._spec import _pg8000_arguments, postgres_connector


class OpenStoreTests(support.TempDirTest):
    def test_sqlite_specs(self) -> None:
        path = self.path("tasks.db")
        for spec in (f"sqlite:{path}", f"sqlite://{path}"):
            with self.subTest(spec=spec):
                store = open_store(spec)
                self.addCleanup(store.close)
                self.assertIsInstance(store, SqliteStore)
                self.assertEqual(store.path, path)
        relative = open_store("sqlite:tasks.db")
        self.assertEqual(relative.path, os.path.abspath("tasks.db"))
        self.assertFalse(os.path.exists("tasks.db"), "opening does not create the file")
        with self.assertRaises(InvalidInputError):
            open_store("sqlite:")
        with self.assertRaises(InvalidInputError):
            open_store(f"sqlite:{self.path('missing-dir', 'tasks.db')}", create=False)
        deeper = open_store(f"sqlite:{self.path('missing-dir', 'tasks.db')}")  # create=True: made on first use
        self.addCleanup(deeper.close)
        self.assertEqual(deeper.list_tasks(), [])
        self.assertTrue(os.path.isfile(self.path("missing-dir", "tasks.db")))

    def test_anything_else_is_a_json_file_store_directory(self) -> None:
        store = open_store(self.path("root"))
        self.assertIsInstance(store, JsonFileStore)
        self.assertFalse(os.path.exists(self.path("root")), "opening does not create the directory")
        for bad in ("", None, 5):
            with self.subTest(spec=bad), self.assertRaises(InvalidInputError):
                open_store(bad)  # type: ignore[arg-type]

    def test_read_only_opening_refuses_what_does_not_exist(self) -> None:
        with self.assertRaises(InvalidInputError):
            open_store(self.path("root"), create=False)
        with self.assertRaises(InvalidInputError):
            open_store(f"sqlite:{self.path('none.db')}", create=False)
        os.makedirs(self.path("root"))
        self.assertIsInstance(open_store(self.path("root"), create=False), JsonFileStore)

    def test_postgres_urls_make_a_store_without_connecting(self) -> None:
        for spec in ("postgresql://u:p@127.0.0.1:1/db", "postgres://u@127.0.0.1:1/db"):
            with self.subTest(spec=spec):
                if not pg_support.available_drivers():
                    skip_or_fail(pg_support.REQUIRE_VARIABLE, "no PostgreSQL driver (psycopg or pg8000) is installed")
                store = open_store(spec)
                self.assertIsInstance(store, PostgresStore)

    def test_with_no_driver_installed_a_postgres_url_is_refused_clearly(self) -> None:
        real = importlib.import_module

        def no_drivers(name: str, *args: object) -> object:
            if name.split(".")[0] in ("psycopg", "pg8000"):
                raise ImportError(f"No module named {name!r}")
            return real(name, *args)

        with mock.patch("importlib.import_module", no_drivers), self.assertRaises(InvalidInputError) as caught:
            open_store("postgresql://u@localhost/db")
        self.assertIn("psycopg", str(caught.exception))
        self.assertIn("pg8000", str(caught.exception))
        with self.assertRaises(InvalidInputError):
            postgres_connector("postgresql://u@localhost/db", driver="mysql")
        with self.assertRaises(InvalidInputError):
            postgres_connector("mysql://u@localhost/db")

    def test_importing_longrun_imports_no_driver(self) -> None:
        code = (
            "import sys, longrun, longrun.stores\n"
            "longrun.stores.open_store('sqlite:/tmp/x.db')\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('psycopg', 'pg8000')))"
        )
        result = support.run_python(["-c", code])
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout.strip(), "[]")


class Pg8000UrlTests(unittest.TestCase):
    """pg8000 takes keywords: the URL fields it can honour are translated, the rest refused."""

    def test_fields_are_translated(self) -> None:
        arguments = _pg8000_arguments("postgresql://us%40er:p%3Ass@db.example:6543/my%20db?application_name=x&connect_timeout=3")
        self.assertEqual(
            arguments,
            {"user": "us@er", "password": "p:ss", "database": "my db", "host": "db.example", "port": 6543,
             "application_name": "x", "timeout": 3.0},
        )

    def test_a_unix_socket_directory(self) -> None:
        arguments = _pg8000_arguments("postgresql://u@/db?host=/var/run/postgresql&port=5433")
        self.assertEqual(arguments["unix_sock"], "/var/run/postgresql/.s.PGSQL.5433")
        self.assertNotIn("host", arguments)

    def test_options_become_a_startup_parameter(self) -> None:
        arguments = _pg8000_arguments("postgresql://u@h/db?options=-csearch_path%3Dlongrun")
        self.assertEqual(arguments["startup_params"], {"options": "-csearch_path=longrun"})

    def test_ssl_modes(self) -> None:
        self.assertNotIn("ssl_context", _pg8000_arguments("postgresql://u@h/db?sslmode=disable"))
        context = _pg8000_arguments("postgresql://u@h/db?sslmode=require")["ssl_context"]
        self.assertFalse(context.check_hostname)
        self.assertTrue(_pg8000_arguments("postgresql://u@h/db?sslmode=verify-full")["ssl_context"].check_hostname)

    def test_what_pg8000_cannot_honour_is_refused(self) -> None:
        for url in (
            "postgresql://u@h/db?target_session_attrs=read-write",
            "postgresql://u@h:notaport/db",
            "postgresql://u@h/db?sslmode=bogus",
            "postgresql://u@h/db?connect_timeout=soon",
        ):
            with self.subTest(url=url), self.assertRaises(InvalidInputError):
                _pg8000_arguments(url)


if __name__ == "__main__":
    unittest.main()
