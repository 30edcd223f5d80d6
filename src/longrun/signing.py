"""Signed control records: keys, HMAC-SHA256 signatures, and the sources that pass on only what
verifies.

A record counts only if it carries an HMAC-SHA256 over every field (``signed_fields()``) under the
configured key. For an approval that is the full scope (task id, plan digest, step id, payload
digest, action), the expiry, the approver, the grant time and the approval id, which is the nonce.
Signatures are made by ``sign_approval`` and ``sign_cancellation`` (``longrun approve|cancel
--sign-key``) and compared with ``hmac.compare_digest``. ``SignedApprovals`` and
``SignedCancellations`` wrap any source (a store, a ``FileControlSource``) and hand over a record
that does not verify as a ``RefusedRecord`` whose ``error`` says why.

Keys are files of at least 32 bytes (surrounding whitespace ignored) that group and others cannot
access at all (``load_key``), like an OpenSSH private key.

Not guaranteed: HMAC is symmetric, so whoever can verify can also sign (the runner's key lets the
runner's host forge); a signature proves who wrote a record, not that a record which was deleted
was ever there. ``longrun.authority`` says how this composes with where a record lies.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import os
import re
import secrets
import stat
from dataclasses import replace

from .approval import Approval
from .cancellation import Cancellation
from .canonical import JSONValue, canonical_bytes, ensure_json
from .control import ControlRecord, RefusedRecord
from .errors import CorruptStateError, InvalidInputError
from .protocols import ApprovalSource, CancellationSource, WatchedSource

__all__ = [
    "KEY_MIN_BYTES",
    "SignedApprovals",
    "SignedCancellations",
    "generate_key_file",
    "key_id",
    "load_key",
    "sign_approval",
    "sign_cancellation",
    "verify_approval",
    "verify_cancellation",
]

KEY_MIN_BYTES = 32
MAX_KEY_FILE_BYTES = 4096
ALGORITHM = "hmac-sha256"

_KEY_ID = re.compile(r"[0-9a-f]{16}")
_MAC = re.compile(r"[0-9a-f]{64}")
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


def _is_symlink(path: str) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(path).st_mode)
    except OSError:
        return False


def _refuse(raw: ControlRecord, reason: str) -> RefusedRecord:
    # The body is dropped so that nothing downstream can use a refused record by mistake.
    return RefusedRecord(name=raw.name, error=reason, digest=raw.digest)


# -- keys -------------------------------------------------------------------------------------


def _checked_key(key: object) -> bytes:
    if not isinstance(key, (bytes, bytearray)) or len(key) < KEY_MIN_BYTES:
        raise InvalidInputError(f"a signing key must be at least {KEY_MIN_BYTES} bytes")
    return bytes(key)


def key_id(key: bytes) -> str:
    """A short public name for a key (16 hex digits), so evidence can say which key signed."""
    return hashlib.sha256(b"longrun key id\x00" + _checked_key(key)).hexdigest()[:16]


def load_key(path: str | os.PathLike[str]) -> bytes:
    """The key in ``path``: its bytes with surrounding whitespace removed.

    Refused with ``InvalidInputError`` (nothing else is raised): a missing or unreadable file, a
    symbolic link, anything but a regular file, a file that group or others can access in any way
    (it must be mode 0600 or 0400), and a key shorter than ``KEY_MIN_BYTES``.
    """
    where = os.fspath(path)
    if not isinstance(where, str) or "\0" in where:
        raise InvalidInputError(f"key file path {where!r:.80} is not a usable path")
    try:
        fd = os.open(where, os.O_RDONLY | _NOFOLLOW | _CLOEXEC | _NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ELOOP or _is_symlink(where):
            raise InvalidInputError(f"key file {where} is a symbolic link; refused") from exc
        raise InvalidInputError(f"cannot read key file {where}: {exc.strerror or exc}") from exc
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InvalidInputError(f"key file {where} is not a regular file")
        if info.st_mode & 0o077:
            raise InvalidInputError(
                f"key file {where} is accessible by group or others (mode {stat.S_IMODE(info.st_mode):04o}); "
                f"refused: make it 0600 (chmod 600 {where})"
            )
        if info.st_size > MAX_KEY_FILE_BYTES:
            raise InvalidInputError(f"key file {where} is over {MAX_KEY_FILE_BYTES} bytes; not a key")
        data = _read_key(fd)
    except OSError as exc:
        raise InvalidInputError(f"cannot read key file {where}: {exc}") from exc
    finally:
        os.close(fd)
    if len(data) > MAX_KEY_FILE_BYTES:
        raise InvalidInputError(f"key file {where} grew over {MAX_KEY_FILE_BYTES} bytes while read; not a key")
    key = data.strip()
    if len(key) < KEY_MIN_BYTES:
        raise InvalidInputError(f"key file {where} holds {len(key)} bytes; a key needs at least {KEY_MIN_BYTES}")
    return key


def _read_key(fd: int) -> bytes:
    """Up to ``MAX_KEY_FILE_BYTES + 1`` bytes, so the caller can tell a file that grew over the limit."""
    data = b""
    while len(data) <= MAX_KEY_FILE_BYTES and (chunk := os.read(fd, MAX_KEY_FILE_BYTES + 1 - len(data))):
        data += chunk
    return data


def generate_key_file(path: str | os.PathLike[str]) -> bytes:
    """Create ``path`` (mode 0600, never overwriting) holding a new random key; return the key."""
    key = secrets.token_hex(32).encode("ascii")
    where = os.fspath(path)
    try:
        fd = os.open(where, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o600)
    except OSError as exc:
        raise InvalidInputError(f"cannot create key file {where}: {exc.strerror or exc}") from exc
    try:
        os.fchmod(fd, 0o600)
        data = key + b"\n"
        if os.write(fd, data) != len(data):  # 65 bytes into a new file: all of them, or an error
            raise OSError(errno.EIO, "short write", where)
        os.fsync(fd)
    finally:
        os.close(fd)
    return key


# -- signing ----------------------------------------------------------------------------------


def _mac(key: bytes, kind: str, fields: dict[str, JSONValue]) -> str:
    # The kind is inside the signed bytes, so a signed cancellation can never pass as an approval.
    message = canonical_bytes({"longrun": kind, "version": 1, "fields": ensure_json(fields, what=kind)})
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def _signature(key: bytes, kind: str, fields: dict[str, JSONValue]) -> str:
    return f"{ALGORITHM}:{key_id(key)}:{_mac(key, kind, fields)}"


def _verify(key: bytes, kind: str, fields: dict[str, JSONValue], signature: str | None) -> str | None:
    """None if ``signature`` verifies under ``key``; otherwise the reason it does not."""
    expected_id = key_id(key)
    if signature is None:
        return f"not signed; only records signed with key {expected_id} count"
    algorithm, _, rest = signature.partition(":")
    signer, _, mac = rest.partition(":")
    if algorithm != ALGORITHM or not _KEY_ID.fullmatch(signer) or not _MAC.fullmatch(mac):
        return f"signature is malformed (expected {ALGORITHM}:<16 hex key id>:<64 hex mac>)"
    try:
        expected = _mac(key, kind, fields)
    except InvalidInputError as exc:
        return f"cannot be authenticated: {exc}"
    if hmac.compare_digest(expected.encode("ascii"), mac.encode("ascii")):
        return None
    if signer != expected_id:
        return f"signed with key {signer}, not with the verification key {expected_id}"
    return "signature does not verify: the record was changed after it was signed"


def sign_approval(approval: Approval, key: bytes) -> Approval:
    """``approval`` with a signature over all its fields (scope, expiry, approver, grant time, nonce)."""
    return replace(approval, signature=_signature(_checked_key(key), "approval", approval.signed_fields()))


def verify_approval(approval: Approval, key: bytes) -> str | None:
    """None if ``approval``'s signature verifies under ``key``; otherwise why not."""
    return _verify(_checked_key(key), "approval", approval.signed_fields(), approval.signature)


def sign_cancellation(record: Cancellation, key: bytes) -> Cancellation:
    """``record`` with a signature over all its fields (task, time, who, reason)."""
    return replace(record, signature=_signature(_checked_key(key), "cancellation", record.signed_fields()))


def verify_cancellation(record: Cancellation, key: bytes) -> str | None:
    """None if ``record``'s signature verifies under ``key``; otherwise why not."""
    return _verify(_checked_key(key), "cancellation", record.signed_fields(), record.signature)


class SignedApprovals:
    """An ``ApprovalSource`` that passes on only approvals signed with ``key``; it refuses the rest.

    ``requires_signature`` tells the engine to say so in a next action (approve with a key).

    Refused: unreadable or malformed records (they cannot be authenticated), unsigned records, a
    signature under another key, and a record changed in any field after signing. A signed record
    is handed on unchanged; the gate still checks its scope, expiry and whether its id was consumed.
    """

    requires_signature = True

    def __init__(self, inner: ApprovalSource, key: bytes):
        if not isinstance(inner, ApprovalSource):
            raise InvalidInputError("SignedApprovals needs a source with read_approvals(task_id)")
        self.inner = inner
        self._key = _checked_key(key)
        self.key_id = key_id(self._key)

    def __repr__(self) -> str:
        return f"SignedApprovals({self.inner!r}, key {self.key_id})"

    def watch_roots(self) -> tuple[str, ...]:
        """The roots of the source it wraps, if it has any (``protocols.WatchedSource``)."""
        return self.inner.watch_roots() if isinstance(self.inner, WatchedSource) else ()

    def read_approvals(self, task_id: str) -> tuple[ControlRecord, ...]:
        return tuple(self._judge(raw) for raw in self.inner.read_approvals(task_id))

    def _judge(self, raw: ControlRecord) -> ControlRecord:
        if isinstance(raw, RefusedRecord):
            return raw
        if raw.error is not None:
            return _refuse(raw, f"cannot be authenticated: {raw.error}")
        try:
            approval = Approval.from_json(raw.body)
        except CorruptStateError as exc:
            return _refuse(raw, f"cannot be authenticated: {exc}")
        reason = verify_approval(approval, self._key)
        return raw if reason is None else _refuse(raw, reason)


class SignedCancellations:
    """A ``CancellationSource`` that passes on a cancellation only if it is signed with ``key``.

    Refused (and so, in the runner, a stop ``unsafe-to-continue`` rather than ``cancelled``):
    anything that does not verify, including a damaged record, and a record signed for another
    task. A signed record is handed on unchanged.
    """

    requires_signature = True

    def __init__(self, inner: CancellationSource, key: bytes):
        if not isinstance(inner, CancellationSource):
            raise InvalidInputError("SignedCancellations needs a source with read_cancellation(task_id)")
        self.inner = inner
        self._key = _checked_key(key)
        self.key_id = key_id(self._key)

    def __repr__(self) -> str:
        return f"SignedCancellations({self.inner!r}, key {self.key_id})"

    def watch_roots(self) -> tuple[str, ...]:
        """The roots of the source it wraps, if it has any (``protocols.WatchedSource``)."""
        return self.inner.watch_roots() if isinstance(self.inner, WatchedSource) else ()

    def read_cancellation(self, task_id: str) -> ControlRecord | None:
        raw = self.inner.read_cancellation(task_id)
        if raw is None or isinstance(raw, RefusedRecord):
            return raw
        if raw.error is not None:
            return _refuse(raw, f"cannot be authenticated: {raw.error}")
        try:
            record = Cancellation.from_json(raw.body)
        except CorruptStateError as exc:
            return _refuse(raw, f"cannot be authenticated: {exc}")
        reason = verify_cancellation(record, self._key)
        if reason is not None:
            return _refuse(raw, reason)
        if record.task_id != task_id:
            return _refuse(raw, f"signed for task {record.task_id!r}, not {task_id!r}")
        return raw
