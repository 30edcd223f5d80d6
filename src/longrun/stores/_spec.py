"""Opening a store from one string, as the CLI and configuration files name it.

::

    sqlite:PATH                       SqliteStore(PATH)  (sqlite:///abs/path also works)
    postgresql://user:pw@host/db      PostgresStore over psycopg 3, or else pg8000
    postgres://...                    the same
    anything else                     JsonFileStore(directory)

Drivers are imported here, lazily, only for a PostgreSQL URL, so ``import longrun`` never needs a
third-party package; with neither driver installed the URL is refused with ``InvalidInputError``.
Opening does not connect: the first store call does, and a connection failure is then a
``StorageError``. ``create`` is handed to the store: with ``create=True`` (the default here) a
SQLite file or JSON directory that does not exist is created on first use (a PostgreSQL schema gets
longrun's tables), with ``create=False`` it is refused (``InvalidInputError``): what an operator's
command wants. Either way a directory, file or schema that exists and is not a longrun store is
refused with ``NotAStoreError`` (see each store).
"""

from __future__ import annotations

import importlib
import os
import urllib.parse
from typing import Any, Callable

from ..errors import InvalidInputError
from ..protocols import Store

__all__ = ["open_store", "postgres_connector"]

_POSTGRES_SCHEMES = ("postgresql://", "postgres://")
_DRIVERS = ("psycopg", "pg8000")


def open_store(spec: str, *, create: bool = True) -> Store:
    """The store ``spec`` names (see the module docstring)."""
    if not isinstance(spec, str) or not spec:
        raise InvalidInputError(f"a store is named by a non-empty string, got {spec!r}")
    if spec.startswith("sqlite:"):
        from .sqlite import SqliteStore

        path = spec[len("sqlite:"):]
        if path.startswith("///"):
            path = path[2:]
        if not path:
            raise InvalidInputError("sqlite: needs a file path, as in sqlite:/var/lib/longrun/tasks.db")
        if not create and not os.path.exists(path):
            raise InvalidInputError(f"SQLite store {path!r} does not exist")
        return SqliteStore(path, create=create)
    if spec.startswith(_POSTGRES_SCHEMES):
        from .postgres import PostgresStore

        store = PostgresStore(postgres_connector(spec), create=create)
        store.spec = _without_password(spec)
        return store
    from .jsonfile import JsonFileStore

    if not create and not os.path.isdir(spec):
        raise InvalidInputError(f"store directory {spec!r} does not exist")
    return JsonFileStore(spec, create=create)


def _without_password(url: str) -> str:
    """``url`` as next actions may quote it: its password, in the URL or its query, left out."""
    try:
        parts = urllib.parse.urlsplit(url)
        netloc = parts.netloc.rpartition("@")
        if parts.password is not None:
            user = netloc[0].partition(":")[0]
            netloc = (user, "@", netloc[2])
        query = urllib.parse.urlencode([(k, v) for k, v in urllib.parse.parse_qsl(parts.query, keep_blank_values=True) if k != "password"])
        return urllib.parse.urlunsplit((parts.scheme, "".join(netloc), parts.path, query, parts.fragment))
    except ValueError:
        return "postgresql://..."


def postgres_connector(url: str, *, driver: str | None = None) -> Callable[[], Any]:
    """A connection factory for ``url``: psycopg 3 if installed, else pg8000 (or the ``driver`` named)."""
    if not url.startswith(_POSTGRES_SCHEMES):
        raise InvalidInputError("a PostgreSQL store is named by a postgresql:// or postgres:// URL")
    if driver is not None and driver not in _DRIVERS:
        raise InvalidInputError(f"unknown PostgreSQL driver {driver!r}; longrun knows {', '.join(_DRIVERS)}")
    for name in (driver,) if driver else _DRIVERS:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if name == "psycopg":
            return lambda: module.connect(url)
        arguments = _pg8000_arguments(url)
        dbapi = importlib.import_module("pg8000.dbapi")
        return lambda: dbapi.connect(**arguments)
    raise InvalidInputError(
        "a PostgreSQL store needs a driver: install psycopg (pip install 'psycopg[binary]') or pg8000"
        + (f"; {driver!r} is not installed" if driver else "")
    )


def _pg8000_arguments(url: str) -> dict[str, Any]:
    """pg8000 takes keywords, not a URL: the libpq URL fields it can honour, or a refusal."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise InvalidInputError(f"malformed PostgreSQL URL: {exc}") from None
    arguments: dict[str, Any] = {"user": urllib.parse.unquote(parts.username or "") or os.environ.get("USER", "postgres")}
    if parts.password is not None:
        arguments["password"] = urllib.parse.unquote(parts.password)
    database = urllib.parse.unquote(parts.path.lstrip("/"))
    if database:
        arguments["database"] = database
    host = parts.hostname
    query = dict(urllib.parse.parse_qsl(parts.query, keep_blank_values=True))
    host = query.pop("host", host)
    if "port" in query:
        try:
            port = int(query.pop("port"))
        except ValueError:
            raise InvalidInputError("the PostgreSQL URL's port must be a number") from None
    if query.get("dbname"):
        arguments["database"] = query.pop("dbname")
    if query.get("user"):
        arguments["user"] = query.pop("user")
    if "password" in query:
        arguments["password"] = query.pop("password")
    if host and host.startswith("/"):
        arguments["unix_sock"] = os.path.join(host, f".s.PGSQL.{port or 5432}")
    else:
        arguments["host"] = host or "localhost"
        arguments["port"] = port or 5432
    if "connect_timeout" in query:
        try:
            arguments["timeout"] = float(query.pop("connect_timeout"))
        except ValueError:
            raise InvalidInputError("connect_timeout must be a number of seconds") from None
    if "application_name" in query:
        arguments["application_name"] = query.pop("application_name")
    if "options" in query:  # e.g. options=-csearch_path%3Dlongrun: sent as a startup parameter
        arguments["startup_params"] = {"options": query.pop("options")}
    sslmode = query.pop("sslmode", None)
    if sslmode in ("require", "verify-ca", "verify-full"):
        import ssl

        context = ssl.create_default_context()
        if sslmode == "require":
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        elif sslmode == "verify-ca":
            context.check_hostname = False
        arguments["ssl_context"] = context
    elif sslmode not in (None, "disable", "allow", "prefer"):
        raise InvalidInputError(f"sslmode {sslmode!r} is not supported with pg8000")
    if query:
        raise InvalidInputError(
            f"PostgreSQL URL parameters {sorted(query)} are not supported with pg8000; install psycopg to use them"
        )
    return arguments
