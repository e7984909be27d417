"""``broker jobs``: scheduled admin jobs (schedule, list, cancel); rq is imported when one runs."""

from __future__ import annotations

import json
from dataclasses import asdict

import click

from broker.cli.common import State
from broker.cli.render import (
    _print_problems,
    _print_schedules,
    _utc,
)


@click.group("jobs", short_help="Scheduled admin jobs: schedule, list, cancel.")
def jobs_group() -> None:
    """Admin jobs run at cron times by `broker scheduler` (SwiftMQ's scheduler jobs).
    Cron expressions are five fields (minute hour day-of-month month day-of-week), in UTC."""


@jobs_group.group("schedule")
def jobs_schedule() -> None:
    """Schedule a job at the times of a cron expression."""


@jobs_schedule.command("delete-durable")
@click.option("--cron", required=True, help="Five cron fields, UTC, e.g. '0 3 * * *' (03:00 every day).")
@click.option(
    "--client-id", "client_id_predicate", required=True, metavar="PREDICATE", help="SQL LIKE on client ids."
)
@click.option(
    "--durable-name",
    "durable_name_predicate",
    required=True,
    metavar="PREDICATE",
    help="SQL LIKE on durable names.",
)
@click.pass_obj
def jobs_schedule_delete_durable(
    state: State, cron: str, client_id_predicate: str, durable_name_predicate: str
) -> None:
    """Schedule Delete Durable: at each time of --cron, delete the durable subscriptions (and their
    messages) whose client id and durable name match the predicates (see `broker durables delete`)."""
    # lazy: rq is imported only by the commands that schedule or run admin jobs
    from broker.jobs import add_schedule

    settings = state.settings
    made = add_schedule(
        state.client(),
        settings.redis_url,
        settings.qm,
        "delete-durable",
        cron,
        {"client_id": client_id_predicate, "durable_name": durable_name_predicate},
        tls=settings.tls,
    )
    click.echo(
        f"scheduled {made.schedule_id}: delete-durable at {made.cron!r}; next run {_utc(made.next_run_ms)}"
    )


@jobs_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print {schedules, problems} as one JSON object.")
@click.pass_obj
def jobs_list(state: State, as_json: bool) -> None:
    """List scheduled jobs: id, job, parameters, cron schedule, next run, last run and its result."""
    # lazy: rq is imported only by the commands that schedule or run admin jobs
    from broker.jobs import list_schedules

    found, problems = list_schedules(state.client(), state.settings.qm)
    if as_json:
        rows = [
            {"id": s.schedule_id, **{k: v for k, v in asdict(s).items() if k != "schedule_id"}} for s in found
        ]
        click.echo(json.dumps({"schedules": rows, "problems": problems}, indent=2))
        return
    if not found:
        click.echo("no scheduled jobs")
    else:
        _print_schedules(found)
    _print_problems(problems)


@jobs_group.command("cancel")
@click.argument("schedule_id")
@click.pass_obj
def jobs_cancel(state: State, schedule_id: str) -> None:
    """Cancel scheduled job SCHEDULE_ID (also one whose record cannot be read): it never runs again."""
    # lazy: rq is imported only by the commands that schedule or run admin jobs
    from broker.jobs import cancel_schedule

    cancel_schedule(state.client(), state.settings.qm, schedule_id)
    click.echo(f"cancelled {schedule_id}")


#: The commands this module adds to ``broker``.
COMMANDS = (jobs_group,)
