"""The MCP protocol revisions ``longrun mcp`` speaks, and the rules of the stateless one (2026-07-28).

Two kinds of revision share one stdio connection's framing:

- The handshake revisions (``HANDSHAKE_VERSIONS``, 2024-11-05 to 2025-11-25): a session opens with
  ``initialize``, which negotiates one revision for the whole connection.
- The stateless revision (``STATELESS_VERSIONS``, 2026-07-28, the current one): there is no handshake;
  every request names its revision and the client's capabilities in ``params._meta`` (the envelope),
  a client may probe with ``server/discover``, and every result carries ``resultType``.

This module owns the envelope's check (``read_envelope``) and what a stateless result carries
(``stamp_result``); the server decides which kind a connection speaks.

Not guaranteed: the client's capabilities and identity in the envelope are read for their shape only;
the server asks nothing of the client, so it needs none of them.
"""

from __future__ import annotations

from typing import Any

from .. import __version__
from ..canonical import JSONValue

__all__ = [
    "CACHEABLE_METHODS",
    "CLIENT_CAPABILITIES_KEY",
    "ENVELOPE_VERSION_KEY",
    "EnvelopeError",
    "HANDSHAKE_VERSIONS",
    "PROTOCOL_VERSIONS",
    "SERVER_INFO",
    "SERVER_INFO_KEY",
    "STATELESS_VERSIONS",
    "SUBSCRIPTION_ID_KEY",
    "UNSUPPORTED_PROTOCOL_VERSION",
    "has_envelope",
    "read_envelope",
    "stamp_result",
]

STATELESS_VERSIONS = ("2026-07-28",)
"""The stateless revisions, newest first: the current revision of MCP is the first."""
HANDSHAKE_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")
"""The revisions ``initialize`` negotiates, newest first; the first is its answer to any other."""
PROTOCOL_VERSIONS = STATELESS_VERSIONS + HANDSHAKE_VERSIONS
"""Every revision this server speaks, newest first."""

ENVELOPE_VERSION_KEY = "io.modelcontextprotocol/protocolVersion"
CLIENT_CAPABILITIES_KEY = "io.modelcontextprotocol/clientCapabilities"
CLIENT_INFO_KEY = "io.modelcontextprotocol/clientInfo"
SERVER_INFO_KEY = "io.modelcontextprotocol/serverInfo"
SUBSCRIPTION_ID_KEY = "io.modelcontextprotocol/subscriptionId"

UNSUPPORTED_PROTOCOL_VERSION = -32022
INVALID_PARAMS = -32602

SERVER_INFO: dict[str, JSONValue] = {"name": "longrun", "title": "longrun: durable tasks", "version": __version__}

CACHEABLE_METHODS = frozenset(
    {"server/discover", "tools/list", "resources/list", "resources/templates/list", "resources/read", "prompts/list"}
)
"""Results the stateless revision requires to say how long a client may cache them."""


class EnvelopeError(Exception):
    """A stateless request whose envelope is missing, malformed or names a revision not spoken."""

    def __init__(self, code: int, message: str, data: dict[str, JSONValue] | None = None):
        super().__init__(message)
        self.code = code
        self.data = data


def has_envelope(params: dict[str, Any]) -> bool:
    """Whether a request claims the stateless revision: its ``_meta`` names a protocol version.

    The key alone decides (its prefix is reserved), so a half-built envelope is still read as a
    stateless request and told what it lacks; a handshake request's ``_meta`` (a progress token)
    never has it.
    """
    meta = params.get("_meta")
    return isinstance(meta, dict) and ENVELOPE_VERSION_KEY in meta


def read_envelope(params: dict[str, Any]) -> str:
    """The revision a stateless request names, once its envelope is checked; else ``EnvelopeError``.

    A missing or malformed envelope is ``-32602``; a revision this server does not speak is
    ``-32022`` whose ``data.supported`` lists every revision it speaks, so that a client which
    shares no stateless revision with it knows it may fall back to ``initialize``.
    """
    meta = params.get("_meta")
    if not isinstance(meta, dict):
        raise EnvelopeError(
            INVALID_PARAMS, f"invalid params: params._meta must be an object carrying {ENVELOPE_VERSION_KEY!r} and {CLIENT_CAPABILITIES_KEY!r}"
        )
    missing = [key for key in (ENVELOPE_VERSION_KEY, CLIENT_CAPABILITIES_KEY) if key not in meta]
    if missing:
        raise EnvelopeError(INVALID_PARAMS, f"invalid params: params._meta is missing {', '.join(missing)}")
    version = meta[ENVELOPE_VERSION_KEY]
    if not isinstance(version, str):
        raise EnvelopeError(INVALID_PARAMS, f"invalid params: {ENVELOPE_VERSION_KEY} must be a string")
    if not isinstance(meta[CLIENT_CAPABILITIES_KEY], dict):
        raise EnvelopeError(INVALID_PARAMS, f"invalid params: {CLIENT_CAPABILITIES_KEY} must be an object")
    if CLIENT_INFO_KEY in meta and not isinstance(meta[CLIENT_INFO_KEY], dict):
        raise EnvelopeError(INVALID_PARAMS, f"invalid params: {CLIENT_INFO_KEY} must be an object")
    if version not in STATELESS_VERSIONS:
        raise EnvelopeError(
            UNSUPPORTED_PROTOCOL_VERSION,
            f"unsupported protocol version {version[:100]!r}: this server speaks {', '.join(PROTOCOL_VERSIONS)}",
            {"supported": list(PROTOCOL_VERSIONS), "requested": version},
        )
    return version


def stamp_result(method: str, result: dict[str, JSONValue]) -> dict[str, JSONValue]:
    """``result`` as the stateless revision sends it: tagged ``complete``, with the server's identity in
    ``_meta``, and, for what a client may cache, a lifetime of zero (a task's status changes at any
    time, and the tool list depends on the server's arguments)."""
    stamped = dict(result)
    stamped["resultType"] = "complete"
    meta = stamped.get("_meta")
    stamped["_meta"] = {**(meta if isinstance(meta, dict) else {}), SERVER_INFO_KEY: dict(SERVER_INFO)}
    if method in CACHEABLE_METHODS:
        stamped.setdefault("ttlMs", 0)
        stamped.setdefault("cacheScope", "private")
    return stamped
