"""Row 22, the ``publish()`` call: us per call with flow control on and off, a bare XADD alongside
(``scripts.ab_publish``, which ``scripts.bench_ab`` also runs on two checkouts)."""

from __future__ import annotations

from scripts import ab_publish
from scripts.bench.base import Ctx, Figures, Measurement, Row, fmt


def _finish(ctx: Ctx) -> None:
    ctx.idle("publish")
    ctx.log("22. publish() call: us per call, flow control on and off, bare XADD alongside")
    ctx.figures["publish_call"] = ab_publish.measure(ctx.client, 5_000 if ctx.args.quick else 20_000)


def _rows(f: Figures) -> list[Row]:
    if "publish_call" not in f:
        return []
    pc = f["publish_call"]
    return [
        Row(
            "22. publish() call",
            fmt(1e6 / pc["flow_on_us"]),
            "",
            f"one publisher, 200 B bodies, N={pc['n']:,}: {pc['flow_on_us']} us per call "
            f"({pc['flow_on_cpu_us']} CPU-us) with flow control, {pc['flow_off_us']} us "
            f"({pc['flow_off_cpu_us']} CPU-us) without; a bare redis-py XADD {pc['xadd_us']} us "
            f"({pc['xadd_cpu_us']} CPU-us). Before/after: python -m scripts.bench_ab OLD NEW --rows publish",
            "",
        )
    ]


MEASUREMENT = Measurement("publish", finish=_finish, rows=_rows)
