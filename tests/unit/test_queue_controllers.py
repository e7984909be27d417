"""Queue controllers (seed 003) in the settings and on the workers' side, without a server."""

from __future__ import annotations

import pytest

from broker.core import keys
from broker.core.config import ConsumerMode, QueueController, Settings, load_settings
from broker.core.errors import ConfigError
from broker.topics.queue_controllers import PersistenceModes

SEED = """
qm = "QM1"

[[queue_controllers]]
name = "01"
predicate = "tmp$%"
persistence_mode = "non_persistent"

[[queue_controllers]]
name = "06"
predicate = "failsave$%"
consumer_mode = "activestandby"

[[queue_controllers]]
name = "07"
predicate = "%$%"
consumer_mode = "shared"
"""


def test_the_seeds_controllers_load_from_toml_and_the_first_match_wins(tmp_path):
    # Given the seed's controllers as [[queue_controllers]] tables
    path = tmp_path / "broker.toml"
    path.write_text(SEED)
    # When loaded
    settings = load_settings(path)
    # Then each subscription takes the first controller whose predicate matches
    assert [c.name for c in settings.queue_controllers] == ["01", "06", "07"]
    tmp = settings.queue_controller("tmp$1")
    assert tmp is not None and tmp.persistence_mode == "non_persistent" and tmp.forced_persistent is False
    assert settings.consumer_mode("tmp$1") == "exclusive"  # 01 matched: its own (default) consumer mode
    assert settings.consumer_mode("failsave$orders") == "activestandby"
    assert settings.consumer_mode("app$orders") == "shared"
    assert settings.queue_controller("nodollar") is None and settings.consumer_mode("nodollar") == "exclusive"


def test_consumer_modes_are_looked_at_after_the_queue_controllers():
    settings = Settings(
        queue_controllers=[QueueController(predicate="tmp$%", persistence_mode="non_persistent")],
        consumer_modes=[ConsumerMode(predicate="%", mode="shared")],
    )
    assert settings.consumer_mode("tmp$1") == "exclusive"
    assert settings.consumer_mode("app$x") == "shared"


@pytest.mark.parametrize(
    ("table", "says", "line"),
    [
        (
            'predicate = "tmp$%"\npersistence_mode = "transient"',
            "persistence_mode: Input should be 'as_message'",
            6,
        ),
        (
            'predicate = "tmp$%"\nconsumer_mode = "round-robin"',
            "consumer_mode: Input should be 'exclusive'",
            6,
        ),
        ('predicate = ""', "predicate: String should have at least 1 character", 5),
        ('predicate = "tmp$%"\ncolour = "red"', "colour: Extra inputs are not permitted", 6),
        ('persistence_mode = "persistent"', "predicate: Field required", 4),  # the table's header
    ],
)
def test_a_bad_controller_is_refused_naming_the_setting_and_its_line(tmp_path, table, says, line):
    # Given a good controller, then a bad one
    path = tmp_path / "broker.toml"
    path.write_text(f'[[queue_controllers]]\npredicate = "a$%"\n\n[[queue_controllers]]\n{table}\n')
    # When loaded, Then the loader refuses it, naming the controller, the field and the line
    with pytest.raises(ConfigError) as caught:
        load_settings(path)
    assert f"queue_controllers.1.{says}" in str(caught.value)
    assert str(caught.value).endswith(f"(line {line})")


def test_two_controllers_of_one_name_and_a_bad_inline_consumer_mode_are_refused(tmp_path):
    with pytest.raises(ValueError, match="two queue controllers are named '01'"):
        Settings(
            queue_controllers=[QueueController(name="01", predicate="a%"), {"name": "01", "predicate": "b%"}]
        )
    bad = tmp_path / "bad.toml"
    bad.write_text(
        'qm = "QM1"\nconsumer_modes = [{predicate = "%", mode = "shared"}, {predicate = "x", mode = "no"}]\n'
    )
    with pytest.raises(ConfigError, match=r"consumer_modes.1.mode: Input should be .* \(line 2\)"):
        load_settings(bad)


def test_a_worker_without_a_persistence_mode_controller_has_nothing_to_apply():
    assert not PersistenceModes(Settings())
    only_modes = Settings(
        queue_controllers=[QueueController(predicate="failsave$%", consumer_mode="activestandby")],
        consumer_modes=[ConsumerMode(predicate="%", mode="shared")],
    )
    assert not PersistenceModes(only_modes)


def test_the_mode_is_applied_only_when_every_queue_agrees():
    settings = Settings(
        qm="QM1",
        queue_controllers=[
            QueueController(predicate="tmp$%", persistence_mode="non_persistent"),
            QueueController(predicate="audit$%", persistence_mode="persistent"),
            QueueController(predicate="sys$%"),  # as_message: shadows the ones after it
            QueueController(predicate="%", persistence_mode="non_persistent"),
        ],
    )
    modes = PersistenceModes(settings)
    tmp1, tmp2 = keys.sub_queue("QM1", "tmp$1"), keys.sub_band("QM1", "tmp$2", 9)
    audit, sys = keys.sub_queue("QM1", "audit$x"), keys.sub_queue("QM1", "sys$x")
    assert modes and modes.forced(tmp2) is False and modes.forced(audit) is True and modes.forced(sys) is None
    assert modes.forced(keys.transmission("QM1", "QM2")) is None  # a channel keeps the publication's mode
    header: dict[str, object] = {"msgid": "m", "props": {}}
    assert modes.apply(header, (tmp1, tmp2)) is False
    assert header == {"msgid": "m", "persistent": False, "props": {}}  # props kept last
    for mixed in ((tmp1, audit), (tmp1, sys), (tmp1, keys.transmission("QM1", "QM2"))):
        header = {"msgid": "m", "persistent": False}
        assert modes.apply(header, mixed) is None and header == {"msgid": "m", "persistent": False}
    header = {"msgid": "m", "persistent": False}
    assert modes.apply(header, (audit,)) is True and header == {"msgid": "m"}  # persistent: the default
