"""Delete Durable's selection by two SQL-LIKE predicates, and schedule records (cron, parameters)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from broker.core.errors import CorruptRecord, InvalidSchedule, InvalidSelector
from broker.jobs import RUNNERS
from broker.operations.durables import last_use, matching
from broker.operations.schedules import JOBS, Schedule, check_params, new_schedule, next_run_ms
from broker.topics.subscriptions import SubscriptionRecord


def durable(sub_id: str) -> SubscriptionRecord:
    return SubscriptionRecord(sub_id, "#", True, 0)


def chosen(client_id: str, name: str, *ids: str) -> list[str]:
    return [r.sub_id for r in matching([durable(i) for i in ids], client_id, name)]


def test_client_id_predicate_without_wildcards_matches_that_client_id_only():
    assert chosen("sales", "%", "sales$a", "sales$b", "salesx$a", "other$a", "xsales$a") == [
        "sales$a",
        "sales$b",
    ]


def test_escaped_underscores_are_literal_underscores():
    # s\_\_es% : a literal "s__es" and then anything
    assert chosen(
        r"s\_\_es%", "dur%", "s__es$dur2003", "s__esX$dur1", "saukestaand$dur2003", "sales$dur1"
    ) == [
        "s__es$dur2003",
        "s__esX$dur1",
    ]


def test_unescaped_underscore_is_one_character_and_percent_any_run():
    ids = ("saukestaand$dur2003", "sales$dur1", "sa$dur", "saukestaand$other")
    assert chosen("s_u%", "dur%", *ids) == ["saukestaand$dur2003"]
    assert chosen("sa%", "dur%", *ids) == ["saukestaand$dur2003", "sales$dur1", "sa$dur"]
    assert chosen("s__es%", "dur%", *ids) == ["sales$dur1"]  # the 4th character of saukestaand is k


def test_an_escaped_percent_or_underscore_matches_only_itself():
    assert chosen("a\\%", "%", "a%$x", "ab$x", "a$x") == ["a%$x"]
    assert chosen("%", "d\\_1", "c$d_1", "c$dx1") == ["c$d_1"]


def test_non_durable_subscriptions_are_never_selected():
    records = [durable("app$d"), SubscriptionRecord("app$nd-1", "#", False, 0)]
    assert [r.sub_id for r in matching(records, "%", "%")] == ["app$d"]


@pytest.mark.parametrize("client_id,name", [("", "%"), ("%", ""), ("a\\", "%"), ("%", "a\\b")])
def test_an_empty_or_badly_escaped_predicate_is_refused(client_id, name):
    with pytest.raises(InvalidSelector):
        matching([durable("a$b")], client_id, name)


def test_last_use_is_the_newest_of_creation_lease_deadline_and_last_active():
    record = SubscriptionRecord("a$b", "#", True, 500)
    assert last_use(record, None, None) is None
    assert last_use(record, 100, None) == 500
    assert last_use(record, 900, 700) == 900
    assert last_use(record, None, 1_000) == 1_000


def ms(*args: int) -> int:
    return int(datetime(*args, tzinfo=UTC).timestamp() * 1000)


def test_next_run_is_the_next_cron_time_in_utc():
    assert next_run_ms("0 3 * * *", ms(2025, 1, 1, 2, 59, 30)) == ms(2025, 1, 1, 3, 0)
    assert next_run_ms("0 3 * * *", ms(2025, 1, 1, 3, 0)) == ms(2025, 1, 2, 3, 0)  # strictly after
    assert next_run_ms("*/15 * * * mon-fri", ms(2025, 1, 4, 12, 0)) == ms(2025, 1, 6, 0, 0)  # Sat -> Mon


@pytest.mark.parametrize(
    "cron,reason",
    [
        ("0 3 * *", "must have 5 fields"),
        ("0 3 * * * 5", "must have 5 fields"),
        ("@daily", "must have 5 fields"),
        ("61 * * * *", "is not valid"),
        ("0 0 30 2 *", "never fires"),
    ],
)
def test_a_bad_cron_expression_is_refused_with_the_reason(cron, reason):
    with pytest.raises(InvalidSchedule, match=reason):
        next_run_ms(cron, 0)


def test_delete_durable_needs_both_predicates_and_no_other_parameter():
    assert check_params("delete-durable", {"client_id": "sales", "durable_name": "%"}) == {
        "client_id": "sales",
        "durable_name": "%",
    }
    with pytest.raises(InvalidSchedule, match="missing: durable_name"):
        check_params("delete-durable", {"client_id": "sales"})
    with pytest.raises(InvalidSchedule, match="unknown: colour"):
        check_params("delete-durable", {"client_id": "s", "durable_name": "%", "colour": "red"})
    with pytest.raises(InvalidSchedule, match="unknown job 'reboot'"):
        check_params("reboot", {})
    with pytest.raises(InvalidSelector):
        check_params("delete-durable", {"client_id": "s\\", "durable_name": "%"})


def test_every_schedulable_job_has_a_runner():
    assert set(RUNNERS) == set(JOBS)


def test_a_schedule_round_trips_through_its_json_record():
    made = new_schedule(
        "delete-durable", "0 3 * * *", {"client_id": "sales", "durable_name": "%"}, ms(2025, 1, 1)
    )
    assert made.next_run_ms == ms(2025, 1, 1, 3, 0)
    assert made.schedule_id.startswith("delete-durable-") and made.rq_job.startswith(made.schedule_id)
    assert Schedule.from_json("QM", made.schedule_id, made.to_json()) == made


@pytest.mark.parametrize(
    "raw,reason",
    [
        ("{", "not JSON"),
        ("[]", "not a JSON object"),
        (json.dumps({"job": "x", "cron": "0 3 * * *", "params": {}}), "unknown job"),
        (json.dumps({"job": "delete-durable", "cron": "nope", "params": {}}), "5 fields"),
        (
            json.dumps(
                {
                    "job": "delete-durable",
                    "cron": "0 3 * * *",
                    "params": {"client_id": "a", "durable_name": "%"},
                    "created_ms": "0",
                    "next_run_ms": 1,
                    "rq_job": "j",
                }
            ),
            "must be integers",
        ),
    ],
)
def test_a_record_that_cannot_be_read_is_a_corrupt_record_naming_why(raw, reason):
    with pytest.raises(CorruptRecord, match=reason) as caught:
        Schedule.from_json("QM", "s1", raw)
    assert caught.value.field == "s1" and caught.value.key == "{QM}:schedules"
