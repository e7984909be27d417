"""The worker pool: N worker processes, supervised.

- A child that dies (crash, SIGKILL) is restarted; its publishers' turns are
  taken over by the orphan sweep once its lease runs out, so nothing is lost.
- SIGTERM or SIGINT to the pool: each child finishes its current unit of work,
  gives up its turns and exits; children still running after the grace period
  are killed (their work is taken over later, as after a crash).

- Metrics (``metrics_port`` set, ``broker.operations.metrics``): the children run in prometheus_client's
  multiprocess mode, each writing its files in the pool's private directory
  (``PROMETHEUS_MULTIPROC_DIR``, made empty at start and removed at stop); the pool serves
  ``/metrics`` on ``metrics_host:metrics_port``, adding up the children's files (a dead
  child's counters stay, its live gauges go) and what it samples from Redis at each scrape.

The child's entry point is an argument (``entry_point``, default
:func:`run_worker`), so a test rig can run the same supervision over workers it
instruments (``scripts/chaos.py`` runs ``scripts.rig.hook.run_worker``, which
adds crash points).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import time
from collections.abc import Callable, Sequence
from multiprocessing.process import BaseProcess
from typing import Any

from broker.core.config import Settings
from broker.core.errors import WorkerPoolFailed
from broker.core.logs import configure_logging

log = logging.getLogger("broker.pool")

#: A child restarted more often than this many times a minute is given up on.
MAX_RESTARTS_PER_MINUTE = 30

#: What a child runs: ``entry_point(settings_json, *args)``. It must be a
#: module-level function (children are spawned, so it is pickled by name).
EntryPoint = Callable[..., None]

#: Called as ``on_exit(slot, process)`` for each child found dead, before it is restarted.
ExitHandler = Callable[[int, BaseProcess], None]


def run_worker(settings_json: str) -> None:
    """The default entry point of a pool child: ``worker.loop.main``, logging to stderr.

    Args:
        settings_json: ``Settings.model_dump_json()`` of the pool's settings; its
            ``log_format`` and ``log_level`` configure the child's logging (``broker.core.logs``).
    """
    from worker.loop import main

    settings = Settings.model_validate_json(settings_json)
    configure_logging(settings.log_format, settings.log_level)
    main(settings)


def run_channel(settings_json: str) -> None:
    """The entry point of a supervised channel process (``broker channel``): ``broker.network.channel.main``.

    Args:
        settings_json: ``Settings.model_dump_json()`` of the pool's settings (logging as ``run_worker``).
    """
    from broker.network.channel import main

    settings = Settings.model_validate_json(settings_json)
    configure_logging(settings.log_format, settings.log_level)
    main(settings)


class Pool:
    """Run and supervise ``settings.concurrency`` worker processes.

    Args:
        settings: the broker settings (passed to each child as JSON).
        entry_point: what each child runs, ``entry_point(settings_json, *args)``.
        args: extra arguments for ``entry_point``.
        name: child process names are ``f"{name}-{slot}"``.
        on_exit: called for each child found dead, before its restart.
        max_restarts_per_minute: more restarts than this in a minute raise
            ``WorkerPoolFailed``; None never gives up (a fault-injection rig
            kills children on purpose).
        daemon: children are daemonic (killed if this process exits without ``stop``).
        serve_metrics: serve ``/metrics`` when ``settings.metrics_port`` is set (a pool of
            channel processes, which record nothing, passes False).
    """

    def __init__(
        self,
        settings: Settings,
        entry_point: EntryPoint = run_worker,
        args: Sequence[object] = (),
        *,
        name: str = "broker-worker",
        on_exit: ExitHandler | None = None,
        max_restarts_per_minute: int | None = MAX_RESTARTS_PER_MINUTE,
        daemon: bool = False,
        serve_metrics: bool = True,
    ) -> None:
        self.settings = settings
        self.entry_point = entry_point
        self.args = tuple(args)
        self.name = name
        self.on_exit = on_exit
        self.max_restarts_per_minute = max_restarts_per_minute
        self.daemon = daemon
        self._ctx = multiprocessing.get_context("spawn")
        self._children: list[BaseProcess | None] = [None] * settings.concurrency
        self._restarts: list[float] = []
        self.stopping = False
        self._metrics = bool(settings.metrics_port) and serve_metrics
        self._metrics_dir: Any = None
        self._metrics_server: Any = None
        self._metrics_client: Any = None

    @property
    def children(self) -> list[BaseProcess | None]:
        """The child process of each slot (None before ``start``); a copy."""
        return list(self._children)

    def child(self, slot: int) -> BaseProcess | None:
        """The current process of ``slot``, or None before ``start``."""
        return self._children[slot]

    def _spawn(self, slot: int) -> None:
        proc = self._ctx.Process(
            target=self.entry_point,
            args=(self.settings.model_dump_json(), *self.args),
            name=f"{self.name}-{slot}",
            daemon=self.daemon,
        )
        if self._metrics_dir is not None:
            with self._metrics_dir.exported():  # a spawned child reads it when it imports prometheus_client
                proc.start()
        else:
            proc.start()
        self._children[slot] = proc

    def start(self) -> None:
        """Start every child (and, with ``metrics_port`` set, the metrics server first).

        Raises:
            MetricsUnavailable: the metrics port cannot be bound (taken).
        """
        if self._metrics and self._metrics_dir is None:
            self._start_metrics()
        for slot in range(len(self._children)):
            self._spawn(slot)

    def _start_metrics(self) -> None:
        from broker.core.connection import connect
        from broker.operations.metrics import MetricsServer, MultiprocessDir, pool_registry

        directory = MultiprocessDir()
        directory.wipe()
        settings = self.settings
        client = connect(settings.redis_url, tls=settings.tls)
        try:
            server = MetricsServer(
                pool_registry(directory.path, client, settings), settings.metrics_port, settings.metrics_host
            )
        except BaseException:  # MetricsUnavailable: the port is taken
            client.close()
            directory.remove()
            raise
        self._metrics_dir, self._metrics_client, self._metrics_server = directory, client, server
        log.info("metrics on http://%s:%d/metrics", settings.metrics_host, settings.metrics_port)

    def _stop_metrics(self) -> None:
        if self._metrics_server is not None:
            self._metrics_server.close()
            self._metrics_client.close()
            self._metrics_dir.remove()
        self._metrics_dir = self._metrics_server = self._metrics_client = None

    def alive(self) -> int:
        """How many children are running."""
        return sum(1 for p in self._children if p is not None and p.is_alive())

    def supervise_once(self) -> int:
        """Restart children that died; returns how many were restarted.

        Raises:
            WorkerPoolFailed: more than ``max_restarts_per_minute`` restarts in a minute.
        """
        restarted = 0
        for slot, proc in enumerate(self._children):
            if proc is None or proc.is_alive() or self.stopping:
                continue
            if self.max_restarts_per_minute is not None:
                now = time.monotonic()
                self._restarts = [t for t in self._restarts if now - t < 60] + [now]
                if len(self._restarts) > self.max_restarts_per_minute:
                    raise WorkerPoolFailed(
                        f"workers died {len(self._restarts)} times in a minute; giving up (see the log above)"
                    )
            if self._metrics_dir is not None:
                self._metrics_dir.process_dead(proc.pid)
            if self.on_exit is not None:
                self.on_exit(slot, proc)
            else:
                log.warning("worker %s exited with %s; restarting", proc.name, proc.exitcode)
            self._spawn(slot)
            restarted += 1
        return restarted

    def stop(self) -> None:
        """SIGTERM every child, wait up to ``stop_grace_ms``, then SIGKILL the rest.

        A stopped (SIGSTOPped) child is continued after its SIGTERM, so it can
        finish its unit of work and give up its turns like the others.
        """
        self.stopping = True
        for proc in self._children:
            if proc is not None and proc.is_alive() and proc.pid is not None:
                proc.terminate()
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGCONT)
        deadline = time.monotonic() + self.settings.stop_grace_ms / 1000
        for proc in self._children:
            if proc is not None:
                proc.join(max(0.0, deadline - time.monotonic()))
                if proc.is_alive():
                    log.warning("worker %s did not stop in time; killing it", proc.name)
                    proc.kill()
                    proc.join()
        self._stop_metrics()

    def run(self) -> None:
        """Start, supervise until SIGTERM/SIGINT, then stop."""

        def _on_signal(signum: int, frame: object) -> None:
            self.stopping = True

        signal.signal(signal.SIGTERM, _on_signal)
        signal.signal(signal.SIGINT, _on_signal)
        self.start()
        try:
            while not self.stopping:
                self.supervise_once()
                time.sleep(0.2)
        finally:
            self.stop()
