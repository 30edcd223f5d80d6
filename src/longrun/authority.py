"""Authority: whether the runner may believe an approval or a cancellation record.

A control record is a file (or a row) that someone wrote. Anyone who can write where the runner
reads could approve an effect, and an agent that can write files is such a someone. This module
gathers the two independent ways longrun judges who wrote a record, which compose:

- **Where it lies** (``FileControlSource`` in strict mode, after OpenSSH's ``StrictModes``; it
  lives in ``longrun.stores.controlfiles``, the one reader and writer of control files): a
  record counts only if its file and every directory from it up to the control root are owned by
  the approver account or root, writable by neither group nor others, and not symbolic links. An
  account other than the approver cannot create a file the approver owns, so an agent running
  under its own account cannot place a record that passes. The checks are made on open
  descriptors, walking down from the root with ``openat`` semantics and ``fstat``, so the file
  checked is the file read.
- **Who signed it** (``SignedApprovals``, ``SignedCancellations``; in ``longrun.signing``): a
  record counts only if it carries an HMAC-SHA256 over every field (``signed_fields()``) under the configured key. For an
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

from .control import RefusedRecord
from .signing import (
    KEY_MIN_BYTES,
    SignedApprovals,
    SignedCancellations,
    generate_key_file,
    key_id,
    load_key,
    sign_approval,
    sign_cancellation,
    verify_approval,
    verify_cancellation,
)
from .stores.controlfiles import FileControlSource

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
