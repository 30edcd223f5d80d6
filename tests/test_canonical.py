"""Canonical encoding and the strict decoder, directly: the bytes every digest is computed over, and
that what the encoder accepts the decoder reads back, up to each limit and not one step past it.

(The typed errors of the encoder, by the path to the value, are in ``test_records.EncoderTests``;
the decoder's refusals of damaged bytes in ``test_fuzz_loaders``.)
"""

from __future__ import annotations

import hashlib
import random
import unittest
from typing import Any

import helpers  # noqa: F401  (puts src on sys.path)
from longrun import CorruptStateError, InvalidInputError
from longrun.canonical import (
    MAX_INT_DIGITS,
    MAX_JSON_DEPTH,
    JSONValue,
    canonical_bytes,
    digest_of,
    ensure_json,
    json_too_deep,
    parse_json,
    shown,
    text_problem,
)


def nested(levels: int) -> JSONValue:
    """A list ``levels`` brackets deep (``nested(1) == []``)."""
    value: JSONValue = []
    for _ in range(levels - 1):
        value = [value]
    return value


def random_value(rng: random.Random, depth: int = 0) -> JSONValue:
    kind = rng.randrange(9 if depth < 6 else 6)
    if kind == 0:
        return None
    if kind == 1:
        return rng.random() < 0.5
    if kind == 2:
        return rng.choice([0, -1, 2**63, -(10 ** (MAX_INT_DIGITS - 1)), rng.randrange(-(10**9), 10**9)])
    if kind == 3:
        return rng.choice([0.0, -0.0, 1e-300, 1.5e308, 0.1, rng.uniform(-1e6, 1e6)])
    if kind in (4, 5):
        return "".join(rng.choice("aé✓\U0001f600\"\\\n\t/\x00 ") for _ in range(rng.randrange(8)))
    if kind == 6:
        return [random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {f"k{rng.randrange(20)}é": random_value(rng, depth + 1) for _ in range(rng.randrange(4))}


class EncodingTests(unittest.TestCase):
    def test_the_bytes_are_pinned_keys_sorted_no_whitespace_text_as_utf8(self) -> None:
        self.assertEqual(canonical_bytes({"b": [1, 2.5, None, True], "a": "é ✓"}), '{"a":"é ✓","b":[1,2.5,null,true]}'.encode("utf-8"))
        self.assertEqual(canonical_bytes({"z": {"y": 1, "x": 2}}), b'{"z":{"x":2,"y":1}}')
        # A digest pins content across versions: a change of encoding would change every digest recorded.
        self.assertEqual(digest_of({}), "sha256:" + hashlib.sha256(b"{}").hexdigest())
        self.assertEqual(digest_of({"a": [1, "é"]}), "sha256:" + hashlib.sha256('{"a":[1,"é"]}'.encode()).hexdigest())

    def test_the_same_value_gives_the_same_digest_however_it_was_built(self) -> None:
        self.assertEqual(digest_of({"a": 1, "b": (2, 3)}), digest_of({"b": [2, 3], "a": 1}))
        self.assertEqual(ensure_json({"t": (1, (2,))}), {"t": [1, [2]]})
        self.assertNotEqual(digest_of({"n": 1}), digest_of({"n": 1.0}), "an integer and a float are different content")

    def test_what_the_encoder_writes_the_strict_decoder_reads_back_equal(self) -> None:
        rng = random.Random(20240501)
        for case in range(400):
            value = random_value(rng)
            with self.subTest(case=case):
                data = canonical_bytes(ensure_json(value))
                read = parse_json(data, what="value", max_bytes=1 << 20, unique_keys=True)
                self.assertEqual(read, value)
                self.assertEqual(canonical_bytes(read), data)


class LimitTests(unittest.TestCase):
    def test_integers_up_to_the_digit_limit_and_not_one_digit_more(self) -> None:
        largest = 10**MAX_INT_DIGITS - 1
        self.assertEqual(parse_json(canonical_bytes(ensure_json([largest, -largest])), what="v", max_bytes=1 << 20), [largest, -largest])
        for too_long in (10**MAX_INT_DIGITS, -(10**MAX_INT_DIGITS)):
            with self.assertRaises(InvalidInputError):
                ensure_json(too_long)
        with self.assertRaisesRegex(CorruptStateError, "digit"):
            parse_json(b"1" * (MAX_INT_DIGITS + 1), what="v", max_bytes=1 << 20)

    def test_values_nest_65_levels_and_a_stored_document_up_to_the_decoder_s_depth(self) -> None:
        self.assertEqual(ensure_json(nested(65)), nested(65))
        with self.assertRaisesRegex(InvalidInputError, "nested deeper"):
            ensure_json(nested(66))
        self.assertEqual(ensure_json([nested(65)[0], {}]), [nested(64), {}], "an empty container at the limit is not deeper")
        objects: JSONValue = {}
        for _ in range(64):
            objects = {"d": objects}
        self.assertEqual(ensure_json(objects), objects)
        with self.assertRaisesRegex(InvalidInputError, "nested deeper"):
            ensure_json({"d": objects})
        # A stored record wraps a value in fewer than 35 levels: the decoder's depth leaves room for it.
        self.assertLess(65 + 35, MAX_JSON_DEPTH + 1)
        self.assertEqual(parse_json(canonical_bytes(nested(MAX_JSON_DEPTH)), what="v", max_bytes=1 << 20), nested(MAX_JSON_DEPTH))
        with self.assertRaisesRegex(CorruptStateError, "deeper"):
            parse_json(canonical_bytes(nested(MAX_JSON_DEPTH + 1)), what="v", max_bytes=1 << 20)

    def test_depth_is_judged_on_the_bytes_with_brackets_in_strings_not_counted(self) -> None:
        self.assertFalse(json_too_deep(canonical_bytes(nested(MAX_JSON_DEPTH))))
        self.assertTrue(json_too_deep(canonical_bytes(nested(MAX_JSON_DEPTH + 1))))
        in_strings = canonical_bytes(["[" * 500, "{" * 500, '\\"[[[' * 100, "]]]"])
        self.assertFalse(json_too_deep(in_strings), "brackets inside strings, escaped quotes among them, are text")
        self.assertTrue(json_too_deep(b"[" * 101 + b"]" * 100), "unbalanced: counted as too deep, for the parser to refuse")

    def test_the_byte_limit_is_checked_on_text_before_it_is_encoded(self) -> None:
        self.assertEqual(parse_json('{"a":"é"}', what="row", max_bytes=10), {"a": "é"})
        with self.assertRaisesRegex(CorruptStateError, "limit"):
            parse_json('{"a":"éé"}', what="row", max_bytes=10)  # 10 characters, 12 bytes
        with self.assertRaisesRegex(CorruptStateError, "limit"):
            parse_json("[" + "1," * 100 + "1]", what="row", max_bytes=100)


class TextTests(unittest.TestCase):
    def test_text_from_a_database_with_a_lone_surrogate_is_corrupt_not_a_unicode_error(self) -> None:
        with self.assertRaisesRegex(CorruptStateError, "surrogate"):
            parse_json('{"name":"caf\udce9"}', what="row", max_bytes=1 << 20)
        with self.assertRaisesRegex(CorruptStateError, "escaped lone surrogate"):
            parse_json(b'{"name":"caf\\udce9"}', what="row", max_bytes=1 << 20)
        self.assertEqual(parse_json(b'"\\ud83d\\ude00"', what="row", max_bytes=100), "\U0001f600", "an escaped pair is text")
        self.assertIsNone(text_problem("plain ✓ \U0001f600"))
        self.assertIn("at index 3", text_problem("caf\udce9.txt") or "")

    def test_a_key_named_twice_is_refused_only_when_asked(self) -> None:
        self.assertEqual(parse_json(b'{"a":1,"a":2}', what="doc", max_bytes=100), {"a": 2})
        with self.assertRaisesRegex(CorruptStateError, "twice"):
            parse_json(b'{"a":1,"a":2}', what="doc", max_bytes=100, unique_keys=True)

    def test_shown_never_raises_and_never_prints_a_lone_surrogate(self) -> None:
        class Hostile:
            def __repr__(self) -> str:
                raise RuntimeError("no repr for you")

        self.assertEqual(shown(Hostile()), "<Hostile>")
        self.assertEqual(shown(10**5000), f"<int of {(10**5000).bit_length()} bits>")
        self.assertEqual(shown("x" * 200, 10), "'xxxxxxxxx")
        self.assertEqual(shown("caf\udce9"), "'caf\\udce9'")
        shown("caf\udce9").encode("utf-8")


if __name__ == "__main__":
    unittest.main()


class LongStringTests(unittest.TestCase):
    """Long strings are spliced into the encoding as bytes; the bytes must be json.dumps's."""

    @staticmethod
    def reference(value: object) -> bytes:
        import json

        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")

    def test_long_strings_encode_exactly_as_json_dumps(self) -> None:
        from longrun.canonical import canonical_bytes

        cases: list[object] = [
            {"blob": "x" * 20_000},
            {"a": ["y" * 17_000, 1, {"z": "é" * 20_000}], "b": 'q"' * 9_000, "c": None},
            ["\x00" * 20_000, "ok" * 9_000],
            {"k": "€" * 30_000, "n": "a\\b" * 9_000, "t": "\t" + "x" * 20_000},
            {"deep": {"deeper": {"deepest": "x" * 20_000}}},
        ]
        for value in cases:
            with self.subTest(value=str(value)[:40]):
                self.assertEqual(canonical_bytes(value), self.reference(value))  # type: ignore[arg-type]

    def test_a_value_holding_the_placeholder_pattern_still_encodes_exactly(self) -> None:
        from longrun.canonical import canonical_bytes

        value = {"a": "x" * 20_000, "b": "\x000123456789abcdef:0\x00"}
        self.assertEqual(canonical_bytes(value), self.reference(value))

    def test_a_lone_surrogate_in_a_long_string_is_named(self) -> None:
        from longrun.canonical import canonical_bytes

        with self.assertRaisesRegex(InvalidInputError, "lone surrogate"):
            canonical_bytes({"s": "\ud800" + "x" * 20_000})

    def test_the_pieces_of_an_encoding_join_to_its_bytes_and_hash_to_its_digest(self) -> None:
        from longrun.canonical import canonical_pieces, digest_of

        long = "x" * 20_000
        values: list[Any] = [
            {"i": 1}, [1, 2.5, None], "text", {"a": long, "b": [long, "y" + long], "c": {"d": long}},
            {"quoted": '"' + long}, {"many": [long] * 40}, {"\u00e9": "\u00e9" * 20_000},
        ]  # fmt: skip
        for value in values:
            with self.subTest(value=str(value)[:40]):
                pieces = canonical_pieces(value)
                self.assertEqual(b"".join(pieces), self.reference(value))
                self.assertEqual(digest_of(value), "sha256:" + hashlib.sha256(self.reference(value)).hexdigest())
        self.assertEqual(len(canonical_pieces(values[3])), 9, "each long string near the top is a piece of its own")

    def test_a_large_step_payload_is_encoded_once_and_its_blob_is_its_pieces(self) -> None:
        from unittest import mock

        from longrun import Step, canonical
        from longrun.stores.blobs import BlobCodec

        encodings: list[int] = []
        real = canonical._spliced_pieces

        def counted(value: Any) -> Any:
            encodings.append(1)
            return real(value)

        with mock.patch.object(canonical, "_spliced_pieces", counted):
            step = Step("s", "write", {"blob": "x" * (1 << 20), "n": 1})
            static = step.static_payload
            assert static is not None
            codec = BlobCodec()
            ref = codec.ref_of(static[0])
            assert ref is not None
            (blob,) = codec.to_write([ref])
        self.assertEqual(len(encodings), 1, "the step's encoding is the one its digest hashes and its blob writes")
        self.assertEqual(len(blob.pieces), 3, "the megabyte is a piece of its own, never joined")
        self.assertEqual(b"".join(blob.pieces), self.reference(static[0]))
        self.assertEqual("sha256:" + ref.sha256, static[1])
        self.assertEqual(static[1], "sha256:" + hashlib.sha256(self.reference(static[0])).hexdigest())

    def test_digest_of_hands_a_large_encoding_over_once(self) -> None:
        from longrun.canonical import LARGE_VALUE_BYTES, digest_of, remembered_encoding

        payload = {"blob": "x" * LARGE_VALUE_BYTES}
        digest = digest_of(payload, checked=True)
        found = remembered_encoding(payload)
        assert found is not None
        self.assertEqual(b"".join(found[0]), self.reference(payload))
        self.assertIn(payload["blob"].encode(), found[0], "the long string's bytes are a piece of their own, never joined")
        self.assertEqual("sha256:" + found[1], digest)
        self.assertIsNone(remembered_encoding(payload), "handed over once")
        small = {"i": 1}
        digest_of(small, checked=True)
        self.assertIsNone(remembered_encoding(small), "small values are not kept")
        copy = {"blob": "y" * LARGE_VALUE_BYTES}
        digest_of(copy)  # not checked: a plain copy was encoded, not this object
        self.assertIsNone(remembered_encoding(copy))
