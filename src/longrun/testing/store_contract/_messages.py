"""The store contract, messages: numbered in the order the sends commit, one per key, kept after
they are read, filtered by topic, bounded, refused for an unknown task, never fenced by the lease."""

from __future__ import annotations

import threading

from ...errors import CorruptStateError, InvalidInputError, SizeLimitError, UnknownTaskError
from ...messages import MAX_MESSAGE_BYTES, Delivery, Message
from ._base import ContractBase

__all__ = ["MessageContract"]


def _message(topic: str, value: object, key: str, *, task_id: str = "t", sender: str = "tester") -> Message:
    return Message.of(task_id, topic, value, key=key, sender=sender, sent_at=1_700_000_000.25)


class MessageContract(ContractBase):
    def test_contract_messages_are_numbered_in_send_order_and_read_back_by_topic(self) -> None:
        case, store = self._case, self.store()
        self.leased(store)
        case.assertEqual(store.read_messages("t"), ())
        sent = [
            store.send_message(_message("orders", {"n": 1, "text": "ünïcødé ✓"}, "k1")),
            self.store().send_message(_message("audit", [1, 2.5, None, True], "k2")),
            store.send_message(_message("orders", "two", "k3", sender="task-a")),
        ]
        case.assertEqual(sent, [Delivery(1), Delivery(2), Delivery(3)])
        everything = self.store().read_messages("t")
        case.assertEqual([message.seq for message in everything], [1, 2, 3])
        case.assertEqual([message.value for message in everything], [{"n": 1, "text": "ünïcødé ✓"}, [1, 2.5, None, True], "two"])
        orders = store.read_messages("t", "orders")
        case.assertEqual([(message.seq, message.key, message.sender) for message in orders], [(1, "k1", "tester"), (3, "k3", "task-a")])
        case.assertEqual(store.read_messages("t", "none-such"), ())
        case.assertEqual(store.read_messages("t"), everything, "reading consumes nothing: the receiver's state says what it used")

    def test_contract_a_key_is_stored_once(self) -> None:
        case, store = self._case, self.store()
        self.leased(store)
        case.assertEqual(store.send_message(_message("orders", 1, "same")), Delivery(1))
        case.assertEqual(self.store().send_message(_message("other", 2, "same", sender="someone else")), Delivery(1, duplicate=True))
        case.assertEqual(store.send_message(_message("orders", 3, "new")), Delivery(2))
        case.assertEqual([(message.value, message.key) for message in store.read_messages("t")], [(1, "same"), (3, "new")])

    def test_contract_concurrent_senders_take_distinct_numbers_and_store_a_key_once(self) -> None:
        case = self._case
        self.leased(self.store())
        stores = [self.store() for _ in range(4)]
        errors: list[BaseException] = []

        def send(index: int) -> None:
            try:
                for n in range(5):
                    stores[index].send_message(_message("race", [index, n], f"{index}-{n}"))
                    stores[index].send_message(_message("race", "dup", "shared"))
            except BaseException as exc:  # handed to the test thread
                errors.append(exc)

        threads = [threading.Thread(target=send, args=(index,)) for index in range(len(stores))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        case.assertEqual(errors, [])
        messages = self.store().read_messages("t")
        case.assertEqual([message.seq for message in messages], list(range(1, 22)))
        case.assertEqual(sum(message.key == "shared" for message in messages), 1)
        for index in range(len(stores)):
            own = [message.value for message in messages if message.key.startswith(f"{index}-")]
            case.assertEqual(own, [[index, n] for n in range(5)], "each sender's messages keep its order")

    def test_contract_messages_need_no_lease_and_are_not_fenced_by_it(self) -> None:
        case, store = self._case, self.store()
        lease, state = self.committed(store)
        before = self.snapshot()[1]
        self.store().send_message(_message("orders", 1, "k"))
        case.assertEqual(self.snapshot()[1], before)
        case.assertEqual(store.read_lease("t"), lease)
        case.assertEqual(store.commit(lease, state), state.revision)
        case.assertEqual(len(store.read_messages("t")), 1)
        store.release_lease(lease, self.now())
        case.assertEqual(self.store().send_message(_message("orders", 2, "k2")), Delivery(2), "nor does a released lease matter")

    def test_contract_bad_messages_are_refused_and_nothing_is_stored(self) -> None:
        case, store = self._case, self.store()
        self.leased(store)
        with case.assertRaises(UnknownTaskError):
            store.send_message(_message("orders", 1, "k", task_id="no-such-task"))
        with case.assertRaises(UnknownTaskError):
            store.read_messages("no-such-task")
        with case.assertRaises(SizeLimitError):
            store.send_message(_message("orders", "x" * MAX_MESSAGE_BYTES, "big"))
        for bad in (float("nan"), {1: "a"}, object(), {"a": {1, 2}}):
            with case.subTest(value=repr(bad)), case.assertRaises(InvalidInputError):
                store.send_message(_message("orders", bad, "bad"))
        for topic in ("", "a b", "/x", "x" * 101, None):
            with case.subTest(topic=topic), case.assertRaises(InvalidInputError):
                store.send_message(_message(topic, 1, "k"))  # type: ignore[arg-type]
        with case.assertRaises(InvalidInputError):
            store.send_message(_message("orders", 1, ""))
        with case.assertRaises(InvalidInputError):
            store.read_messages("t", "a b")
        case.assertEqual(store.read_messages("t"), ())

    def test_contract_a_damaged_message_raises_naming_it(self) -> None:
        case, store = self._case, self.store()
        self.leased(store)
        store.send_message(_message("orders", 1, "k"))
        self.damage_messages(store, "t")
        with case.assertRaises(CorruptStateError) as raised:
            self.store().read_messages("t")
        case.assertIn("message", str(raised.exception))

    # -- hook ---------------------------------------------------------------------------------

    def damage_messages(self, store: object, task_id: str) -> None:
        """Damage every stored message of the task (flip bytes of its body)."""
        self._case.skipTest("the store gives no damage_messages hook")
