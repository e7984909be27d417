"""A worker process's garbage collector (``worker.process``): set for a round's allocations."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from worker.process import YOUNG_THRESHOLD, tune_gc


@pytest.fixture
def restored_gc() -> Iterator[None]:
    """The test process's collector as it was, after the test."""
    before = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*before)


def test_tune_gc_raises_only_the_young_threshold_and_freezes_what_exists(restored_gc: None) -> None:
    gc.unfreeze()
    gc.set_threshold(700, 10, 10)
    kept = [object() for _ in range(3)]  # noqa: F841 (alive while frozen)

    tune_gc()

    assert gc.get_threshold() == (YOUNG_THRESHOLD, 10, 10)
    assert gc.get_freeze_count() > 0


def test_a_round_of_garbage_under_the_threshold_starts_no_collection(restored_gc: None) -> None:
    """500 publications' worth of short-lived containers (a round) trigger no collection: with
    CPython's default threshold (700) the same allocations trigger several."""
    tune_gc()
    gc.collect()  # start counting from an empty young generation
    collections: list[int] = []

    def seen(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collections.append(info["generation"])

    gc.callbacks.append(seen)
    try:
        for _ in range(500):
            fields = {b"topic": b"t", b"body": b"x" * 200}  # a round's short-lived containers
            unit = [fields, (b"q1", b"q2"), {"reply": None}]
            del fields, unit
        kept = [[i] for i in range(5_000)]  # and some that live through the round
        del kept
        under_tuned = len(collections)
        gc.set_threshold(700, 10, 10)
        kept = [[i] for i in range(5_000)]
        del kept
        under_default = len(collections) - under_tuned
    finally:
        gc.callbacks.remove(seen)
    assert under_tuned == 0
    assert under_default >= 5
