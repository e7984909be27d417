"""CPU accounting from /proc (Linux): a process's ticks, the box's, the server's pid and command statistics."""

from __future__ import annotations

import os
import time
from pathlib import Path

import redis

_TICK = os.sysconf("SC_CLK_TCK")


def _proc_ticks(pid: int) -> int:
    try:
        with Path(f"/proc/{pid}/stat").open("rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime + stime (fields 14 and 15)
    except (OSError, IndexError, ValueError):
        return 0


def _box_ticks() -> tuple[int, int]:
    with Path("/proc/stat").open("rb") as handle:
        values = [int(v) for v in handle.readline().split()[1:]]
    idle = values[3] + values[4]
    return sum(values[:8]) - idle, sum(values[:8])


class CpuMeter:
    """CPU of named processes and of the whole box over a span, as % of one core.

    Args:
        pids: name -> list of pids ("redis", "workers", "bench", ...).
    """

    def __init__(self, pids: dict[str, list[int]]) -> None:
        self.pids = pids
        self._start = self._read()

    def _read(self) -> tuple[float, dict[str, int], tuple[int, int]]:
        return (
            time.perf_counter(),
            {name: sum(_proc_ticks(p) for p in pids) for name, pids in self.pids.items()},
            _box_ticks(),
        )

    def stop(self) -> dict[str, float]:
        """CPU since creation: each name, ``box`` (all processes) and ``foreign`` (box minus ours), % of one core."""
        t1, procs1, (busy1, total1) = self._read()
        t0, procs0, (busy0, total0) = self._start
        span = max(t1 - t0, 1e-9)
        out = {name: round(100 * (procs1[name] - procs0[name]) / _TICK / span, 1) for name in procs1}
        ncpu = os.cpu_count() or 1
        box = 100 * ncpu * (busy1 - busy0) / max(total1 - total0, 1)
        out["box"] = round(box, 1)
        out["foreign"] = round(max(0.0, box - sum(v for k, v in out.items() if k != "box")), 1)
        return out


def redis_pid(client: redis.Redis) -> int:
    """The server's pid (INFO server ``process_id``)."""
    return int(client.info("server")["process_id"])


def commandstats(client: redis.Redis) -> dict[str, dict[str, float]]:
    """INFO commandstats as ``{command: {"calls", "usec"}}``."""
    stats = {}
    for name, data in client.info("commandstats").items():
        stats[name.removeprefix("cmdstat_")] = {"calls": int(data["calls"]), "usec": float(data["usec"])}
    return stats


# --------------------------------------------------------------------------------------------
# 1. The ceiling: hand-packed MULTI fan-out with a bare hiredis reader
# --------------------------------------------------------------------------------------------
