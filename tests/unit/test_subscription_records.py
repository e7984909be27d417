"""Subscription records (protocol 3 fields) and consumer modes from settings, without a server."""

from __future__ import annotations

import pytest

from broker.core.config import ConsumerMode, Settings, load_settings
from broker.core.errors import ConfigError, CorruptRecord
from broker.topics.subscriptions import SubscriptionRecord


def test_record_round_trips_and_leaves_defaults_out():
    plain = SubscriptionRecord("c$a", "/A/#", True, 5)
    assert plain.to_json() == '{"filter":"/A/#","durable":true,"created_ms":5}'
    full = SubscriptionRecord("grp$s", "a/+", False, 5, "x > 1", True, "shared", "grp")
    again = SubscriptionRecord.from_json("grp$s", full.to_json())
    assert again == full
    assert again.shown_filter == "$share/grp/a/+" and again.client_id == "grp"


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ('{"filter":"a","selector":"x = "}', "invalid selector"),
        ('{"filter":"a","selector":5}', '"selector" must be a string'),
        ('{"filter":"a","no_local":"yes"}', '"no_local" must be true or false'),
        ('{"filter":"a","mode":"fanout"}', '"mode" must be one of'),
    ],
)
def test_a_record_with_a_bad_new_field_is_corrupt(raw, reason):
    with pytest.raises(CorruptRecord) as caught:
        SubscriptionRecord.from_json("c$a", raw)
    assert reason in str(caught.value)


def test_consumer_mode_is_the_first_matching_like_predicate():
    settings = Settings(
        consumer_modes=[
            ConsumerMode(predicate="failsave$%", mode="activestandby"),
            ConsumerMode(predicate="%$%", mode="shared"),
        ]
    )
    assert settings.consumer_mode("failsave$orders") == "activestandby"
    assert settings.consumer_mode("app$orders") == "shared"
    assert Settings().consumer_mode("app$orders") == "exclusive"


def test_consumer_modes_from_a_config_file_are_checked(tmp_path):
    good = tmp_path / "good.toml"
    good.write_text('consumer_modes = [{predicate = "failsave$%", mode = "activestandby"}]\n')
    assert load_settings(good).consumer_modes[0].mode == "activestandby"
    bad = tmp_path / "bad.toml"
    bad.write_text('consumer_modes = [{predicate = "%", mode = "round-robin"}]\n')
    with pytest.raises(ConfigError) as caught:
        load_settings(bad)
    assert "consumer_modes" in str(caught.value)
