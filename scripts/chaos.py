"""Chaos harness: publishers, a worker pool and subscribers against a real server, under faults.

Usage::

    python -m scripts.chaos --duration-s 60 --seed 1 [--workers 3] [--publishers 4]
                            [--lease-ms 800] [--rate 200] [--fault-interval-ms 1000]
                            [--victim-share 0.05] [--victim-rate 20] [--weight KIND=N ...]

The script starts its own server (AOF on, ``appendfsync always``, a data
directory kept across restarts), a proxy process in front of it (workers and
publishers connect through it, so replies can be lost), worker processes
(``worker.loop.main`` with ``scripts.rig.hook.CrashHook``) under its own
supervisor, publisher and subscriber threads, and a maintenance thread that
trims acknowledged stream entries and watches memory. For ``--duration-s`` it
injects faults chosen by ``random.Random(seed)``:

- ``kill@<point>``: SIGKILL of a worker at a named crash point of
  ``worker.loop.CRASH_POINTS`` (it is restarted);
- ``kill_anytime``: SIGKILL of a worker at whatever it is doing;
- ``stop@<point>`` / ``stop_anytime``: SIGSTOP of a worker (at a crash point,
  e.g. with its units of work built) for 1.5-3 leases, then SIGCONT: a zombie
  whose writes must be fenced;
- ``client_kill``: ``CLIENT KILL`` of worker connections (found by client name);
- ``proxy_cut``: every worker connection cut by the proxy;
- ``drop_reply:<commit|dequeue|claim|xadd>``: the server applies the command,
  its reply is lost, the client's connection is cut;
- ``cut_request:<commit|dequeue|xadd>``: the connection is cut as the command
  is sent, before the server gets it;
- ``redis_restart``: SIGKILL of the server and a restart on the same port and
  data directory (AOF, ``appendfsync always``);
- ``foreign:queue``: a string planted where the queue of the ``victim``
  subscription (``/victim/#``) belongs. The victim subscription is unavailable
  while it is there (PMSGDLV/NPMSGDLV(ALLAVAIL), the default; issue 27):
  publications on victim topics (they go to ``victim`` and ``all``; ordinary
  publishers publish on them now and then) reach ``all``, and the victim's copy
  is dead-lettered ("subscription unavailable", ``dlq.subscription``); the
  victim's subscriber thread gets WRONGTYPE meanwhile, takes nothing and goes on;
- ``foreign:reply`` / ``foreign:dedup``: a hash planted at the reply list / a
  list planted at the dedup record of the next publication of a victim
  publisher (``v0``, ``v1``: raw XADDs with ``reply=1``), before it is
  published; that publication must end refused (``foreign_not_refused``);
- ``foreign:fifo`` / ``foreign:turn``: a string planted at a victim
  publisher's FIFO / a hash at its turn key, only while both are absent (nothing
  of it filed); its publications are refused meanwhile, and flow in order after;
- ``consumer_kill``: a subscription's consumer takes a batch, records it and
  dies without acknowledging it (a new consumer attaches once its lease
  lapses; the batch is redelivered, flagged);
- ``consumer_stop``: a consumer stalls for 1.5-3 consumer leases holding a
  batch, then goes on: its batch was given back and is redelivered, flagged,
  and its late acknowledgements change nothing;
- ``group_consumer_kill`` / ``group_consumer_close``: one of the consumers of the shared
  subscription ``$share/grouped//groups/#`` (three, ``scripts.rig.groups``) dies with a batch in
  flight (its lease lapses: its groups and batch go to the others) / closes with a batch
  unacknowledged (given back and its groups freed at once); a consumer of a new id takes its
  place. The publisher ``g0`` publishes grouped publications (``JMSXGroupID`` one of six groups,
  ``JMSXGroupSeq`` 1, 2, ... per group) on ``/groups/...``: each group's messages must be
  received in order, by one consumer at a time, its unacknowledged ones first after a move;
- ``corrupt:subscription`` / ``corrupt:link``: a record that is not JSON added
  to ``{qm}:subs`` / ``{qm}:links`` with ``INCR {qm}:version`` (no good
  publication depends on it), removed later the same way; the workers skip it
  and go on;
- ``killer_entry`` (optional: ``--weight killer_entry=N``): an ordinary
  publisher writes, in its order among its publications, an entry every worker
  dies on (SIGKILL as it handles it; ``scripts.rig.hook.install_killer``).
  It must be dead-lettered once, after ``max_deliveries``, and no healthy
  publication held beside it (its publisher's, other publishers') may be
  (``good_dead_lettered``).

A foreign key is planted only where the key does not exist (one Lua call checks
and writes, so nothing of the broker's is overwritten), with a unique token as
its value, and removed 0.2-2 s later (reply/dedup: once the entry it was planted
for has been handled) only if it still holds that token. Publications on victim
topics and of victim publishers are *refusable*: each must end delivered once to
every recipient or refused as a whole (dead-lettered once with a "foreign key"
reason, received by none); ``half_applied`` counts those that are neither.

Publisher ``d0`` publishes every publication with a delivery delay (a quarter to half a second,
many sharing one delivery time): each must be delivered once, in its order, and never received
before its delivery time (``early``: an anomaly); the drain waits for ``{qm}:delayed`` to empty.

Retained publications (issue 28 row 10): publisher ``r0`` publishes retained publications on
``RETAINED_TOPICS`` (each waits for its result), and a subscription to ``/retained/#`` is made every
``LATE_EVERY_S`` during the run and consumed; each must get the latest retained publication of each
topic exactly once, flagged, then every later one in order (``scripts.rig.retained``; a problem
fails the run).

Publishers also write poison entries (missing topic, invalid UTF-8, oversized
body, invalid topic, missing publisher) among their publications. Then the
faults stop, publishers stop, the workers drain, and the history is checked
(``scripts.rig.history``). The last line is::

    faults=<n> publications=<n> deliveries=<n> dead_lettered=<n> lost=<n> duplicated=<n> reordered=<n> \
    refusable=<n> refused_by_foreign_key=<n> half_applied=<n> foreign_not_refused=<n> good_dead_lettered=<n> \
    grouped=<n> group_lost=<n> group_duplicated=<n> group_reordered=<n> group_shared=<n>

and the exit status is non-zero when lost, duplicated, reordered, half_applied,
foreign_not_refused, good_dead_lettered or a group_ count is not 0 (or when another check failed: unexpected
messages, poison not dead-lettered, a refused entry dead-lettered twice, memory
over its bound, a drain that did not finish, a worker that exited on its own).

Federation (``--federation``)
-----------------------------
::

    python -m scripts.chaos --federation --seconds 20 [--seed 1] [--workers 2] [--rate 100]

Three queue managers in one network (``broker.topics.topology``) over a local 3-master
Redis Cluster (``broker.demo.local_cluster.LocalCluster(aof=True,
full_coverage=False)``, ``appendfsync always``), each queue manager's keys on a
master of its own: ``ROOT``, the hierarchy's root, and its children ``EAST`` and
``WEST`` (names get a number when needed to land on distinct masters), which
are also the publish/subscribe cluster ``FEDCL`` with the cluster topic object
``clu`` (defined at EAST, ``CLROUTE(DIRECT)``). Topics under ``hier/`` go from
EAST to WEST through ROOT; topics under ``clu/`` straight. Every queue manager
has a worker pool (``--workers`` processes) and a channel process
(``broker.network.channel.main`` with a ``CrashHook``), both supervised by
``worker.pool.Pool``, four subscriptions (``#``, ``hier/#``, ``+/b/x``,
``clu/a``) consumed by subscriber threads, and two publishers (one on
``hier/`` topics, one on ``clu/`` topics: each publisher's publications take one
path to each queue manager, and order is promised per publisher and path). The
network's ``url`` of each queue manager is a proxy in front of its master, so
the channels into it (and the agents reading its announcements) go through the
proxy. Faults (``FED_FAULTS``):

- ``kill@before_channel_in`` / ``kill@after_channel_in``: SIGKILL of a channel
  process at a mover's crash point (a batch read, not filed / filed, not
  recorded on the sending side); ``kill_channel_anytime``: at whatever it does;
- ``kill@<point>``: SIGKILL of a worker at a crash point (as above);
- ``proxy_cut``: every connection into one queue manager's proxy cut;
  ``drop_reply:channel_in`` / ``cut_request:channel_in``: a mover's filing
  applied and its reply lost / cut before the receiver got it;
- ``node_restart``: SIGKILL of one queue manager's master and a restart on its
  port and directory (AOF); the others keep serving their slots. At most one
  every 8 s, and at least one a run (halfway through, if the draw gave none);
- ``consumer_kill``, ``group_consumer_kill`` / ``group_consumer_close``: as above.

Retained publications and message groups (``scripts.rig.features``): ``r0`` publishes retained
publications at EAST and the late subscriptions are made at EAST (a channel forwards a retained
publication as an ordinary one: the retained store is the publishing queue manager's); ``g0``
publishes grouped publications at EAST on ``/groups/...`` and the shared subscription's three
consumers are at WEST, so every grouped publication comes over a channel through ROOT (a consumer
lease of at least 3 s there: a live consumer whose heartbeat stalls past its lease is dead to the
broker, yet goes on). ``ROOT``'s publishers delay every publication (as ``d0``).

The expected recipients of each publication are computed network-wide
(``scripts.rig.history.network_recipients``). After the drain (every queue
manager's stream handled, every transmission stream filed by its receiver,
every queue consumed), the last line is::

    faults=<n> publications=<n> deliveries=<n> forwarded=<n> dead_lettered=<n> lost=<n> duplicated=<n> reordered=<n> \
    grouped=<n> group_lost=<n> group_duplicated=<n> group_reordered=<n> group_shared=<n>

(``forwarded``: deliveries owed at a queue manager other than the publication's
origin), and the exit status is non-zero when lost, duplicated, reordered or a group_ count is
not 0 or another check failed (a retained problem among them).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import queue
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from broker.clients.consumer import Subscriber
from broker.clients.publish import Publisher
from broker.core import keys
from broker.core.clock import now_ms
from broker.core.config import Settings
from broker.core.connection import connect
from broker.core.errors import (
    BrokerError,
    ConnectionLost,
    ConsumerConflict,
    ForeignKey,
    ServerError,
    ServerNotFound,
)
from broker.core.models import publication_fields
from broker.core.server import Server, free_port, server_binary
from broker.core.stream import group_state
from broker.network.network_admin import apply_network
from broker.operations.maintenance import trim_acknowledged
from broker.operations.status import status
from broker.topics.links import link
from broker.topics.subscriptions import subscribe
from broker.topics.topic_objects import Attributes, define
from broker.topics.topology import ProxySubscription, announce_key, parse_network
from scripts.rig.cluster import LocalCluster, spread_names
from scripts.rig.features import (
    RETAINED_PUBLISHER,
    RETAINED_TOPICS,
    federated_setup,
    federated_threads,
    group_publisher,
    late_subscriptions,
    retainer,
)
from scripts.rig.groups import (
    CONSUMERS,
    GROUP_FAULTS,
    GROUP_FILTER,
    GROUP_LEASE_MS,
    GROUP_PUBLISHER,
    GROUP_TOPICS,
    GroupVerdict,
    GroupWorkload,
)
from scripts.rig.history import History, Poison, Publication, network_recipients, recipients
from scripts.rig.hook import KILLER_FIELD, run_channel, run_worker
from scripts.rig.proxy import ProxyProcess, call_of
from scripts.rig.retained import RetainedLog
from worker.loop import CRASH_POINTS
from worker.pool import ExitHandler, Pool

ROOT = Path(__file__).resolve().parent.parent

QM = "CHAOS"

#: Server directives: durable (AOF, fsync before every reply), never evict.
AOF_ARGS = (
    "--appendonly",
    "yes",
    "--appendfsync",
    "always",
    "--aof-load-truncated",
    "no",
    "--maxmemory-policy",
    "noeviction",
    "--save",
    "",
)

#: Topics publishers publish on.
TOPICS = ("/chaos/a/x", "/chaos/a/y", "/chaos/b/x", "/chaos/c", "/other/z", "/linked/src", "/linked/src/deep")

#: Topics of the victim subscription, whose queue is made foreign now and then ("foreign:queue").
VICTIM_TOPICS = ("/victim/a", "/victim/b/c")


#: Publishers whose FIFO, turn, reply and dedup keys are made foreign now and then.
VICTIM_PUBLISHERS = ("v0", "v1")

#: Subscriptions (name -> filter): exact, "+", "#", reached through links, everything, the victim.
FILTERS = {
    "exact": "/chaos/a/x",
    "plus": "/chaos/+/x",
    "hash": "/chaos/#",
    "linked": "/news/#",
    "archive": "/archive/all",
    "all": "#",
    "victim": "/victim/#",
}

#: Administrative links (a transitive chain): /linked/src -> /news/feed -> /archive/all.
LINKS = [("/linked/src", "/news/feed"), ("/news/feed", "/archive/all")]

#: Client name of the workers' connections (set through the redis URL), for CLIENT KILL.
WORKER_CLIENT_NAME = "chaos-worker"

#: Largest body the workers accept in the harness, bytes (oversized poison is one more).
MAX_BODY_BYTES = 4096

#: Fault kinds and their weights.
FAULTS: dict[str, int] = {
    **{f"kill@{p}": 2 for p in CRASH_POINTS},
    "kill_anytime": 2,
    "stop@before_commit": 2,
    "stop@holding_turn": 1,
    "stop_anytime": 2,
    "client_kill": 2,
    "proxy_cut": 1,
    "drop_reply:commit": 2,
    "drop_reply:dequeue": 2,
    "drop_reply:take_over": 1,
    "drop_reply:xadd": 2,
    "cut_request:commit": 1,
    "cut_request:dequeue": 1,
    "cut_request:xadd": 1,
    "redis_restart": 1,
    "foreign:queue": 2,
    "foreign:reply": 2,
    "foreign:dedup": 2,
    "foreign:fifo": 2,
    "foreign:turn": 2,
    "corrupt:subscription": 1,
    "corrupt:link": 1,
    "consumer_kill": 2,
    "consumer_stop": 2,
    **GROUP_FAULTS,
}

#: ``--federation``: the queue managers' roles (names are chosen so each lives on a master of its own).
FED_ROLES = ("ROOT", "EAST", "WEST")

#: ``--federation``: the publish/subscribe cluster of EAST and WEST, and its cluster topic (defined at EAST).
FED_CLUSTER = "FEDCL"
FED_CLUSTER_TOPIC = "clu"

#: ``--federation``: topics by kind; each publisher publishes on one kind (hierarchy topics go from
#: EAST to WEST through ROOT, cluster topics straight: order is promised per path).
FED_TOPICS = {"hier": ("hier/a/x", "hier/b/x", "hier/c"), "clu": ("clu/a", "clu/b/x", "clu/c")}

#: ``--federation``: the subscriptions of every queue manager (name -> filter).
FED_FILTERS = {"all": "#", "hier": "hier/#", "plus": "+/b/x", "clu": "clu/a"}

#: Crash points of a channel mover (``broker.network.mover.Mover.move_once``).
CHANNEL_POINTS = ("before_channel_in", "after_channel_in")

#: ``--federation``: fault kinds and their weights. ``proxy_cut``, ``drop_reply:channel_in`` and
#: ``cut_request:channel_in`` hit the connections of every channel into one queue manager;
#: ``node_restart`` is a SIGKILL and restart of one queue manager's master (at most every 8 s).
FED_FAULTS: dict[str, int] = {
    **{f"kill@{p}": 3 for p in CHANNEL_POINTS},
    "kill_channel_anytime": 1,
    **{f"kill@{p}": 1 for p in CRASH_POINTS},
    "node_restart": 1,
    "proxy_cut": 2,
    "drop_reply:channel_in": 2,
    "cut_request:channel_in": 1,
    "consumer_kill": 1,
}

#: Fault kinds implemented but left out of the default weights (``--weight KIND=N`` turns one on).
#: ``killer_entry``: an ordinary publisher writes, among its publications, an entry every worker
#: dies on (SIGKILL as it handles it, ``scripts.rig.hook.KILLER_FIELD``): it must be dead-lettered
#: after ``max_deliveries`` ("max_deliveries" in its reason), and no healthy publication held with
#: it may be (``good_dead_lettered``). Each costs up to ``max_deliveries`` worker deaths.
OPTIONAL_FAULTS: tuple[str, ...] = ("killer_entry",)

#: Plant a foreign key: KEYS[1] the key, KEYS[2..] keys that must not exist either (nor KEYS[1]);
#: ARGV[1] the type to plant ("string" | "hash" | "list"), ARGV[2] the token it holds. Returns 1 if planted.
PLANT_LUA = """
for i = 1, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 1 then return 0 end
end
if ARGV[1] == 'string' then redis.call('SET', KEYS[1], ARGV[2], 'NX')
elseif ARGV[1] == 'hash' then redis.call('HSETNX', KEYS[1], 'chaos', ARGV[2])
else redis.call('RPUSH', KEYS[1], ARGV[2]) end
return 1
"""

#: Does KEYS[1] hold exactly the planted token (ARGV[1] type, ARGV[2] token)? With ARGV[3] "del", remove it then.
PROBE_LUA = """
local t = redis.call('TYPE', KEYS[1])['ok']
if t ~= ARGV[1] then return 0 end
local v
if t == 'string' then v = redis.call('GET', KEYS[1])
elseif t == 'hash' then
  if redis.call('HLEN', KEYS[1]) ~= 1 then return 0 end
  v = redis.call('HGET', KEYS[1], 'chaos')
else
  if redis.call('LLEN', KEYS[1]) ~= 1 then return 0 end
  v = redis.call('LINDEX', KEYS[1], 0)
end
if v ~= ARGV[2] then return 0 end
if ARGV[3] == 'del' then redis.call('DEL', KEYS[1]) end
return 1
"""

#: A corrupt record: KEYS[1] {qm}:subs or {qm}:links, KEYS[2] {qm}:version; ARGV[1] field, ARGV[2] value,
#: ARGV[3] "add" (only a new field) | "remove" | "probe" (only the planted value). Returns 1 if done/there.
RECORD_LUA = """
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if ARGV[3] == 'add' then
  if cur then return 0 end
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
  redis.call('INCR', KEYS[2])
  return 1
end
if cur ~= ARGV[2] then return 0 end
if ARGV[3] == 'remove' then
  redis.call('HDEL', KEYS[1], ARGV[1])
  redis.call('INCR', KEYS[2])
end
return 1
"""

#: Poison kinds: (weight, fragment the dead-letter reason must contain).
POISON: dict[str, tuple[int, str]] = {
    "missing_topic": (1, "topic"),
    "invalid_utf8": (1, "UTF-8"),
    "oversized_body": (1, "larger than"),
    "invalid_topic": (1, ""),
    "missing_publisher": (1, "publisher"),
}


class HarnessTimeout(Exception):
    """The harness ran past its own time bound."""


def _log(text: str) -> None:
    print(text, flush=True)


@dataclass
class Slot:
    """One supervised worker (or channel) process: slot ``index`` of ``pool`` (None: the harness's pool)."""

    index: int
    pool: Pool | None = None
    kind: str = "worker"
    qm: str = QM
    armed: str | None = None
    armed_at: float = 0.0
    stopped_until: float | None = None
    restarts: int = 0


@dataclass
class Stats:
    """Counters and maxima the harness reports."""

    faults: Counter[str] = field(default_factory=Counter)
    poison: Counter[str] = field(default_factory=Counter)
    anomalies: list[str] = field(default_factory=list)
    max_stream_len: int = 0
    max_used_memory: int = 0
    max_pending: int = 0
    trimmed: int = 0
    aof_fixes: int = 0
    worker_restarts: int = 0
    expired_arms: int = 0
    max_times_delivered: int = 0
    planted: Counter[str] = field(default_factory=Counter)
    plant_skipped: Counter[str] = field(default_factory=Counter)
    removed: int = 0
    wrongtype_waits: int = 0
    refused_reply_missing: int = 0
    killer_deaths: int = 0
    #: publications of the delayed publisher (``_delayed_publisher``), and receipts before their delivery time
    delayed: int = 0
    early: int = 0


@dataclass
class Plant:
    """One foreign key (or corrupt record) the harness planted, to be removed.

    Attributes:
        kind: the fault kind.
        key: the key planted (corrupt records: the hash holding the record).
        rtype: the Redis type planted ("string", "hash", "list"), or "record".
        token: the value it holds (corrupt records: the record's value).
        remove_at: ``time.monotonic()`` after which it is removed.
        field: the hash field of a corrupt record.
        pub: reply/dedup: the publication it was planted for (removed once its entry is handled).
        published: the publication's publish attempts are over.
        certain: it is known to have been planted (not an unknown outcome).
    """

    kind: str
    key: str
    rtype: str
    token: str
    remove_at: float
    field: str | None = None
    pub: Publication | None = None
    published: bool = False
    certain: bool = True


class Harness:
    """One chaos run. See the module docstring."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.stats = Stats()
        self.history = History()
        self.workdir = Path(tempfile.mkdtemp(prefix=f"broker-chaos-{args.seed}-"))
        self.control = self.workdir / "control"
        self.control.mkdir()
        self.server = Server(port=free_port(), data_dir=self.workdir / "data", args=AOF_ARGS)
        self.proxy: ProxyProcess | None = None
        self.admin: redis.Redis | None = None
        self.slots = [Slot(i) for i in range(args.workers)]
        self.settings: Settings | None = None
        self.sub_ids: dict[str, str] = {}
        self.threads: list[threading.Thread] = []
        self.stop_publishing = threading.Event()
        self.stop_consuming = threading.Event()
        self.stop_maintenance = threading.Event()
        self.publish_deadline = float("inf")
        self.server_lock = threading.Lock()
        self.last_restart = 0.0
        self.pool: Pool | None = None
        #: the grouped publications and the shared subscription's consumers (scripts.rig.groups)
        self.groups: GroupWorkload | None = None
        self._faults_log = (self.workdir / "faults.log").open("a")
        self._faults_lock = threading.Lock()
        self.weights = {**FAULTS, **args.weight}
        self.plants: list[Plant] = []
        self.consumer_faults: dict[str, str] = {}
        self.plant_lock = threading.Lock()
        self.plant_seq = 0
        self.planted_keys: set[str] = set()
        self.plant_requests: dict[str, queue.Queue[str]] = {p: queue.Queue() for p in VICTIM_PUBLISHERS}
        #: killer entries asked of the ordinary publishers (``killer_entry``), taken by the first to look
        self.killer_requests: queue.Queue[str] = queue.Queue()
        self._started = time.monotonic()
        self.failed = False
        #: the retained publisher's results and the late subscriptions' receipts (``scripts.rig.retained``)
        self.retained = RetainedLog(RETAINED_PUBLISHER)

    # -- set-up ---------------------------------------------------------------

    def setup(self) -> None:
        self.server.start()
        self.admin = connect(self.server.url)
        self._plant_script = self.admin.register_script(PLANT_LUA)
        self._probe_script = self.admin.register_script(PROBE_LUA)
        self._record_script = self.admin.register_script(RECORD_LUA)
        self.proxy = ProxyProcess(self.server.port, count=2).start()
        args = self.args
        self.settings = self._settings(self.proxy.url(0, client_name=WORKER_CLIENT_NAME))
        for name, flt in FILTERS.items():
            self.sub_ids[name] = subscribe(self.admin, QM, flt, "chaos", name).sub_id
        for source, target in LINKS:
            link(self.admin, QM, source, target)
        grouped = subscribe(self.admin, QM, GROUP_FILTER, "chaos")
        # a lease long enough that a stalled heartbeat thread rarely makes a zombie (features.py)
        lease_ms = max(args.consumer_lease_ms, GROUP_LEASE_MS)
        group_settings = self.settings.model_copy(update={"consumer_lease_ms": lease_ms})
        self.groups = GroupWorkload(grouped, group_settings, self.stop_consuming, self._fault)
        self.pool = Pool(
            self.settings,
            run_worker,
            (str(self.control), str(self.workdir / "workers.log")),
            name="chaos-worker",
            on_exit=self._exit_handler(self.slots),
            max_restarts_per_minute=None,  # the harness kills workers on purpose
            daemon=True,
        )
        self.pool.start()
        _log(
            f"chaos: code={_code_version()} seed={args.seed} duration={args.duration_s}s workers={args.workers} "
            f"publishers={args.publishers} rate={args.rate}/s lease_ms={args.lease_ms} "
            f"server={self.server.binary} port={self.server.port} workdir={self.workdir}"
        )

    def _settings(self, url: str, qm: str = QM, **extra: Any) -> Settings:
        """The settings of the workers (and channel processes) of ``qm`` on ``url``."""
        args = self.args
        return Settings(
            redis_url=url,
            qm=qm,
            concurrency=args.workers,
            batch_size=50,
            heads=50,
            lease_ms=args.lease_ms,
            block_ms=200,
            sweep_interval_ms=100,
            dedup_window_ms=600_000,
            max_body_bytes=MAX_BODY_BYTES,
            stop_grace_ms=2_000,
            max_deliveries=args.max_deliveries,
            consumer_lease_ms=args.consumer_lease_ms,
            max_redeliveries=1_000_000,  # a consumer killed again and again must not dead-letter good messages
            **extra,
        )

    def _process(self, slot: Slot) -> multiprocessing.process.BaseProcess | None:
        """The worker process of ``slot`` now (the pool replaces it when it dies)."""
        pool = slot.pool or self.pool
        return pool.child(slot.index) if pool is not None else None

    def _pools(self) -> list[Pool]:
        """Every pool of supervised processes."""
        return [self.pool] if self.pool is not None else []

    # -- traffic ----------------------------------------------------------------

    def _publisher(self, index: int) -> None:
        assert self.proxy is not None
        rng = random.Random(self.args.seed * 1_000 + index)
        client = connect(self.proxy.url(1))
        name = f"p{index}"
        publisher = Publisher(client, QM, name)
        interval = self.args.publishers / self.args.rate
        resolved = self._resolved()
        number = 0
        next_at = time.monotonic()
        while not self.stop_publishing.is_set():
            if rng.random() < self.args.poison_rate:
                self._poison(client, name, rng)
            with contextlib.suppress(queue.Empty):
                self._poison(client, name, rng, kind=self.killer_requests.get_nowait())
            number += 1
            victim = rng.random() < self.args.victim_share
            topic = rng.choice(VICTIM_TOPICS if victim else TOPICS)
            pub = Publication(name, number, f"{name}.{number}", topic, resolved[topic], refusable=victim)
            self.history.add_publication(pub)
            self._publish(publisher, pub)
            next_at = _pace(next_at, interval)
        client.close()

    def _delayed_publisher(self) -> None:
        """Publisher ``d0``: every publication with a delivery delay, its delivery time the next
        quarter second but one (so that many share one, and they never go back: the order promised
        among equal delivery times is the publication order, checked as every publisher's)."""
        assert self.proxy is not None
        rng = random.Random(self.args.seed * 1_000 + 999)
        client = connect(self.proxy.url(1))
        publisher = Publisher(client, QM, "d0")
        interval = self.args.publishers / self.args.rate
        resolved = self._resolved()
        number = 0
        next_at = time.monotonic()
        while not self.stop_publishing.is_set():
            number += 1
            topic = rng.choice(TOPICS)
            pub = Publication("d0", number, f"d0.{number}", topic, resolved[topic])
            self.history.add_publication(pub)
            now = now_ms()
            self._publish(publisher, pub, timestamp_ms=now, delivery_delay_ms=(now // 250 + 2) * 250 - now)
            self.stats.delayed += 1
            next_at = _pace(next_at, interval)
        client.close()

    def _publish(self, publisher: Publisher, pub: Publication, **options: Any) -> None:
        """Publish ``pub`` (body ``<publisher>:<number>``; ``options`` for ``Publisher.publish``),
        retrying with its msgid until acknowledged or past ``publish_deadline`` (then its outcome
        is unknown: delivered 0 or 1 times)."""
        while True:
            pub.attempts += 1
            try:
                result = publisher.publish(
                    pub.topic, f"{pub.publisher}:{pub.number}".encode(), msgid=pub.msgid, **options
                )
            except (BrokerError, redis.RedisError):
                if time.monotonic() > self.publish_deadline:
                    return
                time.sleep(0.1)
                continue
            pub.entry_id, pub.acked, pub.acked_at = result.entry_id, True, time.monotonic()
            return

    def _resolved(self) -> dict[str, frozenset[str]]:
        """Topic -> the subscription ids a publication on it must reach."""
        filters = {self.sub_ids[n]: f for n, f in FILTERS.items()}
        return {
            t: recipients(t, filters, LINKS)
            for t in (*TOPICS, *VICTIM_TOPICS, *RETAINED_TOPICS, *GROUP_TOPICS)
        }

    def _victim_publisher(self, index: int) -> None:
        """A victim publisher: raw XADDs with ``reply=1`` whose keys are made foreign now and then.

        Before a publication, it takes a plant request ("foreign:reply" or
        "foreign:dedup") left by ``inject`` and plants that key for the
        publication's msgid; that publication must then end refused. Every
        publication of a victim publisher is refusable (its FIFO or turn key
        may be foreign when it is read).
        """
        assert self.proxy is not None
        rng = random.Random(self.args.seed * 1_000 + 500 + index)
        name = VICTIM_PUBLISHERS[index]
        client = connect(self.proxy.url(1))
        direct = connect(self.server.url)
        resolved = self._resolved()
        topics = (*TOPICS, *VICTIM_TOPICS)
        interval = len(VICTIM_PUBLISHERS) / self.args.victim_rate
        number = 0
        next_at = time.monotonic()
        while not self.stop_publishing.is_set():
            number += 1
            topic = rng.choice(topics)
            pub = Publication(name, number, f"{name}.{number}", topic, resolved[topic], refusable=True)
            plant = None
            with contextlib.suppress(queue.Empty):
                kind = self.plant_requests[name].get_nowait()
                key, rtype = (
                    (keys.reply(QM, name, pub.msgid), "hash")
                    if kind == "foreign:reply"
                    else (keys.dedup(QM, name, pub.msgid), "list")
                )
                plant = self._plant(direct, kind, key, rtype, hold_s=rng.uniform(0.2, 1.0), pub=pub)
                if plant is not None and plant.certain:
                    pub.planted = kind
            self.history.add_publication(pub)
            fields = publication_fields(
                name, topic, f"{name}:{number}".encode(), msgid=pub.msgid, seq=number, reply=True
            )
            while True:
                pub.attempts += 1
                try:
                    pub.entry_id = client.xadd(keys.publish_stream(QM), fields).decode()
                except redis.RedisError:
                    if time.monotonic() > self.publish_deadline:
                        break  # outcome unknown
                    time.sleep(0.1)
                    continue
                pub.acked, pub.acked_at = True, time.monotonic()
                break
            if plant is not None:
                plant.published = True
            next_at = _pace(next_at, interval)
        client.close()
        direct.close()

    def _poison(
        self, client: redis.Redis, publisher: str, rng: random.Random, kind: str | None = None
    ) -> None:
        """Write a poison entry of ``kind`` (default: one of ``POISON`` at random) in ``publisher``'s order."""
        kind = kind or rng.choices(list(POISON), weights=[w for w, _ in POISON.values()])[0]
        marker = f"{publisher}.poison.{rng.getrandbits(48):x}"
        fields: dict[str, Any] = {
            "publisher": publisher,
            "topic": "/chaos/a/x",
            "body": b"poison",
            "chaos.poison": marker,
        }
        if kind == "missing_topic":
            del fields["topic"]
        elif kind == "invalid_utf8":
            fields[rng.choice(["topic", "correlation_id", "props"])] = b"\xff\xfe/bad"
        elif kind == "oversized_body":
            fields["body"] = b"x" * (MAX_BODY_BYTES + 1)
        elif kind == "invalid_topic":
            fields["topic"] = "a/#"
        elif kind == "missing_publisher":
            del fields["publisher"]
        elif kind == "killer_entry":  # a valid publication every worker dies on (scripts.rig.hook)
            fields[KILLER_FIELD] = "1"
            self._fault(kind, f"publisher {publisher}: {marker}")
        poison = Poison(kind, marker, POISON[kind][1] if kind in POISON else "max_deliveries")
        self.history.add_poison(poison)
        self.stats.poison[kind] += 1
        while True:
            try:
                poison.entry_id = client.xadd(keys.publish_stream(QM), fields).decode()
                poison.acked = True
                return
            except redis.RedisError:
                if time.monotonic() > self.publish_deadline:
                    return
                time.sleep(0.1)

    def _subscriber(self, sub_id: str, qm: str = QM, url: str | None = None) -> None:
        """Consume one subscription with ``receive_many``/``ack_many``; every receipt recorded with its flag.

        The client does not retry: on a connection error the consumer is
        abandoned (what it took but never saw stays in its in-flight list until
        its lease lapses, then is given back and redelivered, flagged) and a new
        one attaches, which waits for the old one's lease (the subscription is
        exclusive). Consumer faults: ``consumer_kill`` abandons the consumer at
        once (a SIGKILL: its batch is in flight, recorded, not acknowledged);
        ``consumer_stop`` stalls it for 1.5-3 consumer leases, then it goes on as
        a zombie whose in-flight messages were given back meanwhile.

        ``qm`` is the subscription's queue manager and ``url`` its server (default the harness's).
        """
        client = redis.Redis.from_url(
            url or self.server.url, retry=Retry(NoBackoff(), 0), socket_connect_timeout=1, socket_timeout=5
        )
        assert self.settings is not None
        record = next(r for r in _subscriptions(client, qm) if r.sub_id == sub_id)
        subscriber: Subscriber | None = None
        idle_rounds = 0
        while True:
            try:
                if subscriber is None:
                    subscriber = Subscriber(client, qm, record, self.settings, heartbeat=False)
                fault = self.consumer_faults.pop(sub_id, None)
                got = subscriber.receive_many(10, timeout_ms=200)
                received_ms = now_ms()
                late = sub_id in self.retained.made
                for delivery in got:
                    message = delivery.message
                    if late:  # a subscription made during the run: the retained check only
                        self.retained.receive(sub_id, message, delivery.redelivered)
                    else:
                        self.history.receive(sub_id, message.msgid, message.entry_id, delivery.redelivered)
                    if received_ms < message.delivery_time_ms:
                        self.stats.early += 1
                        self.stats.anomalies.append(
                            f"subscriber {sub_id}: {message.msgid} received at {received_ms}, before its "
                            f"delivery time {message.delivery_time_ms}"
                        )
                if fault == "consumer_kill":
                    subscriber.abandon()  # dies with its batch recorded and unacknowledged
                    subscriber = None
                    self._fault(fault, f"consumer of {sub_id} with {len(got)} in flight")
                    continue
                if fault == "consumer_stop":
                    self._fault(fault, f"consumer of {sub_id} with {len(got)} in flight")
                    stall = self.settings.consumer_lease_ms / 1000 * self.rng.uniform(1.5, 3.0)
                    self.stop_consuming.wait(stall)  # its lease lapses; the sweep gives its batch back
                if not got:
                    idle_rounds += 1
                    if self.stop_consuming.is_set() and idle_rounds > 2:
                        break
                    continue
                idle_rounds = 0
                subscriber.ack_many(got)
            except ConsumerConflict:
                # the consumer before this one (abandoned) holds the subscription until its lease lapses
                if subscriber is not None:
                    subscriber.abandon()
                subscriber = None
                time.sleep(0.05)
            except (redis.RedisError, ConnectionLost, ServerError, ForeignKey) as exc:
                # The library translates redis-py's errors (ConnectionLost, ServerError, ForeignKey
                # for a key of another type); the harness's own raw calls raise redis-py's.
                text = str(exc)
                if ("WRONGTYPE" in text or "foreign key" in text) and not isinstance(
                    exc, (redis.ConnectionError, ConnectionLost)
                ):
                    # a foreign key planted at this queue: take nothing, wait until it is gone
                    self.stats.wrongtype_waits += 1
                    if sub_id != self.sub_ids.get("victim"):
                        self.stats.anomalies.append(f"subscriber {sub_id}: {exc}")
                if subscriber is not None:
                    subscriber.abandon()
                subscriber = None
                if self.stop_consuming.is_set() and time.monotonic() > self.publish_deadline + 60:
                    break
                time.sleep(0.1)
            except BrokerError as exc:  # e.g. a malformed envelope (dead-lettered as it was read): count it
                self.stats.anomalies.append(f"subscriber {sub_id}: {exc}")
                if subscriber is not None:
                    subscriber.abandon()
                subscriber = None
        if subscriber is not None:
            with contextlib.suppress(BrokerError, redis.RedisError):
                subscriber.close()
        client.close()

    def _maintenance(self, qm: str = QM, url: str | None = None) -> None:
        """Trim acknowledged entries and watch the stream length and memory of ``qm`` (on the server
        at ``url``, default the harness's), once a second."""
        client = connect(url or self.server.url)
        stream = keys.publish_stream(qm)
        while not self.stop_maintenance.wait(1.0):
            try:
                self.stats.trimmed += trim_acknowledged(client, qm)
                xlen = int(client.xlen(stream))
                used = int(client.info("memory")["used_memory"])
                pending = int(client.xpending(stream, keys.WORKER_GROUP)["pending"])
                oldest = client.xpending_range(stream, keys.WORKER_GROUP, "-", "+", 200)
            except (redis.RedisError, BrokerError):  # trim_acknowledged translates redis-py's errors
                continue
            if oldest:
                self.stats.max_times_delivered = max(
                    self.stats.max_times_delivered, max(int(e["times_delivered"]) for e in oldest)
                )
            self.stats.max_stream_len = max(self.stats.max_stream_len, xlen)
            self.stats.max_used_memory = max(self.stats.max_used_memory, used)
            self.stats.max_pending = max(self.stats.max_pending, pending)
        client.close()

    # -- supervision --------------------------------------------------------------

    def _exit_handler(self, slots: list[Slot]) -> ExitHandler:
        """The ``on_exit`` of a pool whose slots are ``slots``."""

        def on_exit(index: int, proc: multiprocessing.process.BaseProcess) -> None:
            """The pool found process ``index`` dead: count how it died, then the pool restarts it."""
            slot = slots[index]
            pid, code = proc.pid, proc.exitcode
            what = f"{slot.kind} {slot.qm}/{index}" if slot.pool is not None else f"worker {index}"
            died = self.control / f"{pid}.kill"
            if died.exists():
                point = died.read_text()
                if point == KILLER_FIELD:  # it handled a killer entry (counted once, when written)
                    self.stats.killer_deaths += 1
                    self._fault("killer_entry", f"{what} pid {pid} died on a killer entry", count=False)
                else:
                    self._fault(f"kill@{point}", f"{what} pid {pid} killed itself at {point}")
            elif code != -signal.SIGKILL and not self._exit_expected(slot):
                self.stats.anomalies.append(f"{what} pid {pid} exited with {code}")
                _log(f"!! {what} pid {pid} exited on its own with code {code}")
            for path in self.control.glob(f"{pid}.*"):  # pids are reused
                path.unlink(missing_ok=True)
            slot.restarts += 1
            slot.armed, slot.stopped_until = None, None
            self.stats.worker_restarts += 1

        return on_exit

    def _exit_expected(self, slot: Slot) -> bool:
        """Whether a process of ``slot`` may exit on its own now (never, here)."""
        return False

    def supervise(self) -> None:
        for pool in self._pools():
            pool.supervise_once()
        now = time.monotonic()
        for slot in self.slots:
            proc = self._process(slot)
            if proc is None or not proc.is_alive():
                continue
            pid = proc.pid
            assert pid is not None
            stopped = self.control / f"{pid}.stop"
            if stopped.exists():
                point = stopped.read_text()
                stopped.unlink()  # a worker may stop itself again later
                self._fault(f"stop@{point}", f"worker {slot.index} pid {pid} stopped itself at {point}")
                slot.armed = None
                slot.stopped_until = now + self.args.lease_ms / 1000 * self.rng.uniform(1.5, 3.0)
            elif slot.stopped_until is None and _process_state(pid) == "T":
                self.stats.anomalies.append(
                    f"worker {slot.index} pid {pid} was stopped without the harness knowing"
                )
                _log(f"!! worker {slot.index} pid {pid} is stopped and nobody knows why; continuing it")
                slot.stopped_until = now
            if slot.stopped_until is not None and now >= slot.stopped_until:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
                slot.stopped_until = None
            if slot.armed and now - slot.armed_at > 15:
                self._arm(slot, None)
                self.stats.expired_arms += 1

    def _ready(self, slot: Slot) -> bool:
        proc = self._process(slot)
        return (
            proc is not None
            and proc.is_alive()
            and slot.stopped_until is None
            and (self.control / f"{proc.pid}.ready").exists()
        )

    def _signal_anytime(self, kind: str, ready: list[Slot]) -> None:
        """SIGKILL (``kill...``) or SIGSTOP (``stop...``) one of ``ready`` at whatever it is doing."""
        if not ready:
            return
        slot = self.rng.choice(ready)
        proc = self._process(slot)
        assert proc is not None and proc.pid is not None
        if kind.startswith("kill"):
            os.kill(proc.pid, signal.SIGKILL)
            proc.join(5)
        else:
            os.kill(proc.pid, signal.SIGSTOP)
            slot.stopped_until = time.monotonic() + self.args.lease_ms / 1000 * self.rng.uniform(1.5, 3.0)
        self._fault(kind, f"{slot.kind} {slot.qm}/{slot.index} pid {proc.pid}")

    def _arm_point(self, kind: str, ready: list[Slot]) -> None:
        """Arm one of ``ready`` to die (``kill@<point>``) or stall (``stop@<point>``) at a crash point."""
        if not ready:
            return
        slot = self.rng.choice(ready)
        action, point = kind.split("@")
        self._arm(slot, {"point": point, "action": action, "after": self.rng.randint(1, 3)})

    def _arm(self, slot: Slot, plan: dict[str, Any] | None) -> None:
        proc = self._process(slot)
        assert proc is not None and proc.pid is not None
        (self.control / f"{proc.pid}.plan").write_text(json.dumps(plan) if plan else "")
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGUSR1)
        slot.armed = plan["point"] if plan else None
        slot.armed_at = time.monotonic()

    # -- faults ---------------------------------------------------------------------

    def _fault(self, kind: str, detail: str, count: bool = True) -> None:
        with self._faults_lock:
            if count:
                self.stats.faults[kind] += 1
            self._faults_log.write(f"{time.monotonic() - self._started:9.3f} {kind}: {detail}\n")
            self._faults_log.flush()

    # -- foreign keys and corrupt records ---------------------------------------------

    def _call_plant(self, client: redis.Redis, plant: Plant, action: str, guard: tuple[str, ...] = ()) -> int:
        """Plant ("add"), look for ("probe") or remove ("remove") ``plant``; 1 when done / there."""
        if plant.rtype == "record":
            return int(
                self._record_script(
                    keys=[plant.key, keys.version(QM)], args=[plant.field, plant.token, action], client=client
                )
            )
        if action == "add":
            return int(
                self._plant_script(keys=[plant.key, *guard], args=[plant.rtype, plant.token], client=client)
            )
        return int(
            self._probe_script(
                keys=[plant.key],
                args=[plant.rtype, plant.token, "del" if action == "remove" else ""],
                client=client,
            )
        )

    def _plant(
        self,
        client: redis.Redis,
        kind: str,
        key: str,
        rtype: str,
        hold_s: float,
        guard: tuple[str, ...] = (),
        field_name: str | None = None,
        pub: Publication | None = None,
    ) -> Plant | None:
        """Plant a foreign key (or a corrupt record) where nothing is; None when something was there.

        The call may be applied and its reply lost (a server restart): then the
        key is probed for the token. A plant whose outcome stays unknown is kept
        for removal but not ``certain``.
        """
        with self.plant_lock:
            self.plant_seq += 1
            seq = self.plant_seq
        token = f"not json {seq}" if rtype == "record" else f"chaos-foreign-{seq}"
        plant = Plant(kind, key, rtype, token, time.monotonic() + hold_s, field=field_name, pub=pub)
        try:
            done = self._call_plant(client, plant, "add", guard)
        except redis.RedisError:
            done = -1
        if done != 1:
            deadline = time.monotonic() + 20
            while True:  # a retried call may have planted it after all
                try:
                    done = self._call_plant(client, plant, "probe")
                    break
                except redis.RedisError:
                    if time.monotonic() > deadline:
                        plant.certain = False
                        break
                    time.sleep(0.2)
        if done == 0 and plant.certain:
            self.stats.plant_skipped[kind] += 1
            self._fault(kind, f"skipped: {key} {field_name or ''} exists", count=False)
            return None
        plant.remove_at = time.monotonic() + hold_s
        with self.plant_lock:
            self.plants.append(plant)
            self.planted_keys.add(key)
        self.stats.planted[kind] += 1
        what = f" for {pub.msgid}" if pub is not None else ""
        self._fault(
            kind,
            f"planted {rtype} {key} {field_name or ''}{what} token={token!r}"
            f"{'' if plant.certain else ' (outcome unknown)'}",
        )
        return plant

    def _entry_handled(self, entry_id: str) -> bool:
        """The workers have read ``entry_id`` and it is no longer pending."""
        assert self.admin is not None
        stream = keys.publish_stream(QM)
        if _id(group_state(self.admin, QM).last_delivered_id) < _id(entry_id):
            return False
        return not self.admin.xpending_range(stream, keys.WORKER_GROUP, entry_id, entry_id, 1)

    def _unplant_due(self, now_too: bool = False) -> None:
        """Remove the plants whose time has come (``now_too``: all that may go), if they still hold their token."""
        assert self.admin is not None
        now = time.monotonic()
        with self.plant_lock:
            plants = list(self.plants)
        for plant in plants:
            if now < plant.remove_at and not now_too:
                continue
            pub = plant.pub
            try:
                if pub is not None:
                    if not plant.published:
                        continue
                    if pub.acked and pub.entry_id is not None and not self._entry_handled(pub.entry_id):
                        continue
                    if plant.kind == "foreign:dedup" and pub.acked and plant.certain:
                        self._check_refused_reply(pub)
                removed = self._call_plant(self.admin, plant, "remove")
            except redis.RedisError:
                continue  # the next round tries again; a remove applied twice finds nothing the second time
            with self.plant_lock:
                self.plants.remove(plant)
            self.stats.removed += 1
            self._fault(
                plant.kind,
                f"removed {plant.key} {plant.field or ''} token={plant.token!r}"
                f"{'' if removed else ' (already gone)'}",
                count=False,
            )

    def _check_refused_reply(self, pub: Publication) -> None:
        """A publication refused for its foreign dedup record posts one "refused" result per entry."""
        assert self.admin is not None
        replies = [json.loads(r) for r in self.admin.lrange(keys.reply(QM, pub.publisher, pub.msgid), 0, -1)]
        if not replies or any(
            r.get("status") != "refused" or "foreign key" not in r.get("reason", "") for r in replies
        ):
            self.stats.refused_reply_missing += 1
            self._fault(
                "foreign:dedup", f"!! results for {pub.msgid} (entry {pub.entry_id}): {replies}", count=False
            )

    def _inject_foreign(self, kind: str) -> None:
        assert self.admin is not None
        hold_s = self.rng.uniform(0.2, 2.0)
        if kind == "foreign:queue":
            self._plant(self.admin, kind, keys.sub_queue(QM, self.sub_ids["victim"]), "string", hold_s)
        elif kind in ("foreign:fifo", "foreign:turn"):
            name = self.rng.choice(VICTIM_PUBLISHERS)
            fifo, turn = keys.fifo_key(QM, name), keys.turn_key(QM, name)
            if kind == "foreign:fifo":
                self._plant(self.admin, kind, fifo, "string", hold_s, guard=(turn,))
            else:
                self._plant(self.admin, kind, turn, "hash", hold_s, guard=(fifo,))
        elif kind in ("foreign:reply", "foreign:dedup"):
            self.plant_requests[self.rng.choice(VICTIM_PUBLISHERS)].put(kind)  # planted by that publisher
        elif kind == "corrupt:subscription":
            self._plant(
                self.admin,
                kind,
                keys.subscriptions(QM),
                "record",
                hold_s,
                field_name=f"chaos$corrupt{self.plant_seq + 1}",
            )
        elif kind == "corrupt:link":
            self._plant(
                self.admin,
                kind,
                keys.links(QM),
                "record",
                hold_s,
                field_name=f"/chaos-corrupt/{self.plant_seq + 1}",
            )

    def inject(self) -> None:
        kinds = list(self.weights)
        kind = self.rng.choices(kinds, weights=[self.weights[k] for k in kinds])[0]
        assert self.proxy is not None and self.admin is not None
        ready = [s for s in self.slots if self._ready(s) and not s.armed]
        if kind.startswith(("kill@", "stop@")):
            self._arm_point(kind, ready)  # counted when it happens (supervise)
        elif kind in ("kill_anytime", "stop_anytime"):
            self._signal_anytime(kind, ready)
        elif kind == "client_kill":
            try:
                victims = [c for c in self.admin.client_list() if c.get("name") == WORKER_CLIENT_NAME]
                if not victims:
                    return
                chosen = self.rng.sample(victims, self.rng.randint(1, len(victims)))
                for c in chosen:
                    self.admin.client_kill_filter(_id=c["id"])
            except redis.RedisError:
                return
            self._fault(kind, f"{len(chosen)} of {len(victims)} worker connections")
        elif kind == "proxy_cut":
            cut = self.proxy.call(0, "cut_all")
            self._fault(kind, f"{cut} worker connections")
        elif kind.startswith(("drop_reply:", "cut_request:")):
            method, what = kind.split(":")
            if what == "xadd":
                self.proxy.call(1, method, b"$4\r\nXADD\r\n", 1, kind)
            else:
                self.proxy.call(0, method, call_of(what), 1, kind)
            # counted from the proxy's stats at the end: only those that happened
        elif kind.startswith(("foreign:", "corrupt:")):
            try:
                self._inject_foreign(kind)
            except redis.RedisError as exc:
                _log(f"   {kind} not injected: {exc}")
        elif kind in ("consumer_kill", "consumer_stop"):
            # taken by the subscription's consumer thread on its next round (counted then)
            self.consumer_faults[self.rng.choice(sorted(self.sub_ids.values()))] = kind
        elif kind in GROUP_FAULTS:
            if self.groups is not None:  # taken by the next group consumer that receives (counted then)
                self.groups.request(kind)
        elif kind == "killer_entry":
            self.killer_requests.put(kind)  # written by the next ordinary publisher to look (counted then)
        elif kind == "redis_restart":
            if time.monotonic() - self.last_restart < 8:
                return
            self.restart_server()
            self._fault(kind, f"port {self.server.port}")

    def restart_server(self) -> None:
        with self.server_lock:
            self.server.kill()
            time.sleep(self.rng.uniform(0.1, 1.0))
            try:
                self.server.start(timeout_ms=60_000)
            except ServerNotFound as exc:
                _log(f"!! server did not restart ({str(exc)[-300:]}); repairing the AOF")
                self._fix_aof()
                self.server.start(timeout_ms=60_000)
            self.last_restart = time.monotonic()

    def _fix_aof(self) -> None:
        """``<server>-check-aof --fix`` on the AOF manifest (the binary acts as the checker by its name)."""
        self.stats.aof_fixes += 1
        binary = Path(server_binary())
        checker = self.workdir / ("redis-check-aof" if "redis" in binary.name else "valkey-check-aof")
        if not checker.exists():
            checker.symlink_to(binary)
        manifest = next((self.workdir / "data").rglob("*.manifest"), None)
        target = manifest or (self.workdir / "data" / "appendonly.aof")
        out = subprocess.run(
            [str(checker), "--fix", str(target)], input=b"y\n", capture_output=True, timeout=60
        )
        _log(f"   check-aof: {out.stdout.decode(errors='replace')[-300:]}")

    # -- the run ---------------------------------------------------------------------

    def run(self) -> int:
        args = self.args
        self.setup()
        assert self.admin is not None and self.proxy is not None
        self.threads = self._traffic()
        maintenance = self._maintenance_threads()
        for thread in [*self.threads, *maintenance]:
            thread.start()

        end = time.monotonic() + args.duration_s
        next_fault = time.monotonic() + 2.0
        next_progress = time.monotonic() + 5.0
        while time.monotonic() < end:
            self.supervise()
            self._unplant_due()
            now = time.monotonic()
            if now >= next_fault:
                self.inject()
                mean = args.fault_interval_ms / 1000
                next_fault = time.monotonic() + self.rng.uniform(0.5 * mean, 1.5 * mean)
            if now >= next_progress:
                self.progress("faults")
                next_progress = now + 5.0
            time.sleep(0.05)

        drained = self.drain()
        self.stop_maintenance.set()
        for thread in maintenance:
            thread.join(10)
        return self.report(drained)

    def _traffic(self) -> list[threading.Thread]:
        """The publisher and subscriber threads (not started)."""
        threads = [self._thread(self._publisher, i, name=f"pub-{i}") for i in range(self.args.publishers)]
        threads.extend(
            self._thread(self._victim_publisher, i, name=f"pub-{name}")
            for i, name in enumerate(VICTIM_PUBLISHERS)
        )
        threads.append(self._thread(self._delayed_publisher, name="pub-d0"))
        assert self.proxy is not None
        url, resolved = self.proxy.url(1), self._resolved()
        threads.append(self._thread(retainer, self, url, QM, resolved, name=f"pub-{RETAINED_PUBLISHER}"))
        threads.append(self._thread(late_subscriptions, self, self.server.url, QM, name="pub-late"))
        threads.extend(
            self._thread(self._subscriber, sub_id, name=f"sub-{sub_id}") for sub_id in self.sub_ids.values()
        )
        if self.groups is not None:
            threads.append(
                self._thread(group_publisher, self, url, QM, resolved, name=f"pub-{GROUP_PUBLISHER}")
            )
            threads.extend(
                self._thread(self.groups.consume, i, self.server.url, QM, name=f"sub-grouped-{i}")
                for i in range(CONSUMERS)
            )
        return threads

    def _maintenance_threads(self) -> list[threading.Thread]:
        return [self._thread(self._maintenance, name="maintenance")]

    def _thread(self, target: Any, *args: Any, name: str) -> threading.Thread:
        """A daemon thread whose unexpected death is reported as an anomaly."""

        def guarded() -> None:
            try:
                target(*args)
            except Exception as exc:
                self.stats.anomalies.append(f"thread {name} died: {exc!r}")
                _log(f"!! thread {name} died: {exc!r}")

        return threading.Thread(target=guarded, name=name, daemon=True)

    def progress(self, phase: str) -> None:
        acked, unknown, received = self.history.counts()
        try:
            s = status(self.admin, QM)  # type: ignore[arg-type]
            pending, xlen = s.pending, s.stream_length
        except (redis.RedisError, BrokerError, ValueError):  # e.g. a foreign key planted just now
            pending = xlen = -1
        alive = self.pool.alive() if self.pool is not None else 0
        _log(
            f"[{time.monotonic() - self._started:6.1f}s {phase}] faults={sum(self.stats.faults.values())} "
            f"published={acked} unknown={unknown} received={received} pending={pending} stream={xlen} "
            f"used_memory={self.stats.max_used_memory // 1024}KiB workers={alive}/{len(self.slots)}"
        )

    def drain(self) -> bool:
        """Stop the faults and the publishers, let the workers finish, wait until everything is consumed."""
        assert self.proxy is not None and self.admin is not None
        _log("faults stop; draining")
        for index in range(self.proxy.count):
            self.proxy.call(index, "disarm")
        for slot in self.slots:
            proc = self._process(slot)
            if proc is not None and proc.is_alive():
                if slot.armed:
                    self._arm(slot, None)
                if slot.stopped_until is not None:
                    slot.stopped_until = 0.0
        self.supervise()
        self.publish_deadline = time.monotonic() + 60
        self.stop_publishing.set()
        for thread in self.threads:
            if thread.name.startswith("pub-"):
                thread.join(90)
        deadline = time.monotonic() + self.args.drain_s
        quiet = 0
        next_progress = time.monotonic() + 5
        while time.monotonic() < deadline:
            self.supervise()
            self._unplant_due(now_too=True)
            if self._quiescent():
                quiet += 1
                if quiet >= 3:
                    break
            else:
                quiet = 0
            if time.monotonic() >= next_progress:
                self.progress("drain")
                next_progress = time.monotonic() + 5
            time.sleep(0.3)
        drained = quiet >= 3
        if self.plants:
            _log(
                f"!! {len(self.plants)} planted keys could not be removed: "
                + " ".join(f"{p.kind}:{p.key}" for p in self.plants)
            )
        self.stop_consuming.set()
        for thread in self.threads:
            if thread.name.startswith("sub-"):
                thread.join(30)
        if not drained:
            self.progress("drain timed out")
        return drained

    def _quiescent(self) -> bool:
        if self.plants:
            return False
        try:
            s = status(self.admin, QM)  # type: ignore[arg-type]
            state = group_state(self.admin, QM)  # type: ignore[arg-type]
            info = self.admin.xinfo_stream(keys.publish_stream(QM))  # type: ignore[union-attr]
        except (redis.RedisError, BrokerError, ValueError):
            return False
        last = info["last-generated-id"]
        caught_up = state.last_delivered_id == (last.decode() if isinstance(last, bytes) else str(last))
        queues_empty = all(sub.depth == 0 and sub.inflight == 0 for sub in s.subscriptions)
        return s.pending == 0 and caught_up and s.active_publishers == 0 and queues_empty and s.delayed == 0

    def report(self, drained: bool) -> int:
        assert self.admin is not None and self.proxy is not None
        dead = self.admin.xrange(keys.dead_letter(QM))
        verdict = self.history.check(list(self.sub_ids.values()), dead)
        stats = self.stats
        self._log_proxies(["worker", "publisher"])
        # dedup records must expire: sample their TTLs
        no_ttl = 0
        sampled = 0
        for key in self.admin.scan_iter(match=keys.dedup_prefix(QM) + "*", count=500):
            sampled += 1
            if self.admin.pttl(key) < 0:
                no_ttl += 1
            if sampled >= 200:
                break
        fifo_left = sum(
            self.admin.llen(k) for k in self.admin.scan_iter(match=keys.fifo_key(QM, "*"), count=500)
        )
        stream_bound = max(20_000, self.args.rate * 60)
        memory_bound = self.args.max_memory_mb * 1024 * 1024
        problems = list(stats.anomalies)
        if not drained:
            problems.append("the workers did not drain before the deadline")
        if stats.max_stream_len > stream_bound:
            problems.append(f"publish stream reached {stats.max_stream_len} entries (bound {stream_bound})")
        if stats.max_used_memory > memory_bound:
            problems.append(f"used_memory reached {stats.max_used_memory} bytes (bound {memory_bound})")
        if no_ttl:
            problems.append(f"{no_ttl} of {sampled} sampled dedup records have no TTL")
        if fifo_left:
            problems.append(f"{fifo_left} entry ids left in publisher FIFOs")
        if verdict.unexpected:
            problems.append(f"{verdict.unexpected} unexpected messages")
        unplanted = {k: n for k, n in verdict.refused_keys.items() if k not in self.planted_keys}
        if unplanted:
            problems.append(f"publications refused for foreign keys the harness never planted: {unplanted}")
        if verdict.refused_repeated:
            problems.append(
                f"{verdict.refused_repeated} entries refused for a foreign key dead-lettered more than once"
            )
        if stats.refused_reply_missing:
            problems.append(
                f"{stats.refused_reply_missing} publications refused for a foreign dedup record "
                "without exactly their 'refused' result"
            )
        if self.plants:
            problems.append(f"{len(self.plants)} planted keys left")
        problems += self.retained.report(RETAINED_TOPICS, _log)
        if verdict.poison_missing or verdict.poison_repeated or verdict.poison_bad_reason:
            problems.append(
                f"poison: {verdict.poison_missing} missing, {verdict.poison_repeated} repeated, "
                f"{verdict.poison_bad_reason} without the expected reason"
            )
        grouped = self._check_groups(problems)
        self._log_problems(verdict, problems)
        _log(
            f"delayed publications (publisher d0): {stats.delayed}, received before their delivery time: {stats.early}"
        )
        _log(
            "poison by kind: "
            + " ".join(f"{k}={v}" for k, v in sorted(stats.poison.items()))
            + f" (acknowledged {verdict.poison_acked}, all dead-lettered with a reason: "
            f"{'yes' if not (verdict.poison_missing or verdict.poison_bad_reason) else 'NO'})"
        )
        _log(
            "foreign keys planted: "
            + " ".join(f"{k}={v}" for k, v in sorted(stats.planted.items()))
            + " skipped (key there): "
            + " ".join(f"{k}={v}" for k, v in sorted(stats.plant_skipped.items()))
            + f" removed={stats.removed} victim_wrongtype_waits={stats.wrongtype_waits}"
        )
        kinds: Counter[str] = Counter()
        for key, n in verdict.refused_keys.items():
            kinds[_key_kind(key)] += n
        _log(
            "refused for a foreign key, by key: "
            + " ".join(f"{k}={v}" for k, v in sorted(kinds.items()))
            + f" (refused entries dead-lettered twice: {verdict.refused_repeated}; retries of delivered "
            f"publications refused instead of answered duplicate: {verdict.refused_after_delivered}); "
            f"copies dead-lettered for an unavailable subscription: {verdict.unavailable_copies}"
        )
        self._log_latency()
        _log(
            f"unknown_outcome={verdict.unknown} unknown_delivered={verdict.unknown_delivered} redelivered={verdict.redelivered} "
            f"unexpected={verdict.unexpected} "
            f"worker_restarts={stats.worker_restarts} killer_deaths={stats.killer_deaths} aof_fixes={stats.aof_fixes} "
            f"max_stream_len={stats.max_stream_len} max_pending={stats.max_pending} trimmed={stats.trimmed} "
            f"max_times_delivered={stats.max_times_delivered} "
            f"max_used_memory={stats.max_used_memory // 1024}KiB dedup_sampled={sampled} dedup_without_ttl={no_ttl} "
            f"drained={'yes' if drained else 'NO'} elapsed={time.monotonic() - self._started:.0f}s"
        )
        _log(
            f"faults={sum(stats.faults.values())} publications={verdict.publications} "
            f"deliveries={verdict.deliveries} dead_lettered={verdict.dead_lettered} lost={verdict.lost} "
            f"duplicated={verdict.duplicated} reordered={verdict.reordered} refusable={verdict.refusable} "
            f"refused_by_foreign_key={verdict.refused_by_foreign_key} half_applied={verdict.half_applied} "
            f"foreign_not_refused={verdict.foreign_not_refused} good_dead_lettered={verdict.good_dead_lettered} "
            f"grouped={grouped.publications} group_lost={grouped.lost} group_duplicated={grouped.duplicated} "
            f"group_reordered={grouped.reordered} group_shared={grouped.shared}"
        )
        if (
            verdict.lost
            or verdict.duplicated
            or verdict.reordered
            or verdict.half_applied
            or verdict.foreign_not_refused
            or verdict.good_dead_lettered
            or not grouped.ok
            or problems
        ):
            self.failed = True
            return 1
        return 0

    def _check_groups(self, problems: list[str]) -> GroupVerdict:
        """Check the message groups' log (``scripts.rig.groups``) and print what it found."""
        if self.groups is None:
            return GroupVerdict()
        grouped = self.groups.log.check()
        problems.extend(self.groups.anomalies)
        for example in grouped.examples:
            _log(f"  - groups: {example}")
        _log(
            f"message groups on {GROUP_FILTER} ({CONSUMERS} consumers): publications={grouped.publications} "
            f"receipts={grouped.receipts} lost={grouped.lost} duplicated={grouped.duplicated} "
            f"reordered={grouped.reordered} shared={grouped.shared} lapsed={grouped.lapsed} "
            f"consumers killed={self.stats.faults['group_consumer_kill']} "
            f"closed={self.stats.faults['group_consumer_close']}"
        )
        return grouped

    def _log_proxies(self, labels: list[str]) -> None:
        """Print each proxy's counters (``labels``: what each proxy stands in front of); count its drops as faults."""
        assert self.proxy is not None
        for index, what in enumerate(labels):
            proxy_stats = self.proxy.call(index, "stats")
            _log(
                f"{what} proxy: connections={proxy_stats.connections} replies_dropped={proxy_stats.drops} "
                f"cut_waiting_for_an_answer={proxy_stats.unanswered} requests_cut={proxy_stats.requests_cut} "
                f"cut_all={proxy_stats.cuts}"
            )
            for label, n in proxy_stats.drops_by_label.items():
                self.stats.faults[label] += n

    def _log_problems(self, verdict: Any, problems: list[str]) -> None:
        for example in verdict.examples:
            _log(f"  - {example}")
        for problem in problems:
            _log(f"!! {problem}")
        _log("faults by kind: " + " ".join(f"{k}={v}" for k, v in sorted(self.stats.faults.items())))

    def _log_latency(self) -> None:
        latencies = self.history.latencies_ms()
        if latencies:
            _log(
                f"delivery latency (acknowledged XADD -> received): p50={latencies[len(latencies) // 2]:.0f}ms "
                f"p99={latencies[int(len(latencies) * 0.99)]:.0f}ms max={latencies[-1]:.0f}ms"
            )

    # -- clean-up --------------------------------------------------------------------

    def cleanup(self) -> None:
        """Stop everything this run started; safe to call at any point."""
        self.stop_publishing.set()
        self.stop_consuming.set()
        self.stop_maintenance.set()
        self.publish_deadline = 0.0
        for pool in self._pools():
            pool.stop()  # SIGTERM + SIGCONT, then SIGKILL after the grace period
        if self.proxy is not None:
            self.proxy.stop()
        with contextlib.suppress(Exception):
            self._stop_servers()
        for thread in self.threads:
            thread.join(2)
        self._faults_log.close()
        if self.args.keep or self.failed:
            _log(f"kept {self.workdir} (server log, AOF, workers.log, faults.log)")
        else:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def _stop_servers(self) -> None:
        self.server.stop()


class FederationHarness(Harness):
    """``--federation``: three queue managers in one network, each on its own master of a local
    3-master Redis Cluster (AOF, ``appendfsync always``, ``cluster-require-full-coverage no``).

    The network (see the module docstring): ``ROOT`` is the hierarchy's root, ``EAST`` and
    ``WEST`` its children and the members of the publish/subscribe cluster ``FEDCL``, whose
    cluster topic object ``clu`` is defined at ``EAST``: a topic under ``hier/`` goes from
    ``EAST`` to ``WEST`` through ``ROOT``, one under ``clu/`` straight. Each queue manager has
    a worker pool, a channel process, four subscriptions and two publishers (one per kind of
    topic, so each publisher's publications take one path to each queue manager: the order
    promised is per publisher). The channel processes reach the other queue managers through
    one proxy per queue manager (the network's ``url`` of each), so channel connections can
    be cut and channel_in replies lost. The workers, channel processes and publishers use
    the cluster client; subscribers and the harness's checks talk to the queue manager's master.
    """

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        self.weights = {**FED_FAULTS, **args.weight}
        self.slots = []
        self.cluster = LocalCluster(aof=True, full_coverage=False)
        for server in self.cluster.servers:  # fsync before every reply, as the single-server run
            server.args = (*server.args, "--appendfsync", "always")
        self.qms: list[str] = []
        self.node: dict[str, int] = {}  # qm -> index of its master
        self.direct: dict[str, redis.Redis] = {}  # qm -> a client of its master
        self.filters: dict[str, tuple[str, str]] = {}  # sub id -> (qm, filter)
        self.origin: dict[str, str] = {}  # publisher -> its queue manager
        self.pools: list[Pool] = []
        self.down_until: dict[str, float] = {}  # qm -> end of its master's outage (+ a grace)
        self.restart_by = float("inf")  # a node restart at the latest then (set at the end of setup)

    # -- set-up ---------------------------------------------------------------

    def _url(self, qm: str, cluster: bool = True) -> str:
        """The cluster URL through ``qm``'s master (``cluster``), or its master's own URL."""
        port = self.cluster.ports[self.node[qm]]
        return f"redis+cluster://127.0.0.1:{port}" if cluster else f"redis://127.0.0.1:{port}/0"

    def _edges(self, topic: str) -> list[tuple[str, str]]:
        """The channels a publication on ``topic`` may use: the hierarchy, plus the cluster's for a cluster topic."""
        root, east, west = self.qms
        edges = [(root, east), (root, west)]
        return [*edges, (east, west)] if topic.split("/")[0] == FED_CLUSTER_TOPIC else edges

    def setup(self) -> None:
        args = self.args
        self.cluster.start()
        self.qms = spread_names(self.cluster, FED_ROLES)
        ports = self.cluster.ports
        for qm in self.qms:
            self.node[qm] = ports.index(self.cluster.owner(keys.publish_stream(qm)))
            self.direct[qm] = connect(self._url(qm, cluster=False))
        self.admin = connect(self.cluster.url)
        self.proxy = ProxyProcess([ports[self.node[qm]] for qm in self.qms]).start()
        root, east, west = self.qms
        nodes: dict[str, dict[str, Any]] = {qm: {"url": self.proxy.url(i)} for i, qm in enumerate(self.qms)}
        for child in (east, west):
            nodes[child] |= {"parent": root, "clusters": [FED_CLUSTER]}
        applied = apply_network(parse_network({"queue_managers": nodes}), self.cluster.url, self.admin)
        if applied.failed:
            raise RuntimeError(f"network not applied: {applied.results}")
        define(self.admin, east, "FED.CLUSTER", FED_CLUSTER_TOPIC, Attributes(cluster=FED_CLUSTER))
        for qm in self.qms:
            for name, flt in FED_FILTERS.items():
                sub_id = subscribe(self.admin, qm, flt, "chaos", f"{qm.lower()}_{name}").sub_id
                self.sub_ids[f"{qm}/{name}"] = sub_id
                self.filters[sub_id] = (qm, flt)
        self.settings = self._settings(self._url(root), root)
        for qm in self.qms:
            settings = self._settings(self._url(qm), qm, channel_max_backoff_ms=1_000)
            channel = settings.model_copy(update={"concurrency": 1})
            for kind, entry, pool_settings, extra in (
                ("worker", run_worker, settings, ()),
                ("channel", run_channel, channel, (f"chaos-channel-{qm}",)),
            ):
                slots: list[Slot] = []
                pool = Pool(
                    pool_settings,
                    entry,
                    (str(self.control), str(self.workdir / f"{kind}s.log"), *extra),
                    name=f"chaos-{kind}-{qm}",
                    on_exit=self._exit_handler(slots),
                    max_restarts_per_minute=None,
                    daemon=True,
                )
                slots += [Slot(i, pool, kind, qm) for i in range(pool_settings.concurrency)]
                self.slots += slots
                self.pools.append(pool)
                pool.start()
        federated_setup(self)  # message groups at WEST (scripts.rig.features)
        self._wait_network()
        self.restart_by = time.monotonic() + args.duration_s / 2
        _log(
            f"chaos --federation: code={_code_version()} seed={args.seed} duration={args.duration_s}s "
            f"queue managers={','.join(f'{qm}@{ports[self.node[qm]]}' for qm in self.qms)} "
            f"(hierarchy {root} <- {east}, {west}; cluster {FED_CLUSTER} = {east}, {west}) "
            f"workers={args.workers}/qm rate={args.rate}/s workdir={self.workdir}"
        )

    def _wait_network(self, timeout_s: float = 60.0) -> None:
        """Wait until every queue manager holds a proxy subscription for every other's subscriptions
        and a copy of the cluster topic object: before that, publications would not be forwarded."""
        deadline = time.monotonic() + timeout_s
        wanted = {
            qm: {
                (other, announce_key(flt, "root", "/")) for other, flt in self.filters.values() if other != qm
            }
            for qm in self.qms
        }
        while True:
            missing = []
            for qm, client in self.direct.items():
                held = {
                    (p.qm, p.topic) for p in map(ProxySubscription.from_json, client.hvals(keys.proxies(qm)))
                }
                if not wanted[qm] <= held or not client.hexists(keys.cluster_topics(qm), FED_CLUSTER_TOPIC):
                    missing.append(qm)
            if not missing:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the network was not ready after {timeout_s:.0f} s at {missing}")
            self.supervise()
            time.sleep(0.2)

    def _pools(self) -> list[Pool]:
        return self.pools

    # -- traffic ----------------------------------------------------------------

    def _traffic(self) -> list[threading.Thread]:
        threads = []
        for qm in self.qms:
            for kind in FED_TOPICS:
                name = f"{qm.lower()}_{kind}"
                self.origin[name] = qm
                threads.append(self._thread(self._fed_publisher, qm, name, kind, name=f"pub-{name}"))
        for sub_id, (qm, _) in self.filters.items():
            url = self._url(qm, cluster=False)
            threads.append(self._thread(self._subscriber, sub_id, qm, url, name=f"sub-{sub_id}"))
        return threads + federated_threads(self)  # retained and grouped publications

    def _fed_publisher(self, qm: str, name: str, kind: str) -> None:
        """Publish on the topics of ``kind`` at ``qm`` (through the cluster client), at an even share of ``--rate``;
        at the first queue manager every publication with a delivery delay (as ``d0``'s)."""
        rng = random.Random(f"{self.args.seed}:{name}")
        delayed = qm == self.qms[0]
        client = connect(self._url(qm))
        publisher = Publisher(client, qm, name)
        topics = FED_TOPICS[kind]
        resolved = {t: network_recipients(t, qm, self.filters, self._edges(t)) for t in topics}
        interval = len(self.qms) * len(FED_TOPICS) / self.args.rate
        number = 0
        next_at = time.monotonic()
        while not self.stop_publishing.is_set():
            number += 1
            topic = rng.choice(topics)
            pub = Publication(name, number, f"{name}.{number}", topic, resolved[topic])
            self.history.add_publication(pub)
            now = now_ms()
            self._publish(
                publisher,
                pub,
                **(
                    {"timestamp_ms": now, "delivery_delay_ms": (now // 250 + 2) * 250 - now}
                    if delayed
                    else {}
                ),
            )
            self.stats.delayed += delayed
            next_at = _pace(next_at, interval)
        client.close()

    def _maintenance_threads(self) -> list[threading.Thread]:
        return [
            self._thread(self._maintenance, qm, self._url(qm, cluster=False), name=f"maintenance-{qm}")
            for qm in self.qms
        ]

    # -- faults -------------------------------------------------------------------

    def _exit_expected(self, slot: Slot) -> bool:
        """A process (re)started while its queue manager's master was down cannot connect, and exits."""
        return time.monotonic() < self.down_until.get(slot.qm, 0.0)

    def inject(self) -> None:
        kinds = list(self.weights)
        kind = self.rng.choices(kinds, weights=[self.weights[k] for k in kinds])[0]
        if self.weights.get("node_restart") and not self.last_restart and time.monotonic() >= self.restart_by:
            kind = "node_restart"  # at least one per run, halfway through if the draw gave none
        assert self.proxy is not None
        ready = [s for s in self.slots if self._ready(s) and not s.armed]
        index = self.rng.randrange(len(self.qms))  # the queue manager whose proxy or master is hit
        if kind.startswith("kill@"):
            wanted = "channel" if kind.split("@")[1] in CHANNEL_POINTS else "worker"
            self._arm_point(kind, [s for s in ready if s.kind == wanted])  # counted when it happens
        elif kind == "kill_channel_anytime":
            self._signal_anytime(kind, [s for s in ready if s.kind == "channel"])
        elif kind == "proxy_cut":
            cut = self.proxy.call(index, "cut_all")
            self._fault(kind, f"{cut} connections to {self.qms[index]}")
        elif kind.startswith(("drop_reply:", "cut_request:")):
            method, what = kind.split(":")
            self.proxy.call(index, method, call_of(what), 1, kind)  # counted from the proxy's stats
        elif kind == "consumer_kill":
            self.consumer_faults[self.rng.choice(sorted(self.sub_ids.values()))] = kind
        elif kind in GROUP_FAULTS and self.groups is not None:
            self.groups.request(kind)  # taken by the next group consumer that receives (counted then)
        elif kind == "node_restart" and time.monotonic() - self.last_restart >= 8:
            self.restart_node(self.qms[index])

    def restart_node(self, qm: str) -> None:
        """SIGKILL the master of ``qm`` and start it again on its port and directory (AOF)."""
        with self.server_lock:
            self.down_until[qm] = float("inf")
            index = self.node[qm]
            self.cluster.kill(index)
            time.sleep(self.rng.uniform(0.1, 1.0))
            self.cluster.restart(index, timeout_ms=60_000)
            self.last_restart = time.monotonic()
            self.down_until[qm] = self.last_restart + 5
        self._fault("node_restart", f"master {index} port {self.cluster.ports[index]} ({qm})")

    # -- drain and report ---------------------------------------------------------

    def _channels(self) -> list[tuple[str, str]]:
        """Every channel (sender, receiver) of the network."""
        root, east, west = self.qms
        pairs = [(root, east), (root, west), (east, west)]
        return [*pairs, *((b, a) for a, b in pairs)]

    def _channel_lag(self) -> int:
        """Channels whose transmission stream holds an entry the receiver has not filed."""
        behind = 0
        for sender, to in self._channels():
            try:
                info = self.direct[sender].xinfo_stream(keys.transmission(sender, to))
            except redis.ResponseError:  # no transmission stream yet
                continue
            last = _text(info["last-generated-id"])
            filed = _text(self.direct[to].hget(keys.received(to), sender)) or "0-0"
            behind += _id(filed) < _id(last)
        return behind

    def _quiescent(self) -> bool:
        try:
            for qm, client in self.direct.items():
                s = status(client, qm)
                state = group_state(client, qm)
                last = _text(client.xinfo_stream(keys.publish_stream(qm))["last-generated-id"])
                queues_empty = all(sub.depth == 0 and sub.inflight == 0 for sub in s.subscriptions)
                busy = s.pending or s.active_publishers or s.delayed
                if busy or state.last_delivered_id != last or not queues_empty:
                    return False
            return self._channel_lag() == 0
        except (redis.RedisError, BrokerError, ValueError):
            return False

    def progress(self, phase: str) -> None:
        acked, unknown, received = self.history.counts()
        pending = []
        try:
            for qm, client in self.direct.items():
                pending.append(f"{qm}:{status(client, qm).pending}")
            lag = str(self._channel_lag())
        except (redis.RedisError, BrokerError, ValueError):
            lag = "?"
        alive = sum(pool.alive() for pool in self.pools)
        _log(
            f"[{time.monotonic() - self._started:6.1f}s {phase}] faults={sum(self.stats.faults.values())} "
            f"published={acked} unknown={unknown} received={received} pending={','.join(pending) or '?'} "
            f"channels_behind={lag} processes={alive}/{len(self.slots)}"
        )

    def report(self, drained: bool) -> int:
        dead: list[Any] = []
        for qm, client in self.direct.items():
            dead += client.xrange(keys.dead_letter(qm))
        verdict = self.history.check(list(self.sub_ids.values()), dead)
        stats = self.stats
        self._log_proxies([f"{qm} (channels in)" for qm in self.qms])
        moved = dropped = 0
        for sender, to in self._channels():
            state = {
                _text(k): _text(v)
                for k, v in self.direct[sender].hgetall(keys.channel_state(sender, to)).items()
            }
            moved += int(state.get("moved") or 0)
            dropped += int(state.get("dropped_as_filed") or 0)
            _log(
                f"channel {sender} -> {to}: moved={state.get('moved', 0)} "
                f"dropped_as_filed={state.get('dropped_as_filed', 0)} state={state.get('state', 'idle')}"
            )
        problems = list(stats.anomalies)
        if not drained:
            problems.append("the network did not drain before the deadline")
        if verdict.unexpected:
            problems.append(f"{verdict.unexpected} unexpected messages")
        if verdict.good_dead_lettered:
            problems.append(f"{verdict.good_dead_lettered} publications dead-lettered")
        problems += self.retained.report(RETAINED_TOPICS, _log)
        grouped = self._check_groups(problems)
        self._log_problems(verdict, problems)
        self._log_latency()
        _log(
            f"delayed publications (at {self.qms[0]}): {stats.delayed}, received before their delivery time: {stats.early}"
        )
        pubs = [p for p in self.history.by_msgid.values() if p.acked]  # every thread has stopped
        forwarded = sum(self.filters[s][0] != self.origin[p.publisher] for p in pubs for s in p.recipients)
        _log(
            f"unknown_outcome={verdict.unknown} unknown_delivered={verdict.unknown_delivered} "
            f"redelivered={verdict.redelivered} process_restarts={stats.worker_restarts} "
            f"channel_moved={moved} channel_dropped_as_filed={dropped} max_stream_len={stats.max_stream_len} "
            f"max_used_memory={stats.max_used_memory // 1024}KiB drained={'yes' if drained else 'NO'} "
            f"elapsed={time.monotonic() - self._started:.0f}s"
        )
        _log(
            f"faults={sum(stats.faults.values())} publications={verdict.publications} "
            f"deliveries={verdict.deliveries} forwarded={forwarded} dead_lettered={verdict.dead_lettered} "
            f"lost={verdict.lost} duplicated={verdict.duplicated} reordered={verdict.reordered} "
            f"grouped={grouped.publications} group_lost={grouped.lost} group_duplicated={grouped.duplicated} "
            f"group_reordered={grouped.reordered} group_shared={grouped.shared}"
        )
        if verdict.lost or verdict.duplicated or verdict.reordered or not grouped.ok or problems:
            self.failed = True
            return 1
        return 0

    def _stop_servers(self) -> None:
        self.cluster.stop()


def _pace(next_at: float, interval: float) -> float:
    """Sleep until ``next_at + interval`` (or not, when behind: the schedule restarts from now); the new ``next_at``."""
    next_at += interval
    delay = next_at - time.monotonic()
    if delay > 0:
        time.sleep(delay)
        return next_at
    return time.monotonic()


def _key_kind(key: str) -> str:
    """Which of the broker's keys ``key`` is: queue, fifo, turn, reply, dedup (or other)."""
    if key.startswith(keys.reply_prefix(QM)):
        return "reply"
    if key.startswith(keys.dedup_prefix(QM)):
        return "dedup"
    if key.startswith(keys.pub_prefix(QM)):
        return "fifo" if key.endswith(":fifo") else "turn"
    if key.startswith(keys.sub_queue(QM, "")):
        return "queue"
    return "other"


def _text(raw: bytes | str | None) -> str:
    if raw is None:
        return ""
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def _id(entry_id: str) -> tuple[int, int]:
    """A stream entry id as a comparable pair."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def _process_state(pid: int) -> str:
    """The state letter of a process in /proc (``T`` when stopped), or "" if unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[-1].split()[0]


def _code_version() -> str:
    """``git describe --always --dirty`` of the checkout, or "unknown"."""
    try:
        out = subprocess.run(
            ["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, timeout=10, check=True
        )
        return out.stdout.decode().strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _subscriptions(client: redis.Redis, qm: str = QM) -> list[Any]:
    from broker.topics.subscriptions import list_subscriptions

    return list_subscriptions(client, qm)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration-s", "--seconds", type=float, default=60.0, help="fault phase, seconds")
    parser.add_argument(
        "--federation",
        action="store_true",
        help="three queue managers in a network on a local 3-master cluster, with channel faults",
    )
    parser.add_argument("--seed", type=int, default=1, help="seed of the fault schedule and the traffic")
    parser.add_argument(
        "--workers", type=int, help="worker processes (default 3; --federation: per queue manager, default 2)"
    )
    parser.add_argument("--publishers", type=int, default=4, help="publisher threads")
    parser.add_argument(
        "--rate", type=float, help="publications per second, all publishers (default 200; --federation 100)"
    )
    parser.add_argument("--lease-ms", type=int, default=800, help="lease of a publisher's turn, ms")
    parser.add_argument("--max-deliveries", type=int, default=5, help="the workers' max_deliveries setting")
    parser.add_argument(
        "--consumer-lease-ms", type=int, default=600, help="lease of a subscription's consumer, ms"
    )
    parser.add_argument("--fault-interval-ms", type=int, default=1_000, help="mean time between faults, ms")
    parser.add_argument(
        "--victim-share",
        type=float,
        default=0.05,
        help="share of ordinary publications on victim topics (refusable)",
    )
    parser.add_argument(
        "--victim-rate",
        type=float,
        default=20.0,
        help="publications per second of the victim publishers, all together",
    )
    parser.add_argument(
        "--weight",
        type=_weight,
        action="append",
        default=[],
        metavar="KIND=N",
        help=f"fault weight (0 turns a kind off); also {', '.join(OPTIONAL_FAULTS)}",
    )
    parser.add_argument("--poison-rate", type=float, default=0.01, help="poison entries per publication")
    parser.add_argument("--drain-s", type=float, default=120.0, help="how long the final drain may take, s")
    parser.add_argument("--max-memory-mb", type=int, default=256, help="bound on the server's used_memory")
    parser.add_argument(
        "--keep", action="store_true", help="keep the work directory (logs, AOF) even on success"
    )
    args = parser.parse_args(argv)
    args.weight = dict(args.weight)
    args.workers = args.workers or (2 if args.federation else 3)
    args.rate = args.rate or (100.0 if args.federation else 200.0)
    return args


def _weight(text: str) -> tuple[str, int]:
    kind, _, n = text.partition("=")
    if (
        kind not in FAULTS
        and kind not in FED_FAULTS
        and kind not in OPTIONAL_FAULTS
        and not kind.startswith("kill@")
    ):
        raise argparse.ArgumentTypeError(f"unknown fault kind {kind!r}")
    return kind, int(n)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    harness = FederationHarness(args) if args.federation else Harness(args)
    bound_s = int(args.duration_s + args.drain_s + 240)

    def _timeout(signum: int, frame: object) -> None:
        raise HarnessTimeout(f"the harness ran longer than {bound_s} s")

    def _terminate(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGALRM, _timeout)
    signal.signal(signal.SIGTERM, _terminate)
    signal.alarm(bound_s)
    try:
        return harness.run()
    except (HarnessTimeout, KeyboardInterrupt) as exc:
        _log(f"!! interrupted: {exc!r}")
        harness.failed = True
        return 2
    finally:
        signal.alarm(0)
        harness.cleanup()


if __name__ == "__main__":
    sys.exit(main())
