"""The encodings of the JSON-file store's snapshot and journal: line framing, checksums, compact records.

Both kinds of file are UTF-8 text, one JSON document per line, so ``head``, ``tail`` and ``grep``
work on them::

    line 1    the meta: a JSON object with "format", "schema_version", "task_id", what the file
              holds, and "checksum": SHA-256 over the canonical JSON of the other fields
    line 2..  framed lines: "<16 hex> <JSON>", the hex being the first 8 bytes of SHA-256 over
              the JSON bytes exactly as written; JSON escapes every control character, so a
              body never contains a newline and every line is one frame

A snapshot (format ``longrun.snapshot``) holds one whole ``RunState``. Its meta names the revision
and how many effect records and row lines follow; line 2 is the header (every field but the effect
records, as a flat object: ``budget.attempts_total`` and so on); each further line is a list of up
to ``ROWS_PER_LINE`` effect records, each a row of values in ``EFFECT_FIELDS`` order, in plan order.
Files written before rows had a ``backoff`` (their meta's ``fields`` say so, a journal row is one
value shorter) and before the header had the budget's worked time still load, those values absent.
The header holds ``plan_outline`` only when the state has one (a declared plan's, see
``envelope.PlanOutline``); a journal record sets it only when it changed, compared by identity.

A journal (format ``longrun.journal``) continues a chain of revisions from its meta's ``base``.
Each framed line is one commit and names only what changed since the previous one::

    {"rev": base + k, "epoch": E,
     "set": {header key: value},                          header fields that changed
     "extend": {list key: {"drop": n, "add": [...]}},      list = list[n:] + add (bounded lists)
     "effects": {step id: row | {field: value} | null}}   new record, changed fields, removed

So a commit costs bytes in proportion to what it changed, not to the size of the ledger. After its
last line a journal holds zero bytes written ahead of use; its content ends at the first zero byte.

Invariants (the tests in ``tests/test_journal.py`` are built to break them):

1. A line is accepted only if its checksum matches; a snapshot is accepted only if every line is,
   and its meta's counts match what follows, so a snapshot cut at a line boundary is refused too.
2. Within a journal the revisions are contiguous (``base + 1``, ``base + 2``, ...) and the epochs
   never decrease; a checksum-valid record that breaks this is damage, not data.
3. ``scan`` calls the last line *torn* only if it is incomplete (no newline yet) and not a whole,
   valid frame that lost only its newline to damage. Anything else that fails is *damaged*.
4. Decoding validates every field through the records' own rules (``RunState.from_json``, typed
   field checks for rows) after parsing with ``canonical.parse_json`` (no NaN, no nesting deeper
   than ``MAX_JSON_DEPTH``, strict UTF-8; a meta line is at most ``MAX_META_BYTES`` and has no
   duplicate keys); no ``JSONDecodeError``, ``KeyError``, ``TypeError``, ``RecursionError`` or
   ``OverflowError`` escapes, only ``CorruptStateError`` and its subclasses. A header or row field
   the format does not know is refused.

Not guaranteed here: anything about files, order of writes or recovery. ``jsonfile`` does that.
"""

from ._lines import CHECKSUM_HEX, JOURNAL_FORMAT, MIN_RECORD_BYTES, SNAPSHOT_FORMAT, Scan, checksum, frame, no_gc, parse_meta, scan
from ._records import Replay, Shadow, describe_record, encode_journal_meta, highest_epoch, journal_base
from ._rows import BLOB_ROW_FIELDS, EFFECT_FIELDS, BlobFetch, build_state, record_from_row, row_of
from ._snapshot import RawSnapshot, decode_snapshot, encode_snapshot, snapshot_revision

__all__ = [
    "BLOB_ROW_FIELDS",
    "CHECKSUM_HEX",
    "EFFECT_FIELDS",
    "JOURNAL_FORMAT",
    "MIN_RECORD_BYTES",
    "SNAPSHOT_FORMAT",
    "BlobFetch",
    "RawSnapshot",
    "Replay",
    "Scan",
    "Shadow",
    "build_state",
    "checksum",
    "decode_snapshot",
    "describe_record",
    "encode_journal_meta",
    "encode_snapshot",
    "frame",
    "highest_epoch",
    "journal_base",
    "no_gc",
    "parse_meta",
    "record_from_row",
    "row_of",
    "scan",
    "snapshot_revision",
]
