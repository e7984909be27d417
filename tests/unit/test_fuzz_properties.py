"""Property-based tests (hypothesis) of every input the broker takes from outside: publication
entries, envelopes, topic strings and filters of both schemes, selectors, configuration files,
administrative requests and records written by hand. Each bad input is refused with its
documented error and nothing else; nothing is half-written. The generators are
``scripts.rig.fuzzing``'s (``st.randoms()`` drives them), the same as ``python -m scripts.fuzz``.

The last part pins the bugs the fuzzing found, one test each.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fakeredis
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from broker.clients.publish import Publisher
from broker.core import hierarchy, keys, topic_rules
from broker.core.config import load_settings
from broker.core.connection import can_name
from broker.core.entries import apply_topic_defaults, parse_entry
from broker.core.errors import (
    ConfigError,
    CorruptRecord,
    InvalidMessage,
    InvalidSelector,
    InvalidTopic,
    InvalidTopicFilter,
    NoSuchSubscription,
    NoSuchTopic,
    NoSuchTopicObject,
    TopicObjectConflict,
    shown,
)
from broker.core.hierarchy import HierarchyIndex
from broker.core.models import Message, decode_envelope, encode_envelope, publication_fields
from broker.core.scripts import entry_fields
from broker.core.selectors import compile_selector, like
from broker.core.topic_rules import TopicIndex
from broker.topics.declared import parse_declared, undeclare
from broker.topics.links import parse_links
from broker.topics.routing import RoutingTable
from broker.topics.subscriptions import parse_subscriptions, subscribe, unsubscribe
from broker.topics.topic_objects import (
    Attributes,
    TopicObject,
    TopicTree,
    alter,
    apply,
    define,
    delete,
    load_file,
    topic_of,
)
from broker.topics.topology import ProxySubscription, load_network, parse_network
from scripts.rig import fuzzing as fz

QM = "FZ"

#: Few examples each: the whole file stays fast (``python -m scripts.fuzz`` goes further).
FAST = settings(max_examples=80, deadline=None)
SLOW = settings(max_examples=25, deadline=None)

randoms = st.randoms(use_true_random=False)


@pytest.fixture(autouse=True)
def _no_broker_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``load_settings`` reads ``BROKER_*``: the files alone are under test."""
    for name in [n for n in os.environ if n.startswith("BROKER_")]:
        monkeypatch.delenv(name)
    yield


# --------------------------------------------------------------------------
# Publication entries


def _check_entry(fields: dict[bytes, bytes]) -> None:
    try:
        entry = parse_entry("1700000000000-0", fields, 65_536)
    except InvalidMessage:
        return
    message = Message.from_envelope(encode_envelope(entry.header, entry.body))
    assert (message.publisher, message.topic) == (entry.publisher, entry.topic)
    # a msgid that is not UTF-8 reaches subscribers as its bytes (msgid_bytes), its text with U+FFFD
    sent = entry.msgid.encode("utf-8", "surrogateescape")
    assert (message.msgid_bytes or message.msgid.encode()) == sent
    assert message.body == entry.body
    assert 0 <= message.priority <= 9


@FAST
@given(randoms)
def test_a_mutated_entry_is_parsed_or_refused_with_invalid_message(r: random.Random) -> None:
    pairs, _ = fz.bad_entry(r, "bad-1", "junk/a", 65_536, r.choice(("mqtt", "swiftmq")))
    _check_entry(entry_fields(fz.flat(pairs)))


field_names = st.sampled_from([f.encode() for f in fz.ENTRY_FIELDS]) | st.binary(max_size=8)


@FAST
@given(st.dictionaries(field_names, st.binary(max_size=64), max_size=12))
def test_any_fields_are_parsed_or_refused_with_invalid_message(fields: dict[bytes, bytes]) -> None:
    _check_entry(fields)


@FAST
@given(st.text(max_size=40))
@example('{"a": NaN}')
@example('{"a": 1e999}')
@example('{"a": "\\ud800"}')
@example("[" * 100_000)
def test_props_are_a_json_object_of_scalars_the_envelope_carries(props: str) -> None:
    fields = {b"publisher": b"p", b"topic": b"t", b"props": props.encode("utf-8", "surrogatepass")}
    try:
        entry = parse_entry("1-0", fields, 10)
    except InvalidMessage:
        return
    header, _ = decode_envelope(encode_envelope(entry.header, b""))
    assert header.get("props", {}) == entry.header.get("props", {})  # the selector saw what subscribers see


texts = st.text(max_size=8) | st.sampled_from(["\ud800", "\udcff", "é", ""])
scalars = st.none() | st.booleans() | st.integers() | st.floats() | texts


@FAST
@given(
    texts,
    texts | randoms.map(lambda r: fz.random_topic(r, "mqtt")),
    st.fixed_dictionaries(
        {},
        optional={
            "msgid": texts,
            "correlation_id": texts,
            "reply_to": texts,
            "message_type": texts,
            "priority": st.integers(-2, 12),
            "expiration_ms": st.integers(),
            "timestamp_ms": st.integers(),
            "properties": st.dictionaries(texts, scalars | st.lists(st.integers(), max_size=1), max_size=3),
        },
    ),
    texts | st.binary(max_size=8),
    st.booleans(),
)
def test_a_publisher_sends_or_refuses_with_invalid_topic_or_invalid_message(
    publisher_id: str, topic: str, options: dict[str, Any], body: str | bytes, validate: bool
) -> None:
    client = fakeredis.FakeRedis(encoding_errors="surrogateescape")  # as broker.core.connection.connect
    try:
        Publisher(client, QM, publisher_id, validate, flow_control=False).publish(topic, body, **options)
    except (InvalidTopic, InvalidMessage):
        return
    (_, fields), *_ = client.xrange(keys.publish_stream(QM))
    if validate:
        parse_entry("1-0", fields, 100)  # what a validating publisher sends, a worker takes


# --------------------------------------------------------------------------
# Envelopes

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
header_names = st.sampled_from(
    [
        "v",
        "msgid",
        "publisher",
        "seq",
        "topic",
        "ts",
        "entry_id",
        "size",
        "persistent",
        "priority",
        "expiration",
        "correlation_id",
        "reply_to",
        "type",
        "props",
        "origin",
        "route",
    ]
)


def _decode(envelope: bytes) -> None:
    try:
        message = Message.from_envelope(envelope)
    except InvalidMessage:
        return
    assert isinstance(message, Message)


@FAST
@given(st.binary(max_size=200))
def test_from_envelope_on_bytes_is_a_message_or_invalid_message(envelope: bytes) -> None:
    _decode(envelope)


@FAST
@given(st.dictionaries(header_names, json_values), st.binary(max_size=16))
def test_from_envelope_on_any_header_is_a_message_or_invalid_message(
    header: dict[str, Any], body: bytes
) -> None:
    base = {"msgid": "m", "publisher": "p", "topic": "t", "ts": 1}
    _decode(json.dumps({**base, **header}).encode() + b"\n" + body)
    _decode(json.dumps(header).encode() + b"\n" + body)


@FAST
@given(randoms)
def test_from_envelope_on_garbage_is_a_message_or_invalid_message(r: random.Random) -> None:
    _decode(fz.garbage_envelope(r)[0])


# --------------------------------------------------------------------------
# Topic strings and filters, both schemes

SCHEMES = {"mqtt": topic_rules, "swiftmq": hierarchy}


@FAST
@given(
    st.sampled_from(sorted(SCHEMES)), st.text(max_size=30) | randoms.map(lambda r: fz.random_topic(r, "mqtt"))
)
def test_validate_topic_raises_only_invalid_topic_with_a_valid_suggestion(scheme: str, topic: str) -> None:
    rules: Any = SCHEMES[scheme]
    try:
        assert rules.validate_topic(topic) == topic
    except InvalidTopic as exc:
        if exc.suggestion is not None:
            rules.validate_topic(exc.suggestion)
        str(exc)


@FAST
@given(
    st.sampled_from(sorted(SCHEMES)),
    st.text(max_size=30) | randoms.map(lambda r: fz.random_filter(r, "swiftmq")),
)
def test_validate_filter_raises_only_invalid_topic_filter(scheme: str, topic_filter: str) -> None:
    rules: Any = SCHEMES[scheme]
    try:
        assert rules.validate_filter(topic_filter) == topic_filter
    except InvalidTopicFilter as exc:
        str(exc)


@FAST
@given(randoms, st.sampled_from(sorted(SCHEMES)))
def test_matches_never_raises_on_valid_input_and_refuses_invalid_with_the_documented_errors(
    r: random.Random, scheme: str
) -> None:
    rules: Any = SCHEMES[scheme]
    try:
        found = rules.matches(fz.random_filter(r, scheme), fz.random_topic(r, scheme))
    except (InvalidTopic, InvalidTopicFilter):
        return
    assert isinstance(found, bool)


@FAST
@given(randoms, st.sampled_from(sorted(SCHEMES)))
def test_the_index_agrees_with_the_reference_matches_through_adds_and_removes(
    r: random.Random, scheme: str
) -> None:
    rules: Any = SCHEMES[scheme]
    index: TopicIndex | HierarchyIndex = TopicIndex() if scheme == "mqtt" else HierarchyIndex()
    filters: dict[str, str] = {}
    for n in range(r.randint(1, 15)):
        filters[f"s{n}"] = fz.matching_filter(r, scheme)
        index.add(filters[f"s{n}"], f"s{n}")
    for sub_id in r.sample(sorted(filters), r.randint(0, len(filters))):
        assert index.remove(filters.pop(sub_id), sub_id)
    assert len(index) == len(filters)
    for _ in range(5):
        topic = fz.matching_topic(r, scheme)
        assert index.match(topic) == {s for s, f in filters.items() if rules.matches(f, topic)}, topic


# --------------------------------------------------------------------------
# Selectors


@FAST
@given(st.text(max_size=40) | randoms.map(fz.garbage_selector))
@example("x = \u00b2")
@example("x = " + "9" * 5000)
def test_compile_selector_raises_only_invalid_selector(selector: str) -> None:
    try:
        compiled = compile_selector(selector)
    except InvalidSelector as exc:
        assert 0 <= exc.position <= len(selector)
        str(exc)
        return
    assert isinstance(compiled.matches({}), bool)


@FAST
@given(randoms)
def test_a_selector_evaluates_to_a_bool_quickly_whatever_the_properties(r: random.Random) -> None:
    text = fz.valid_selector(r)
    try:
        compiled = compile_selector(text)
    except InvalidSelector:
        return
    for _ in range(5):
        properties = fz.random_properties(r)
        started = time.monotonic()
        assert isinstance(compiled.matches(properties), bool)
        assert time.monotonic() - started < 0.5, text


@FAST
@given(st.text("ab%_\\", max_size=10), st.text("ab%_\\\n", max_size=10))
def test_like_agrees_with_the_reference(pattern: str, value: str) -> None:
    try:
        found = like(pattern, value, "\\")
    except InvalidSelector:
        return
    assert found == fz.like_reference(pattern, value, "\\")


# --------------------------------------------------------------------------
# Configuration files

LOADERS: dict[str, Any] = {"settings": load_settings, "topics": load_file, "network": load_network}


def _load(kind: str, document: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{kind}.toml"
        path.write_bytes(document)
        try:
            LOADERS[kind](path)
        except ConfigError as exc:
            assert str(exc)


@SLOW
@given(randoms)
def test_a_random_settings_file_loads_or_raises_config_error(r: random.Random) -> None:
    _load("settings", fz.toml_document(fz.settings_toml(r)) if r.random() < 0.8 else fz.junk_document(r))


@SLOW
@given(randoms)
def test_a_random_topic_file_loads_or_raises_config_error(r: random.Random) -> None:
    _load("topics", fz.toml_document(fz.topics_toml(r)) if r.random() < 0.8 else fz.junk_document(r))


@SLOW
@given(randoms)
def test_a_random_network_file_loads_or_raises_config_error(r: random.Random) -> None:
    _load("network", fz.toml_document(fz.network_toml(r)) if r.random() < 0.8 else fz.junk_document(r))


@FAST
@given(json_values)
def test_a_stored_network_record_parses_or_raises_config_error(value: Any) -> None:
    for raw in (value, json.dumps(value)):
        with contextlib.suppress(ConfigError):
            parse_network(raw)


# --------------------------------------------------------------------------
# Administrative requests (fakeredis: the same commands and Lua scripts)


def _victim(client: fakeredis.FakeRedis) -> tuple[str, list[str]]:
    """A subscription with messages in three bands, one in flight, a consumer and a holder."""
    record = subscribe(client, QM, "victim/#", "fz", "victim")
    sub_id = record.sub_id
    for priority in (3, 4, 7):
        client.lpush(keys.sub_band(QM, sub_id, priority), f"m{priority}")
    client.lpush(keys.consumer_inflight(QM, sub_id, "c1"), "m9")
    client.zadd(keys.sub_consumers(QM, sub_id), {"c1": 2**50})
    client.set(keys.sub_holder(QM, sub_id), "c1")
    watched = [
        *keys.sub_bands(QM, sub_id),
        keys.consumer_inflight(QM, sub_id, "c1"),
        keys.sub_consumers(QM, sub_id),
        keys.sub_holder(QM, sub_id),
    ]
    return sub_id, watched


@SLOW
@given(randoms, st.sampled_from(["mqtt", "swiftmq"]))
def test_an_admin_request_succeeds_or_raises_a_documented_error_having_written_nothing(
    r: random.Random, scheme: str
) -> None:
    client = fakeredis.FakeRedis()
    client.hset(keys.manager(QM), "topic_scheme", scheme)
    victim, watched = _victim(client)
    define(client, QM, "T1", "junk")
    made: list[str] = []
    for _ in range(5):
        request = fz.admin_request(r, scheme, victim, made)
        if request.op == "unsubscribe" and request.args["sub_id"] == victim:
            continue
        before = fz.snapshot(client, QM, watched)
        try:
            done = fz.run_admin(client, QM, scheme, request)
        except fz.ADMIN_ERRORS:
            assert fz.snapshot(client, QM, watched) == before, f"{request} wrote before failing"
            continue
        if done.startswith("made:"):
            made.append(done[5:])
    assert client.llen(keys.sub_band(QM, victim, 3)) == 1  # no id like "<victim>:p3" reached its keys


@SLOW
@given(randoms, st.sampled_from(["mqtt", "swiftmq"]))
def test_records_written_by_hand_never_stop_the_routing_table(r: random.Random, scheme: str) -> None:
    client = fakeredis.FakeRedis()
    client.hset(keys.manager(QM), "topic_scheme", scheme)
    subscribe(client, QM, "junk/#" if scheme == "mqtt" else "junk", "fz", "all")
    written = []
    for _ in range(r.randint(1, 6)):
        what, field, value = fz.corrupt_record(r, scheme, QM)
        key = fz.record_key(QM, what)
        if field is None:
            client.set(key, value)
        else:
            client.hset(key, field, value)
        written.append(what)
    table = RoutingTable(QM)
    table.load(client)  # raises nothing: a record that cannot be read is a problem, skipped
    assert "fz$all" in table.subscriptions
    for problem in table.problems:
        assert isinstance(problem, CorruptRecord) and str(problem)


# --------------------------------------------------------------------------
# The bugs the fuzzing found


def test_message_from_envelope_names_a_missing_or_mistyped_header_field() -> None:
    with pytest.raises(InvalidMessage, match="no 'msgid'"):
        Message.from_envelope(b"{}\n")
    with pytest.raises(InvalidMessage, match="format"):
        Message.from_envelope(b'{"msgid":"m","publisher":"p","topic":"t","ts":1,"route":5}\n')
    with pytest.raises(InvalidMessage, match="timestamp_ms"):
        Message.from_envelope(b'{"msgid":"m","publisher":"p","topic":"t","ts":"x"}\n')


@pytest.mark.parametrize(
    ("props", "fragment"),
    [
        ("[" * 100_000, "not JSON"),
        ('{"a": NaN}', "not JSON"),
        ('{"a": 1e999}', "too large"),
        ('{"a": "\\ud800"}', "lone surrogate"),
        ('{"\\ud800": 1}', "lone surrogate"),
    ],
)
def test_props_too_deep_not_finite_or_not_utf8_are_refused_with_a_reason(props: str, fragment: str) -> None:
    with pytest.raises(InvalidMessage, match=fragment):
        parse_entry("1-0", {b"publisher": b"p", b"topic": b"t", b"props": props.encode()}, 10)


def test_a_refused_field_is_echoed_shortly() -> None:
    with pytest.raises(InvalidMessage) as caught:
        parse_entry("1-0", {b"publisher": b"p", b"topic": b"t", b"persistent": b"x" * 100_000}, 10)
    assert len(str(caught.value)) < 200


@pytest.mark.parametrize(
    "selector", ["x = \u00b2", "x = .\u00b2", "x = \u0661", "x = 5\u00b2", "x = " + "9" * 5000]
)
def test_selector_numbers_are_ascii_digits_of_a_size_python_converts(selector: str) -> None:
    with pytest.raises(InvalidSelector):
        compile_selector(selector)


def test_like_with_many_percent_signs_takes_no_time() -> None:
    started = time.monotonic()
    assert not like("%a" * 40 + "%b", "a" * 300)
    assert like("%a" * 40 + "%b", "a" * 300 + "b")
    selector = compile_selector("x LIKE '" + "%a" * 20 + "%b'")
    assert not selector.matches({"x": "a" * 200})
    assert not hierarchy.matches("iit." + "%a" * 20 + "%b", "iit." + "a" * 200)
    assert time.monotonic() - started < 1


def test_shown_counts_the_bytes_of_a_text_with_a_lone_surrogate() -> None:
    assert "bytes" in shown("\ud800" * 100)
    with pytest.raises(InvalidSelector):
        compile_selector("\ud800" * 100)


@pytest.mark.parametrize(
    ("document", "fragment"),
    [
        (b"qm = '\xff'", "not UTF-8"),
        (b"a = " + b"[" * 100_000, "nested too deeply"),
        (b'server_config = "' + b"x" * 5_000 + b'"', "server_config"),
    ],
)
def test_load_settings_refuses_files_it_cannot_read_with_config_error(
    tmp_path: Path, document: bytes, fragment: str
) -> None:
    path = tmp_path / "broker.toml"
    path.write_bytes(document)
    with pytest.raises(ConfigError, match=fragment):
        load_settings(path)


@pytest.mark.parametrize(
    ("document", "fragment"),
    [
        (b"topic = 5", "array of tables"),
        (b"topic = 'abc'", "array of tables"),
        (b"topic = [1]", "not a table"),
        (b"[[topic]]\nname = 5", "name must be a string"),
        (b"[[topic]]\nname = 'A'\ntopic_string = 5", "topic_string must be a string"),
        (b"[[topic]]\nname = '\xff'", "not UTF-8"),
        (b"topic = " + b"[" * 100_000, "nested too deeply"),
        (b"[[topic]]\nname = 'A'\ntopic_string = 'a'\n[[topic]]\nname = 'A'\ntopic_string = 'b'", "twice"),
        (
            b"[[topic]]\nname = 'A'\ntopic_string = 'a'\n[[topic]]\nname = 'B'\ntopic_string = 'a'",
            "same topic",
        ),
    ],
)
def test_load_file_refuses_malformed_topic_files_with_config_error(
    tmp_path: Path, document: bytes, fragment: str
) -> None:
    path = tmp_path / "topics.toml"
    path.write_bytes(document)
    with pytest.raises(ConfigError, match=fragment):
        load_file(path)


@pytest.mark.parametrize(
    ("document", "fragment"),
    [(b"x = '\xff'", "not UTF-8"), (b"a = " + b"[" * 100_000, "nested too deeply"), (None, "cannot be read")],
)
def test_load_network_refuses_files_it_cannot_read_with_config_error(
    tmp_path: Path, document: bytes | None, fragment: str
) -> None:
    path = tmp_path / "network.toml"
    if document is None:
        path.mkdir()
    else:
        path.write_bytes(document)
    with pytest.raises(ConfigError, match=fragment):
        load_network(path)


def test_topic_apply_finds_every_conflict_before_writing_anything() -> None:
    client = fakeredis.FakeRedis()
    define(client, QM, "OLD", "/taken")
    version = client.get(keys.version(QM))
    objects = [TopicObject(name="NEW1", topic_string="/a"), TopicObject(name="NEW2", topic_string="/taken")]
    with pytest.raises(TopicObjectConflict):
        apply(client, QM, objects)
    twice = [TopicObject(name="NEW1", topic_string="/a"), TopicObject(name="NEW1", topic_string="/b")]
    with pytest.raises(TopicObjectConflict):
        apply(client, QM, twice)
    assert client.hkeys(keys.topic_objects(QM)) == [b"OLD"] and client.get(keys.version(QM)) == version


def test_topic_of_a_generic_name_is_no_such_topic_object() -> None:
    client = fakeredis.FakeRedis()
    for name in ("NOPE*", "*", "SYSTEM*"):
        with pytest.raises(NoSuchTopicObject):
            topic_of(client, QM, name, "x")
    with pytest.raises(NoSuchTopicObject):
        subscribe(client, QM, "x", "fz", "a", topic_object="NOPE*")


def test_removing_what_does_not_exist_writes_nothing() -> None:
    client = fakeredis.FakeRedis()
    victim, watched = _victim(client)
    before = fz.snapshot(client, QM, watched)
    for sub_id in (f"{victim}:p3", f"{victim}:inflight:c1", f"{victim}:bell", "fz$nope", "\ud800$x"):
        with pytest.raises(NoSuchSubscription):
            unsubscribe(client, QM, sub_id)
    for name in ("NOPE", "\ud800"):
        with pytest.raises(NoSuchTopicObject):
            delete(client, QM, name)
        with pytest.raises(NoSuchTopicObject):
            alter(client, QM, name, pub="DISABLED")
    with pytest.raises(NoSuchTopic):
        undeclare(client, QM, "a.\ud800")
    assert fz.snapshot(client, QM, watched) == before


def test_a_record_with_a_colon_in_its_id_is_removed_without_the_keys_of_another() -> None:
    client = fakeredis.FakeRedis()
    victim, _ = _victim(client)
    client.hset(keys.subscriptions(QM), f"{victim}:p3", b"{}")
    unsubscribe(client, QM, f"{victim}:p3")
    assert not client.hexists(keys.subscriptions(QM), f"{victim}:p3")
    assert client.llen(keys.sub_band(QM, victim, 3)) == 1


def test_can_name() -> None:
    assert can_name("a") and can_name("\udcff") and not can_name("\ud800")


def test_a_field_given_twice_keeps_its_first_value_as_the_scripts_read_it() -> None:
    assert entry_fields([b"publisher", b"a", b"topic", b"t", b"publisher", b"b"]) == {
        b"publisher": b"a",
        b"topic": b"t",
    }


@pytest.mark.parametrize("raw", [b"[" * 100_000, b'{"a": ' * 3_000])
def test_records_nested_too_deeply_are_corrupt_records(raw: bytes) -> None:
    _, problems = parse_subscriptions(QM, {b"a$b": raw})
    assert problems and "nested too deeply" in problems[0].reason
    _, problems = parse_links(QM, {b"a/b": raw})
    assert problems and "not JSON" in problems[0].reason
    assert TopicTree.parse(QM, {b"T1": raw}).problems
    with pytest.raises(ValueError):
        ProxySubscription.from_json(raw)
    assert parse_declared(QM, {b"\xff": b"x"})[1]


def test_proxy_subscription_with_an_infinite_time_is_not_a_record() -> None:
    with pytest.raises(ValueError):
        ProxySubscription.from_json(b'{"qm": "a", "topic": "b", "since_ms": 1e999}')


def test_the_routing_table_names_records_it_cannot_read_whatever_their_bytes() -> None:
    client = fakeredis.FakeRedis()
    client.hset(keys.proxies(QM), b"\xff", b"[" * 100_000)
    client.hset(keys.cluster_topics(QM), b"\xff", b'{"cluster": "C1"}')
    client.hset(keys.cluster_topics(QM), b"a", b"[" * 100_000)
    client.hset(keys.manager(QM), "direct_subscriber_selection", b"\xff")
    client.hset(keys.subscriptions(QM), "a$b", json.dumps({"filter": "#", "selector": "x = \u00b2"}))
    table = RoutingTable(QM)
    table.load(client)
    assert len(table.problems) == 4 and table.direct


def test_an_expiration_cap_beyond_64_bits_caps_nothing_and_one_before_the_epoch_has_passed() -> None:
    attributes = {"defpsist": "YES", "defprty": 4, "capexpry": 10**30}
    fields = {b"publisher": b"p", b"topic": b"t", b"ts": b"9223372036854775000"}
    entry = parse_entry("1-0", fields, 10)
    apply_topic_defaults(entry, fields, attributes)
    assert entry.expiration_ms == 0
    encode_envelope(entry.header, b"")  # within 64 bits
    fields = {b"publisher": b"p", b"topic": b"t", b"ts": b"-1000"}
    entry = parse_entry("1-0", fields, 10)
    apply_topic_defaults(entry, fields, {**attributes, "capexpry": 1000})
    assert entry.expiration_ms == 1


def test_attributes_accept_what_the_fuzz_calls_valid() -> None:
    for name, values in fz._VALID_ATTRIBUTES.items():
        for value in values:
            Attributes(**{name: value})


def test_a_publisher_refuses_properties_that_are_not_finite_numbers() -> None:
    for value in (math.nan, math.inf, -math.inf):
        with pytest.raises(InvalidMessage, match="finite"):
            publication_fields("p", "t", b"", properties={"a": value})


def test_forwarding_skips_proxy_and_cluster_records_it_cannot_read() -> None:
    # A cluster topic copy whose hosts are not names, or a proxy subscription whose key is no
    # filter (announce = "topic"), made every publication forwarded past them "internal error".
    client = fakeredis.FakeRedis()
    network = {
        "announce": "topic",
        "queue_managers": {QM: {"parent": "QM2", "clusters": ["C1"]}, "QM2": {}, "QM3": {"clusters": ["C1"]}},
    }
    client.set(keys.network(QM), json.dumps(network))
    client.hset(keys.proxies(QM), "QM2 dynamic #", json.dumps({"qm": "QM2", "topic": "#"}))
    client.hset(keys.proxies(QM), "QM3 dynamic a+", json.dumps({"qm": "QM3", "topic": "a+"}))
    client.hset(keys.cluster_topics(QM), "junk", json.dumps({"cluster": "C1", "hosts": [None]}))
    client.hset(
        keys.topic_objects(QM), "CL", json.dumps({"topic_string": "junk", "attributes": {"cluster": "C1"}})
    )
    table = RoutingTable(QM)
    table.load(client)
    assert len(table.problems) == 2
    for topic in ("junk/a", "good/0/x"):
        entry = parse_entry("1-0", {b"publisher": b"p", b"topic": topic.encode()}, 10)
        assert table.forwards(entry, table.resolve(topic).attributes) == (keys.transmission(QM, "QM2"),)
