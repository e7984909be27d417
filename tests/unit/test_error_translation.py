"""``broker.errors``: the one place redis-py's errors become the broker's."""

from __future__ import annotations

import pytest
import redis
from redis.exceptions import RedisClusterException, SlotNotCoveredError

from broker.core.errors import (
    ConnectionLost,
    ForeignKey,
    InvalidMessage,
    ServerError,
    ServerFull,
    redis_error,
    script_error,
    translate_errors,
)

OOM = redis.exceptions.OutOfMemoryError("OOM command not allowed when used memory > 'maxmemory'.")
FOREIGN = redis.ResponseError(
    "BROKER foreign key: {QM}:publishers holds a string, not a set script: abc, on @user_script:3."
)


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (redis.ConnectionError("refused"), ConnectionLost),
        (redis.TimeoutError("slow"), ConnectionLost),
        (redis.AuthenticationError("WRONGPASS"), ConnectionLost),
        (SlotNotCoveredError("slot 1"), ConnectionLost),
        (OOM, ServerFull),
        (redis.ResponseError("WRONGTYPE Operation against a key"), ServerError),
        (FOREIGN, ServerError),  # at the boundary a script's reply is an error reply like any other
        (RedisClusterException("CROSSSLOT"), ServerError),
    ],
)
def test_redis_error_gives_the_broker_error_each_redis_py_error_stands_for(exc, kind) -> None:
    assert type(redis_error(exc, "unit of work")) is kind


def test_redis_error_leaves_other_errors_as_they_are() -> None:
    own = InvalidMessage("bad")
    assert redis_error(own, "x") is own


def test_script_error_names_a_foreign_key_and_a_full_server_and_leaves_the_rest() -> None:
    found = script_error(FOREIGN, "dequeue")
    assert isinstance(found, ForeignKey) and "{QM}:publishers" in str(found)
    full = script_error(OOM, "unit of work")
    assert isinstance(full, ServerFull) and full.what == "unit of work"
    other = redis.ResponseError("ERR something")
    assert script_error(other, "x") is other


def test_translate_errors_raises_the_translation_from_the_original_and_names_what_was_refused() -> None:
    @translate_errors
    def add_topic() -> None:
        raise OOM

    with pytest.raises(ServerFull) as info:
        add_topic()
    assert info.value.what == "add topic" and info.value.__cause__ is OOM
    assert add_topic.__name__ == "add_topic"
