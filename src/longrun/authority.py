"""Authority: whether the runner may believe an approval or a cancellation record.

A control record is a file (or a row) that someone wrote. Anyone who can write where the runner
reads could approve an effect, and an agent that can write files is such a someone. This module
judges who wrote a record, in two independent ways that compose:

- **Where it lies** (``FileControlSource`` in strict mode, after OpenSSH's ``StrictModes``): a
  record counts only if its file and every directory from it up to the control root are owned by
  the approver account or root, writable by neither group nor others, and not symbolic links. An
  account other than the approver cannot create a file the approver owns, so an agent running
  under its own account cannot place a record that passes. The checks are made on open
  descriptors, walking down from the root with ``openat`` semantics and ``fstat``, so the file
  checked is the file read.
- **Who signed it** (``SignedApprovals``, ``SignedCancellations``): a record counts only if it
  carries an HMAC-SHA256 over every field (``signed_fields()``) under the configured key. For an
  approval that is the full scope (task id, plan digest, step id, payload digest, action), the
  expiry, the approver, the grant time and the approval id, which is the nonce. Signatures are
  made by ``sign_approval`` and ``sign_cancellation`` (``longrun approve|cancel --sign-key``) and
  compared with ``hmac.compare_digest``.

A record that fails a check comes back as a ``RefusedRecord`` whose ``error`` says why. For an
approval that means "not used": the gate reports the reason and the step keeps waiting for a real
approval (a planted record cannot block a genuine one). For a cancellation the runner stops
``unsafe-to-continue`` without ending the run: starting nothing is safe, and a forger must not be
able to end a run for good or to speak in an operator's name. Each approval id authorizes once:
the runner records it in the task's state in the same fenced commit that starts the effect.

Keys are files of at least 32 bytes (surrounding whitespace ignored) that group and others cannot
access at all (``load_key``), like an OpenSSH private key.

Not guaranteed (docs/security.md says more): protection from an account that can act as
the approver or root, or that can read the key. HMAC is symmetric: whoever can verify can also
sign, so the runner's key lets the runner's host forge. Signing proves who wrote a record, not
that a record which was deleted was ever there; only a control area the agent cannot write keeps
a cancellation from being removed. Ancestors of the control root are not checked. Nonces are
remembered in the task's state, so an account that can rewrite the state can forget one.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import hmac
import os
import re
import secrets
import stat
from dataclasses import replace
from typing import Generator

from .approval import Approval
from .cancellation import Cancellation
from .canonical import JSONValue, canonical_bytes, ensure_json, parse_json, sha256_hex
from .contract import check_task_id
from .control import ControlRecord, RefusedRecord
from .errors import CorruptStateError, InvalidInputError, LongrunError, StorageError
from .protocols import ApprovalSource, CancellationSource
from .stores._fileio import FileIO, read_upto, write_all

__all__ = [
    "FileControlSource",
    "KEY_MIN_BYTES",
    "RefusedRecord",
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
MAX_RECORD_BYTES = 64 * 1024
MAX_APPROVAL_FILES = 1000
ALGORITHM = "hmac-sha256"
CONTROL = "control"
APPROVALS = "approvals"
CANCEL = "cancel.json"
TEMP_MARK = ".tmp-"

_KEY_ID = re.compile(r"[0-9a-f]{16}")
_MAC = re.compile(r"[0-9a-f]{64}")
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


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
        if exc.errno == errno.ELOOP or _is_symlink(where, None):
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
        data = _read_all(fd, MAX_KEY_FILE_BYTES)
    except OSError as exc:
        raise InvalidInputError(f"cannot read key file {where}: {exc}") from exc
    finally:
        os.close(fd)
    key = data.strip()
    if len(key) < KEY_MIN_BYTES:
        raise InvalidInputError(f"key file {where} holds {len(key)} bytes; a key needs at least {KEY_MIN_BYTES}")
    return key


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
        _write_all(fd, key + b"\n")
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


# -- the file source --------------------------------------------------------------------------


class _Refused(Exception):
    """Internal: a component of the control area failed a strict-mode check."""


def _is_symlink(name: str, dir_fd: int | None) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(name, dir_fd=dir_fd).st_mode)
    except OSError:
        return False


_PLAIN_IO = FileIO()


def _read_all(fd: int, limit: int) -> bytes:
    """Up to ``limit + 1`` bytes, so the caller can tell a file over its limit."""
    return read_upto(_PLAIN_IO, fd, limit + 1)


def _write_all(fd: int, data: bytes) -> None:
    write_all(_PLAIN_IO, fd, data)


class FileControlSource:
    """Approvals and cancellations read from files under ``control_root``, in a store's layout::

        <control_root>/<task id>/control/cancel.json
        <control_root>/<task id>/control/approvals/<approval id>.json

    ``control_root`` may be a ``JsonFileStore`` root, but for strict mode to mean anything it is
    usually a separate directory that the approver account owns, because the runner's account
    owns every task directory of its store. ``longrun approve|cancel --control-root DIR`` writes
    there (directories 0755, files 0644: the runner reads, only the approver writes). This is the
    one place longrun creates anything but owner-only (0700/0600): the control area belongs to
    another account than the runner's, which must be able to read it, and strict mode's checks are
    about who can *write* (group and others never can), not who can read; a record holds no secret.

    Reads follow the same limits as the stores: a record over ``MAX_RECORD_BYTES``, more than
    ``MAX_APPROVAL_FILES`` approval files, and a record ``canonical.parse_json`` refuses (deep
    nesting, NaN, duplicate keys, bad UTF-8) come back with ``error`` set, never as an exception.

    Strict mode (the default) refuses a record unless the file, ``control/approvals``,
    ``control``, the task directory and the control root are each owned by ``approver_uid`` or
    root (uid 0), writable by neither group nor others, and not symbolic links; the file must be a
    regular file. ``approver_uid=None`` means the owner of the control root, read on every call;
    since that default would let the runner's own account approve itself, a control root owned
    by this process's own (non-root) account is then refused as a whole. Pass ``approver_uid``
    explicitly to accept that deliberately.

    A refused file comes back as a ``RefusedRecord``. A refused directory refuses everything in it:
    ``read_approvals`` returns one ``RefusedRecord`` for it, and ``read_cancellation`` returns a
    ``RefusedRecord`` (a tampered control area stops the run). A missing control root is refused
    the same way: a mistyped path must not hide an operator's cancellation. A missing task
    directory or file is simply no record.

    Not strict: no owner or mode checks; a symbolic link in place of the file is still refused (as
    the stores do), but linked directories are followed. Not checked in either mode: the
    directories above the control root, and ACL entries beyond the mode bits.
    """

    def __init__(self, control_root: str | os.PathLike[str], *, strict: bool = True, approver_uid: int | None = None):
        if approver_uid is not None and (isinstance(approver_uid, bool) or not isinstance(approver_uid, int) or approver_uid < 0):
            raise InvalidInputError(f"approver_uid must be a non-negative integer uid, got {approver_uid!r}")
        root = os.fspath(control_root)
        if not isinstance(root, str) or not root or "\0" in root:
            raise InvalidInputError(f"control root {root!r:.80} is not a usable path")
        self.control_root = os.path.abspath(root)
        self.strict = bool(strict)
        self.approver_uid = approver_uid

    def __repr__(self) -> str:
        return f"FileControlSource({self.control_root!r}, strict={self.strict}, approver_uid={self.approver_uid})"

    # -- reading ------------------------------------------------------------------------------

    def read_approvals(self, task_id: str) -> tuple[ControlRecord, ...]:
        check_task_id(task_id)
        where = f"{APPROVALS}/"
        try:
            with self._walk(task_id, (CONTROL, APPROVALS)) as (directory, approver):
                if directory is None:
                    return ()
                try:
                    names = sorted(n for n in os.listdir(directory) if n.endswith(".json") and TEMP_MARK not in n)
                except OSError as exc:
                    raise StorageError(f"cannot list the approvals of {task_id!r} in {self.control_root}: {exc}") from exc
                if len(names) > MAX_APPROVAL_FILES:
                    raise StorageError(f"task {task_id!r} has {len(names)} approval files, over the limit of {MAX_APPROVAL_FILES}")
                records = []
                for name in names:
                    record = self._read(directory, name, f"{task_id}/{CONTROL}/{APPROVALS}/{name}", f"{APPROVALS}/{name}", approver)
                    if record is not None:
                        records.append(record)
                return tuple(records)
        except _Refused as exc:
            return (RefusedRecord(name=where, error=f"{exc}; no approval in it counts"),)

    def read_cancellation(self, task_id: str) -> ControlRecord | None:
        check_task_id(task_id)
        try:
            with self._walk(task_id, (CONTROL,)) as (directory, approver):
                if directory is None:
                    return None
                return self._read(directory, CANCEL, f"{task_id}/{CONTROL}/{CANCEL}", CANCEL, approver)
        except _Refused as exc:
            return RefusedRecord(name=CANCEL, error=str(exc))

    def _unusable(self, record_name: str, reason: str) -> ControlRecord:
        # Strict mode refuses an odd file; otherwise it is merely unreadable, as in the stores.
        if self.strict:
            return RefusedRecord(name=record_name, error=reason)
        return ControlRecord(name=record_name, error=f"unreadable: {reason}")

    def _check(self, info: os.stat_result, label: str, approver: int) -> None:
        if not self.strict:
            return
        if info.st_uid not in (approver, 0):
            raise _Refused(f"{label} is owned by uid {info.st_uid}, not by the approver (uid {approver}) or root")
        writable = [who for who, bit in (("group", stat.S_IWGRP), ("others", stat.S_IWOTH)) if info.st_mode & bit]
        if writable:
            raise _Refused(f"{label} is writable by {' and '.join(writable)} (mode {stat.S_IMODE(info.st_mode):04o})")

    def _open_dir(self, name: str, parent: int | None, label: str) -> int | None:
        flags = os.O_RDONLY | _DIRECTORY | _CLOEXEC | (_NOFOLLOW if self.strict else 0)
        try:
            return os.open(name, flags, dir_fd=parent)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if _is_symlink(name, parent):
                raise _Refused(f"{label} is a symbolic link") from None
            if exc.errno == errno.ENOTDIR:
                raise _Refused(f"{label} is not a directory") from None
            raise StorageError(f"cannot open {label}: {exc}") from exc

    @contextlib.contextmanager
    def _walk(self, task_id: str, below: tuple[str, ...]) -> Generator[tuple[int | None, int], None, None]:
        """Open (and in strict mode check) the control root, the task directory and ``below``."""
        opened: list[int] = []
        try:
            label = f"the control root {self.control_root}"
            root = self._open_dir(self.control_root, None, label)
            if root is None:
                raise _Refused(f"{label} does not exist")
            opened.append(root)
            info = os.fstat(root)
            approver = self.approver_uid
            if approver is None:
                approver = info.st_uid
                if self.strict and approver != 0 and approver == os.geteuid():
                    raise _Refused(
                        f"{label} is owned by this runner's own account (uid {approver}), which would let the runner "
                        "approve itself; give the control root to the approver account or pass approver_uid"
                    )
            self._check(info, label, approver)
            path = task_id
            directory: int | None = root
            for name in (task_id, *below):
                if name != task_id:
                    path = f"{path}/{name}"
                assert directory is not None
                directory = self._open_dir(name, directory, f"directory {path}")
                if directory is None:
                    break
                opened.append(directory)
                self._check(os.fstat(directory), f"directory {path}", approver)
            yield directory, approver
        finally:
            for fd in reversed(opened):
                os.close(fd)

    def _read(self, directory: int, name: str, label: str, record_name: str, approver: int) -> ControlRecord | None:
        try:
            fd = os.open(name, os.O_RDONLY | _NOFOLLOW | _CLOEXEC | _NONBLOCK, dir_fd=directory)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if _is_symlink(name, directory):
                return self._unusable(record_name, f"{label} is a symbolic link")
            return ControlRecord(name=record_name, error=f"unreadable: {exc}")
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                return self._unusable(record_name, f"{label} is not a regular file")
            try:
                self._check(info, label, approver)
            except _Refused as exc:
                return RefusedRecord(name=record_name, error=str(exc))
            if info.st_size > MAX_RECORD_BYTES:
                return ControlRecord(name=record_name, error=f"file is {info.st_size} bytes, over the {MAX_RECORD_BYTES}-byte limit")
            data = _read_all(fd, MAX_RECORD_BYTES)
        except OSError as exc:
            return ControlRecord(name=record_name, error=f"unreadable: {exc}")
        finally:
            os.close(fd)
        digest = "sha256:" + sha256_hex(data)
        if len(data) > MAX_RECORD_BYTES:
            return ControlRecord(name=record_name, error=f"file grew over the {MAX_RECORD_BYTES}-byte limit while read", digest=digest)
        try:
            body = parse_json(data, what="the record", max_bytes=MAX_RECORD_BYTES, unique_keys=True)
        except CorruptStateError as exc:
            return ControlRecord(name=record_name, error=str(exc), digest=digest)
        return ControlRecord(name=record_name, body=body, digest=digest)

    # -- writing (the operator's side) ---------------------------------------------------------

    def write_approval(self, approval: Approval) -> str:
        """Write ``approval`` as the calling account; return the file's path. The root must exist."""
        name = check_task_id(approval.approval_id, what="approval id") + ".json"
        return self._write(approval.task_id, (CONTROL, APPROVALS), name, canonical_bytes(approval.to_json()))

    def write_cancellation(self, record: Cancellation) -> str:
        """Write ``record`` as the calling account; return the file's path. The root must exist."""
        return self._write(record.task_id, (CONTROL,), CANCEL, canonical_bytes(record.to_json()))

    def _write(self, task_id: str, below: tuple[str, ...], name: str, data: bytes) -> str:
        check_task_id(task_id)
        path = os.path.join(self.control_root, task_id, *below, name)
        opened: list[int] = []
        try:
            directory = os.open(self.control_root, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC)
            opened.append(directory)
            for part in (task_id, *below):
                try:
                    os.mkdir(part, 0o755, dir_fd=directory)
                    created = True
                except FileExistsError:
                    created = False
                child = os.open(part, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC, dir_fd=directory)
                opened.append(child)
                if created:
                    os.fchmod(child, 0o755)  # readable by the runner, writable by the approver only
                    os.fsync(directory)
                directory = child
            temp = f"{name}{TEMP_MARK}{secrets.token_hex(6)}"
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o644, dir_fd=directory)
            try:
                try:
                    os.fchmod(fd, 0o644)
                    _write_all(fd, data)
                    os.fsync(fd)
                finally:
                    os.close(fd)
                os.replace(temp, name, src_dir_fd=directory, dst_dir_fd=directory)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temp, dir_fd=directory)
                raise
            os.fsync(directory)
        except LongrunError:
            raise
        except OSError as exc:
            raise StorageError(f"cannot write {path}: {exc}") from exc
        finally:
            for fd in reversed(opened):
                os.close(fd)
        return path
