"""The federation chaos harness, briefly: ``python -m scripts.chaos --federation`` (three queue
managers on a local 3-master cluster, channel processes killed at their crash points, channel
connections cut, a master restarted) must end with nothing lost, duplicated or reordered."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_short_federation_chaos_run_loses_duplicates_and_reorders_nothing():
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "scripts.chaos",
            "--federation",
            "--seconds",
            "8",  # 5 s left about 2 s after the forced restart: 1 or 2 faults took effect, by timing
            "--workers",
            "1",
            "--rate",
            "60",
            "--fault-interval-ms",
            "600",
            "--drain-s",
            "60",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 0, "\n".join(lines[-30:]) + done.stderr[-2000:]
    figures = dict(item.split("=", 1) for item in lines[-1].split())
    assert (figures["lost"], figures["duplicated"], figures["reordered"]) == ("0", "0", "0")
    assert int(figures["publications"]) > 0 and int(figures["forwarded"]) > 0
    faults = next(line for line in lines if line.startswith("faults by kind: "))
    assert "node_restart=1" in faults  # one master restarted halfway through, at least
    assert int(figures["faults"]) >= 2  # 6 in each of 3 runs of 8 s (channel kills, a cut, ...)
