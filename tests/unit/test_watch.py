"""broker.operations.watch: rates from two samples, the frame (sorted, capped, problems), the refresh loop."""

from __future__ import annotations

import io
import re
from typing import Any

from rich.console import Console

from broker.operations.status import Snapshot, SubscriptionRow, WorkerRow
from broker.operations.watch import Sample, rates, render, watch


def _snapshot(depths: dict[str, int | None], problems: list[str] | None = None, **top: Any) -> Snapshot:
    workers = top.get("workers", [("w0", "alive")])
    return Snapshot(
        stream_length=top.get("stream_length", 0),
        pending=0,
        lag=0,
        dead_lettered=top.get("dead_lettered", 0),
        active_publishers=0,
        version=1,
        subscriptions=[
            SubscriptionRow(sub_id, f"t/{sub_id}", False, "queue", 1, depth, 0, 0, 0, 0)
            for sub_id, depth in depths.items()
        ],
        links=0,
        topic_scheme="mqtt",
        workers=[WorkerRow(name, 1, 0, 0, state) for name, state in workers],
        problems=problems or [],
    )


def _sample(at_ms: float, added: int | None, acked: int | None, depths: dict[str, int | None]) -> Sample:
    return Sample(at_ms, _snapshot(depths), added, acked)


def _console(height: int = 40, terminal: bool = False) -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=120, height=height, force_terminal=terminal, color_system=None), out


def test_rates_are_the_difference_over_the_time_measured():
    # Given 100 publications added and 80 committed between samples 1,000 ms apart
    before = _sample(5_000, 1_000, 900, {"a": 10, "b": 5})
    after = _sample(6_000, 1_100, 980, {"a": 40, "b": 0})
    # When the rates are worked out
    found = rates(before, after)
    # Then they are per second
    assert found is not None
    assert found.publications_per_s == 100.0
    assert found.deliveries_per_s == 80.0
    assert found.depth_per_s == {"a": 30.0, "b": -5.0}
    assert found.interval_ms == 1_000


def test_rates_scale_with_the_interval_and_skip_unknown_or_reset_counters():
    found = rates(_sample(0, 0, 10, {"a": None}), _sample(500, 100, 5, {"a": 3, "new": 1}))
    assert found is not None
    assert found.publications_per_s == 200.0
    assert found.deliveries_per_s is None  # went back: a reset queue manager
    assert found.depth_per_s == {}  # a's depth was unknown, "new" was not there
    assert rates(_sample(0, None, 0, {}), _sample(1_000, 5, 0, {})).publications_per_s is None  # type: ignore[union-attr]
    assert rates(_sample(1_000, 0, 0, {}), _sample(1_000, 5, 0, {})) is None


def test_watch_two_iterations_with_an_injected_clock_shows_100_per_second():
    # Given fake samples 1,000 ms apart with 100 publications between them
    samples = iter([_sample(0, 1_000, 1_000, {"a": 0}), _sample(1_000, 1_100, 1_050, {"a": 50})])
    waited: list[float] = []
    console, out = _console()
    # When the view refreshes twice
    shown = watch(
        lambda: next(samples), console, 1_000, "queue manager T", iterations=2, wait_ms=waited.append
    )
    # Then the first frame has no rates yet and the second has them
    assert shown == 2 and len(waited) == 1
    first, second = out.getvalue().split("queue manager T")[1:]
    assert "publications/s -" in first
    assert "publications/s 100.0" in second and "deliveries/s 50.0" in second
    assert "50.0" in second.split("depth/s")[1]


def test_watch_on_a_terminal_draws_in_place_and_ctrl_c_ends_it_quietly():
    samples = iter([_sample(0, 0, 0, {}), _sample(1_000, 7, 7, {})])

    def interrupted(ms: float) -> None:
        raise KeyboardInterrupt

    console, out = _console(terminal=True)
    assert watch(lambda: next(samples), console, 1_000, "T", wait_ms=interrupted) == 1
    assert "no subscriptions" in out.getvalue()


def test_frame_lists_subscriptions_deepest_first_capped_to_the_height():
    # Given 30 subscriptions and a 16-line terminal
    depths: dict[str, int | None] = {f"s{n:02d}": n for n in range(30)}
    depths["foreign"] = None
    console, out = _console(height=16)
    # When a frame is drawn
    console.print(render(_sample(0, 0, 0, depths), None, "T", 16))
    text = out.getvalue()
    # Then the deepest come first, only as many as fit, the rest counted
    assert text.index("s29") < text.index("s28") < text.index("s27")
    assert "s20" not in text and "foreign" not in text
    assert "... and 23 more subscription(s), less deep" in text
    assert len(text.splitlines()) <= 16


def test_frame_shows_problems_dead_letters_and_workers_alive():
    snapshot = _snapshot(
        {"a": 1},
        problems=[f"foreign key {{T}}:k{n} is a string, expected a list" for n in range(7)],
        dead_lettered=3,
        workers=[("w0", "alive"), ("w1", "silent")],
    )
    console, out = _console()
    console.print(render(Sample(0, snapshot, None, None), None, "T", 40))
    text = out.getvalue()
    assert "problem: foreign key {T}:k0 is a string, expected a list" in text
    assert "problem: foreign key {T}:k4" in text and "{T}:k5" not in text
    assert "... and 2 more problem(s)" in text
    assert "dead letters 3" in text and "workers alive 1/2" in text


def test_the_frame_fits_a_14_line_terminal_keeping_the_more_line_when_lines_wrap():
    # Given 30 subscriptions (one with a long filter), two long problems and a long title,
    # on a terminal of 14 lines and 80 columns, where they wrap
    depths: dict[str, int | None] = {f"s{n:02d}": n for n in range(30)}
    snapshot = _snapshot(
        depths, problems=[f"foreign key {{T}}:k{n} " + "is a string, expected a list " * 3 for n in range(2)]
    )
    snapshot.subscriptions[-1].filter = "t/" + "long/" * 40
    out = io.StringIO()
    console = Console(file=out, width=80, height=14, force_terminal=True, color_system=None)
    title = "queue manager QM1 on redis://user@very-long-host-name.example.internal:6380/0 (TLS)"
    # When the live view draws a frame (rich Live, in place)
    assert watch(lambda: Sample(0, snapshot, None, None), console, 1_000, title, iterations=1) == 1
    # Then the frame holds at most 14 lines, ends with the line counting the rest, and the table is whole
    shown_live = out.getvalue().split("\r")[0]  # what Live drew in place (it prints it again when it stops)
    frame = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", shown_live).rstrip("\n").split("\n")
    assert len(frame) <= 14, frame
    assert re.fullmatch(r"\.\.\. and \d+ more subscription\(s\), less deep", frame[-1]), frame
    assert frame[-2].startswith("└"), frame  # the table's bottom border: nothing cut
    assert "s29" in "\n".join(frame) and "depth/s" in frame[-5]  # the deepest, under whole headers
