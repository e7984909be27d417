"""The worker pool of an earlier commit, for the benchmark's no-regression row (``--only regression``).

``python -m scripts.bench`` measures "the rate before the new features" side by side with this commit's:
the same server, topology, preload and drain check (``pool.run_broker``), only the worker
pool differs. ``BaselineCheckout`` makes a detached git worktree of the earlier commit (removed
at the end), and ``BaselinePool`` runs *that* checkout's own ``worker.pool.Pool`` in a
subprocess whose ``sys.path`` starts there, so its workers load its Python code and its Lua
scripts. The pool is configured through ``BROKER_*`` variables (the settings the bench changed
from their defaults): an older ``Settings`` ignores a variable it does not know.

The earlier commit must speak the same publication entry and subscription record formats
(every commit since protocol version 3 does, for the benchmark's workload: no principals, no
network, no topic objects).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from broker.core.config import Settings

#: The commit before the features of issues 13-15 (federation, security, operations).
DEFAULT_BASELINE = "4890748"

#: What the subprocess runs: the checkout's own pool, stopped warm on SIGTERM.
RUNNER = (
    "import sys; sys.path.insert(0, sys.argv[1]);"
    "from broker.core.config import Settings; from worker.pool import Pool;"
    "Pool(Settings()).run()"
)

#: Seconds a stopped pool may take to give up its turns and exit before it is killed.
STOP_TIMEOUT_S = 20.0


class BaselineError(RuntimeError):
    """The earlier commit cannot be checked out or its pool does not start."""


class BaselineCheckout:
    """A detached ``git worktree`` of ``ref`` in a temporary directory (``close`` removes it).

    Raises:
        BaselineError: ``ref`` is not a commit of ``repo`` (a shallow clone lacks it) or git failed.
    """

    def __init__(self, repo: Path, ref: str) -> None:
        self.repo = repo
        self.ref = ref
        self.path = Path(tempfile.mkdtemp(prefix="bench-baseline-")) / "tree"
        found = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
            capture_output=True,
            text=True,
        )
        if found.returncode != 0:
            raise BaselineError(f"{ref!r} is not a commit of {repo} (a shallow clone? fetch it first)")
        self.commit = found.stdout.strip()
        made = subprocess.run(
            ["git", "-C", str(repo), "worktree", "add", "--detach", "--quiet", str(self.path), self.commit],
            capture_output=True,
            text=True,
        )
        if made.returncode != 0:
            raise BaselineError(f"git worktree add {ref}: {made.stderr.strip()}")
        described = subprocess.run(
            ["git", "-C", str(repo), "log", "-1", "--format=%s", self.commit],
            capture_output=True,
            text=True,
        )
        self.short = self.commit[:7]
        self.subject = described.stdout.strip()[:100]

    def close(self) -> None:
        """Remove the worktree (and its directory)."""
        subprocess.run(
            ["git", "-C", str(self.repo), "worktree", "remove", "--force", str(self.path)],
            capture_output=True,
        )
        shutil.rmtree(self.path.parent, ignore_errors=True)


def settings_env(settings: Settings, concurrency: int) -> dict[str, str]:
    """``BROKER_*`` variables for every setting that differs from its default, and the concurrency.

    Values are JSON for lists and objects, plain text otherwise (what pydantic-settings reads).
    """
    env = {"BROKER_CONCURRENCY": str(concurrency)}
    for name, value in settings.model_dump(mode="json", exclude_defaults=True).items():
        if name == "concurrency":
            continue
        env[f"BROKER_{name.upper()}"] = (
            json.dumps(value)
            if isinstance(value, list | dict)
            else str(value).lower()
            if isinstance(value, bool)
            else str(value)
        )
    return env


class BaselinePool:
    """The earlier commit's worker pool in a subprocess: ``start``, ``alive``, ``stop``, as ``worker.pool.Pool``.

    Args:
        checkout: the earlier commit's worktree.
        settings: this commit's settings (only those that differ from the defaults are passed).
        concurrency: worker processes.
    """

    def __init__(self, checkout: Path, settings: Settings, concurrency: int) -> None:
        self.checkout = checkout
        self.settings = settings
        self.concurrency = concurrency
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the subprocess (its workers register with their heartbeats, as this commit's do)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("BROKER_")}
        env |= settings_env(self.settings, self.concurrency)
        env["PYTHONPATH"] = str(self.checkout)
        self._proc = subprocess.Popen(
            [sys.executable, "-c", RUNNER, str(self.checkout)],
            cwd=self.checkout,
            env=env,
            start_new_session=True,
        )

    def alive(self) -> int:
        """``concurrency`` while the subprocess runs (its pool restarts a dead child), else 0."""
        return self.concurrency if self._proc is not None and self._proc.poll() is None else 0

    def stop(self) -> None:
        """SIGTERM (a warm stop), then SIGKILL of its process group after ``STOP_TIMEOUT_S``."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def pool_factory(checkout: Path) -> Any:
    """``run_broker``'s ``pool_factory`` for ``checkout``: ``(settings, k) -> BaselinePool``."""
    return lambda settings, k: BaselinePool(checkout, settings, k)
