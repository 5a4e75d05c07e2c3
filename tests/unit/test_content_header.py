"""Content headers that pamqp cannot read on its own decode field by field, naming what was left out; the
ones it can read decode exactly as before."""

from __future__ import annotations

import struct
from datetime import UTC, datetime
from typing import Any

import pamqp.frame
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp.commands import Basic
from pamqp.header import ContentHeader

from sim import amqp_raw as raw
from worker.broker import content_header
from worker.broker.content_header import UNDECODABLE

content_header.install()


def received(properties: raw.RawProperties) -> Basic.Properties:
    """What a consumer gets for a content header frame carrying ``properties``."""
    payload = struct.pack(">HHQ", 60, 0, 2) + properties.marshal()
    frame = struct.pack(">BHI", 2, 1, len(payload)) + payload + b"\xce"
    _, _, decoded = pamqp.frame.unmarshal(frame)
    assert isinstance(decoded, ContentHeader)
    return decoded.properties


def test_an_out_of_range_timestamp_property_is_left_out_and_named() -> None:
    got = received(raw.properties(timestamp_seconds=1_796_328_516_693_743, message_id=b"m-1"))
    assert got.timestamp is None
    assert got.message_id == "m-1"
    assert got.content_type == "application/json"
    assert got.delivery_mode == 2
    assert got.headers == {UNDECODABLE: ["timestamp: 1796328516693743 is out of range"]}


def test_an_out_of_range_timestamp_in_a_header_is_kept_as_its_integer() -> None:
    table = raw.entries([(b"sent", raw.timestamp(2**63)), (b"n", raw.long_long(7))])
    got = received(raw.properties(headers=table))
    assert got.headers == {
        "sent": 2**63,
        "n": 7,
        UNDECODABLE: [f"headers.sent: {2**63} is out of range (kept as an integer)"],
    }


def test_strings_and_keys_that_are_not_utf8_are_left_out() -> None:
    table = raw.entries([(b"\xff\xfe", raw.long_long(1)), (b"ok", raw.long_long(2))])
    got = received(raw.properties(message_id=b"\xff", headers=table, message_type=b"tool_call.v1"))
    assert got.message_id is None
    assert got.message_type == "tool_call.v1"
    assert got.headers["ok"] == 2
    # in the order of the fields on the wire: headers come before message_id
    assert got.headers[UNDECODABLE] == ["headers.\ufffd\ufffd: the key is not UTF-8", "message_id: not UTF-8"]


def test_a_table_nested_thousands_deep_is_cut_at_the_depth_limit() -> None:
    got = received(raw.properties(headers=raw.deep_table(5_000)))
    depth, level = 0, got.headers
    while isinstance(level, dict) and "d" in level:
        level, depth = level["d"], depth + 1
    assert depth == content_header.MAX_DEPTH - 1
    [note] = got.headers[UNDECODABLE]
    assert note.endswith(f"nested deeper than {content_header.MAX_DEPTH} levels")


def test_an_unknown_field_type_leaves_out_the_rest_of_the_table_only() -> None:
    table = raw.entries([(b"ok", raw.long_long(2)), (b"z", b"Z\x00"), (b"after", raw.long_long(3))])
    got = received(raw.properties(headers=table, message_id=b"m-2"))
    assert got.message_id == "m-2"
    assert got.headers["ok"] == 2
    assert "after" not in got.headers
    assert got.headers[UNDECODABLE] == [
        "headers.z: unknown field type b'Z'; the rest of the table is left out"
    ]


def test_a_publisher_cannot_set_the_decoders_header() -> None:
    table = raw.entries([(UNDECODABLE.encode(), raw.longstr(b"forged")), (b"k", raw.long_long(1))])
    assert received(raw.properties(headers=table)).headers == {"k": 1}


def test_many_bad_entries_give_a_bounded_note() -> None:
    table = raw.entries([(f"t{n}".encode(), raw.timestamp(2**63 + n)) for n in range(100)])
    notes = received(raw.properties(headers=table)).headers[UNDECODABLE]
    assert len(notes) == content_header.MAX_NOTES + 1
    assert notes[-1] == f"(+{100 - content_header.MAX_NOTES} more)"


def test_what_pamqp_reads_decodes_exactly_as_before() -> None:
    sent = Basic.Properties(
        content_type="application/json",
        headers={"a": 1, "b": "text", "c": [1, "x", {"d": 2.5}], "t": datetime(2026, 12, 3, tzinfo=UTC)},
        delivery_mode=2,
        message_id="e-1",
        timestamp=datetime(2026, 12, 3, 12, 0, tzinfo=UTC),
        message_type="tool_call.v1",
    )
    got = received(raw.RawProperties(sent.marshal()))
    assert got == sent


# any table of valid-but-hostile values decodes without raising, and every value that does decode is kept
_values = st.recursive(
    st.builds(raw.long_long, st.integers(-(2**63), 2**63 - 1))
    | st.builds(raw.timestamp, st.integers(0, 2**64 - 1))
    | st.builds(raw.longstr, st.binary(max_size=20)),
    lambda inner: (
        st.builds(
            lambda pairs: raw.nested(raw.entries(pairs)),
            st.lists(st.tuples(st.binary(max_size=6), inner), max_size=4),
        )
        | st.builds(raw.array, st.lists(inner, max_size=4))
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    pairs=st.lists(st.tuples(st.binary(max_size=8), _values), max_size=8), seconds=st.integers(0, 2**64 - 1)
)
def test_any_well_formed_content_header_decodes(pairs: list[tuple[bytes, bytes]], seconds: int) -> None:
    got = received(raw.properties(headers=raw.entries(pairs), timestamp_seconds=seconds))
    assert got.content_type == "application/json"
    headers: dict[str, Any] = got.headers or {}
    notes = headers.get(UNDECODABLE, [])
    assert all(isinstance(note, str) and len(note) <= 200 for note in notes)
    if not notes:
        assert got.timestamp is not None


@pytest.mark.parametrize("depth", [10, 900])
def test_depth_within_the_limit_survives(depth: int) -> None:
    got = received(raw.properties(headers=raw.deep_table(depth)))
    assert isinstance(got.headers, dict)
