"""The store contract: one unittest suite that every ``Store`` must pass, whatever it stores in.

Mix ``StoreContract`` into a ``unittest.TestCase`` and provide ``make_store``::

    class MyStoreContract(StoreContract, unittest.TestCase):
        def make_store(self):
            return MyStore(self.location)        # a new instance over this test's data

The suite drives only the ``Store`` protocol: leases (exclusion, takeover, epochs that strictly
increase, renewal, release), fencing of every mutating call that carries a lease (commit, renew,
release, repairing load: ``FencedError`` and nothing changed), revisions, the atomicity of a
commit, the round trip of a ``RunState`` written record by record, cancellation and approval
records, messages (numbered in send order, one per key), unknown tasks and unsafe task ids,
concurrent acquirers on separate instances, the deletion of an ended task (whole, its id free
again; refused for a task live or not ended), and (for a ``SummaryStore`` and a ``RecordingStore``)
task summaries that follow every commit, their filters and pages, and first revisions recorded
together.

What only the store can do is asked through hooks; a hook a store does not provide skips the tests
that need it (so a skip here is a gap in the store's own tests, not a pass):

- ``make_store()`` (required): a new store instance over this test's backing data. Called more
  than once per test; each instance must see the others' writes, like another process would.
- ``expire(store, lease) -> now``: make ``lease`` expired for the store and return the ``now`` to
  pass. The default returns ``lease.expires_at``, right for stores that judge expiry by the
  caller's clock; a store that uses its own clock (a database server's) must override it.
- ``damage_state(store, task_id)``: damage the task's stored state so that nothing valid remains.
- ``plant_foreign_state(store, task_id, source_task_id)``: make ``task_id``'s stored state a valid
  copy of ``source_task_id``'s.
- ``plant_future_schema(store, task_id)``: make the stored data claim a schema version newer than
  the code knows (the next ``make_store()`` must then refuse it with ``SchemaVersionError``).
- ``plant_control_text(store, task_id, kind, text)``: store raw text as the task's cancellation
  (``kind="cancellation"``) or as one approval record (``kind="approval"``).
- ``fail_nth_operation(store, n)``: a context manager in which the store's ``n``-th low-level
  I/O operation (a system call, an SQL statement) raises ``OSError`` or the driver's error.
- ``damage_lease(store, task_id)``: damage the task's stored lease record so that it no longer
  validates (for ``repair_lease``, which the stores built on ``BaseStore`` offer).
- ``damage_messages(store, task_id)``: damage every stored message of the task (see ``_messages``).
- ``damage_blobs(store, task_id) -> int`` and ``state_bytes(store, task_id) -> int``: for large
  payloads and results (see ``_blobs``): damage every blob the task has, and measure the state
  without its blobs.

Not covered: durability across power loss (that needs a machine that loses power), and
exclusion across machines (the PostgreSQL store's own tests race processes with skewed clocks).
"""


from ._base import sample_state
from ._blobs import BlobContract
from ._control import ControlContract
from ._deletion import DeletionContract
from ._leases import LeaseContract
from ._messages import MessageContract
from ._states import StateContract
from ._summaries import SummaryContract

__all__ = ["StoreContract", "sample_state"]


class StoreContract(LeaseContract, StateContract, ControlContract, BlobContract, MessageContract, DeletionContract, SummaryContract):
    """The contract every store passes. Mix into ``unittest.TestCase``; see the module docstring."""
