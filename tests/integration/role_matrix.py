"""Issue 27's role x operation table, as data: what each broker role may do, command by command.

Each ``Operation`` is one concrete Redis command on concrete keys of queue manager ``QM`` (every key
from ``broker.core.keys``), and the roles whose ACL (``broker.operations.acl.rules``) must let it
through. The same data gives:

- ``tests/integration/test_role_matrix.py``: one test per cell, on a real server, as one ACL user
  per role made with ``broker.operations.acl.add_user``. *Allowed* means Redis did not refuse the
  command with NOPERM (a WRONGTYPE, a missing key or function, a syntax error is fine: the ACL let it
  through); *denied* means NOPERM.
- the table of ``docs/security.md`` (``python -m tests.integration.role_matrix --markdown`` prints it,
  ``--write`` writes it there), which ``tests/unit/test_role_matrix_doc.py`` compares with this data.

The expected cells are issue 27's target, not only today's rules: the subscriber role loses every
write on the shared ``{qm}:dlq``, ``{qm}:expired`` and ``{qm}:last_active``, and runs the protocol's
functions (``FCALL``) instead of scripts (no ``EVAL``, ``EVALSHA``, ``SCRIPT``); the broker roles that
load the function library (worker, admin) get ``FUNCTION LOAD`` and ``FUNCTION LIST``; a subscriber
asks for subscriptions through its own control stream ``{qm}:ctl:<client id>``. The cells the code
does not meet yet are listed once, in ``PENDING_27``, with the branch that meets them: their tests
are strict xfails, so a cell that starts to pass fails until it is taken out of ``PENDING_27``.

Destructive commands are tried in forms that do nothing even when allowed (``FLUSHALL`` and
``FUNCTION FLUSH`` with an argument they refuse, ``SHUTDOWN ABORT``, ``CONFIG SET`` of an unknown
option, ``ACL SETUSER`` with an unknown rule, ``CLIENT KILL`` of a client id that does not exist):
Redis checks the ACL on the command (and subcommand) and keys, never on the other arguments, so the
refusal is the same. ``DEBUG`` is asked of the ACL with ``ACL DRYRUN``: the server refuses ``DEBUG``
to every client before its ACL is looked at (``enable-debug-command no``).
"""

from __future__ import annotations

import argparse
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from broker.core import keys

QM = "TEST"

#: The table's columns, in the order docs/security.md shows them.
ROLES = ("publisher", "subscriber", "monitor", "worker", "channel", "admin")

#: The names of the table: one user per role, its bindings, and another client and principal.
PUBLISHER_USER = "mx-pub"
PUBLISHER_ID = "svc-mx"
OTHER_PUBLISHER_ID = "svc-other"
OTHER_PRINCIPAL = "mx-other-pub"
CLIENT_ID = "mx-client"
OTHER_CLIENT_ID = "mx-other-client"
USERS = {role: f"mx-{role}" for role in ROLES} | {"publisher": PUBLISHER_USER}

OWN_SUB = f"{CLIENT_ID}$d"
OTHER_SUB = f"{OTHER_CLIENT_ID}$d"

#: What every probing script runs: nothing.
PROBE_SCRIPT = "return 1"
PROBE_SHA = hashlib.sha1(PROBE_SCRIPT.encode()).hexdigest()
PROBE_LIBRARY = "#!lua name=matrixprobe\nredis.register_function('matrix_probe', function() return 1 end)"
#: A function nobody loads: FCALL of it fails with "Function not found" once the ACL let it through.
MISSING_FUNCTION = "matrix_probe_missing"

#: The name of the control stream's key function, which lands with h-grants (issue 27 part 3).
CONTROL_KEY_FUNCTION = "control"

BROKER_ROLES = frozenset({"worker", "channel", "admin"})
EVERY_ROLE = frozenset(ROLES)
NO_ROLE: frozenset[str] = frozenset()

Argv = tuple[str, ...]


def control(qm: str, client_id: str) -> str:
    """The control stream of ``client_id``, ``{qm}:ctl:<client id>``, from ``keys`` (h-grants adds it).

    Raises:
        AttributeError: ``broker.core.keys`` has no control stream yet.
    """
    build: Callable[[str, str], str] = getattr(keys, CONTROL_KEY_FUNCTION)
    return build(qm, client_id)


@dataclass(frozen=True)
class Operation:
    """One row of the table.

    Attributes:
        id: the row's short name (in test ids).
        row: the row as docs/security.md shows it (Markdown).
        group: the section of the table.
        argv: the command and its arguments (keys from ``broker.core.keys``), built when tried.
        allowed: the roles the ACL must let through (issue 27's target); every other is refused.
        dry_run: ask the ACL with ``ACL DRYRUN`` instead of running the command as the user.
    """

    id: str
    row: str
    group: str
    argv: Callable[[], Argv]
    allowed: frozenset[str]
    dry_run: bool = False


def _op(
    id_: str, row: str, group: str, argv: Callable[[], Argv], allowed: frozenset[str], dry_run: bool = False
) -> Operation:
    return Operation(id_, row, group, argv, allowed, dry_run)


DLQ, SHARED, SUBS, PUBLISHING, ADMIN, SCRIPTS = (
    "The dead-letter queue",
    "Shared records",
    "Subscriptions",
    "Publishing",
    "Administration",
    "Scripts and functions",
)

_dlq = keys.dead_letter(QM)
_own_queue = keys.sub_queue(QM, OWN_SUB)
_other_queue = keys.sub_queue(QM, OTHER_SUB)
_publication = ("publisher", PUBLISHER_ID, "topic", "t/a", "msgid", "m1", "body", "x")

OPERATIONS: tuple[Operation, ...] = (
    # --- the broker's dead letters: written by broker roles only (issue 27 part 2)
    _op("dlq-xtrim", "`XTRIM {qm}:dlq MAXLEN 0`", DLQ, lambda: ("XTRIM", _dlq, "MAXLEN", "0"), BROKER_ROLES),
    _op("dlq-del", "`DEL {qm}:dlq`", DLQ, lambda: ("DEL", _dlq), BROKER_ROLES),
    _op(
        "dlq-rename",
        "`RENAME {qm}:dlq` to a key of its own subscriptions",
        DLQ,
        lambda: ("RENAME", _dlq, keys.sub_queue(QM, f"{CLIENT_ID}$stolen")),
        BROKER_ROLES,
    ),
    _op("dlq-set", "`SET {qm}:dlq` (plant a string)", DLQ, lambda: ("SET", _dlq, "planted"), BROKER_ROLES),
    _op(
        "dlq-xadd",
        "`XADD {qm}:dlq` (forge a dead letter)",
        DLQ,
        lambda: ("XADD", _dlq, "*", *_publication, "principal", PUBLISHER_USER),
        BROKER_ROLES,
    ),
    # --- records shared by every subscription
    *(
        _op(f"{name}-{verb.lower()}", f"`{verb} {{qm}}:{name}`", SHARED, argv, BROKER_ROLES)
        for name, key in (("last_active", keys.last_active(QM)), ("expired", keys.expired(QM)))
        for verb, argv in (
            ("SET", lambda key=key: ("SET", key, "planted")),
            ("HSET", lambda key=key: ("HSET", key, OTHER_SUB, "0")),
        )
    ),
    _op(
        "subs-hget",
        "`HGETALL {qm}:subs`",
        SHARED,
        lambda: ("HGETALL", keys.subscriptions(QM)),
        EVERY_ROLE - {"publisher"},
    ),
    _op(
        "subs-hset",
        "`HSET {qm}:subs` (make a subscription)",
        SHARED,
        lambda: ("HSET", keys.subscriptions(QM), f"{CLIENT_ID}$new", "{}"),
        BROKER_ROLES,
    ),
    _op("version-incr", "`INCR {qm}:version`", SHARED, lambda: ("INCR", keys.version(QM)), BROKER_ROLES),
    _op(
        "principals-hset",
        "`HSET {qm}:principals` (bind a publisher id)",
        SHARED,
        lambda: ("HSET", keys.principals(QM), PUBLISHER_USER, OTHER_PUBLISHER_ID),
        BROKER_ROLES,
    ),
    _op(
        "acl-hset",
        "`HSET {qm}:acl` (change a user's role record)",
        SHARED,
        lambda: ("HSET", keys.acl_users(QM), USERS["subscriber"], '{"role":"admin"}'),
        BROKER_ROLES,
    ),
    # --- subscriptions: its own client id's, and another's
    _op(
        "own-queue-rpoplpush",
        "`RPOPLPUSH` its own queue to its in-flight list",
        SUBS,
        lambda: ("RPOPLPUSH", _own_queue, keys.consumer_inflight(QM, OWN_SUB, "c1")),
        BROKER_ROLES | {"subscriber"},
    ),
    _op(
        "own-queue-del",
        "`DEL` its own queue",
        SUBS,
        lambda: ("DEL", _own_queue),
        BROKER_ROLES | {"subscriber"},
    ),
    _op(
        "own-queue-set",
        "`SET` its own queue (plant a string)",
        SUBS,
        lambda: ("SET", _own_queue, "planted"),
        BROKER_ROLES | {"subscriber"},
    ),
    _op(
        "own-bell-set",
        "`SET` its own bell (plant a string)",
        SUBS,
        lambda: ("SET", keys.sub_bell(QM, OWN_SUB), "planted"),
        BROKER_ROLES | {"subscriber"},
    ),
    _op(
        "other-queue-lrange",
        "`LRANGE` another client's queue",
        SUBS,
        lambda: ("LRANGE", _other_queue, "0", "-1"),
        BROKER_ROLES | {"monitor"},
    ),
    _op("other-queue-del", "`DEL` another client's queue", SUBS, lambda: ("DEL", _other_queue), BROKER_ROLES),
    _op(
        "other-queue-rpush",
        "`RPUSH` another client's queue (forge a message)",
        SUBS,
        lambda: ("RPUSH", _other_queue, "forged"),
        BROKER_ROLES,
    ),
    _op(
        "other-bell-set",
        "`SET` another client's bell",
        SUBS,
        lambda: ("SET", keys.sub_bell(QM, OTHER_SUB), "planted"),
        BROKER_ROLES,
    ),
    _op(
        "own-ctl-xadd",
        "`XADD {qm}:ctl:<client id>` (its own subscribe request)",
        SUBS,
        lambda: ("XADD", control(QM, CLIENT_ID), "*", "op", "subscribe", "name", "d2", "topic", "t/#"),
        BROKER_ROLES | {"subscriber"},
    ),
    _op(
        "own-ctl-fcall",
        "`FCALL broker_request 1 {qm}:ctl:<client id> ...` (its own subscribe request, through the library)",
        SUBS,
        lambda: ("FCALL", MISSING_FUNCTION, "1", control(QM, CLIENT_ID), "op", "subscribe"),
        BROKER_ROLES | {"subscriber"},
    ),
    _op(
        "other-ctl-fcall",
        "`FCALL broker_request` on another client's control stream",
        SUBS,
        lambda: ("FCALL", MISSING_FUNCTION, "1", control(QM, OTHER_CLIENT_ID), "op", "subscribe"),
        BROKER_ROLES,
    ),
    _op(
        "other-ctl-xadd",
        "`XADD` another client's control stream",
        SUBS,
        lambda: ("XADD", control(QM, OTHER_CLIENT_ID), "*", "op", "subscribe", "name", "d2", "topic", "t/#"),
        BROKER_ROLES,
    ),
    # --- publishing
    _op(
        "own-ingress-xadd",
        "`XADD {qm}:in:<user>` (its own ingress)",
        PUBLISHING,
        lambda: ("XADD", keys.ingress(QM, PUBLISHER_USER), "*", *_publication),
        BROKER_ROLES | {"publisher"},
    ),
    _op(
        "other-ingress-xadd",
        "`XADD` another principal's ingress",
        PUBLISHING,
        lambda: ("XADD", keys.ingress(QM, OTHER_PRINCIPAL), "*", *_publication),
        BROKER_ROLES,
    ),
    _op(
        "publish-xadd",
        "`XADD {qm}:publish` (the publish stream)",
        PUBLISHING,
        lambda: ("XADD", keys.publish_stream(QM), "*", *_publication),
        BROKER_ROLES,
    ),
    _op(
        "publish-xrange",
        "`XRANGE {qm}:publish` (read the publish stream)",
        PUBLISHING,
        lambda: ("XRANGE", keys.publish_stream(QM), "-", "+", "COUNT", "1"),
        BROKER_ROLES | {"monitor"},
    ),
    _op(
        "own-reply-blpop",
        "`BLPOP` a result of its own publisher id",
        PUBLISHING,
        lambda: ("BLPOP", keys.reply(QM, PUBLISHER_ID, "m1"), "0.01"),
        BROKER_ROLES | {"publisher"},
    ),
    _op(
        "other-reply-blpop",
        "`BLPOP` a result of another publisher id",
        PUBLISHING,
        lambda: ("BLPOP", keys.reply(QM, OTHER_PUBLISHER_ID, "m1"), "0.01"),
        BROKER_ROLES,
    ),
    # --- the server's administration: the operator's own user only
    _op("config-get", "`CONFIG GET`", ADMIN, lambda: ("CONFIG", "GET", "maxmemory"), NO_ROLE),
    _op(
        "config-set", "`CONFIG SET`", ADMIN, lambda: ("CONFIG", "SET", "matrix-no-such-option", "1"), NO_ROLE
    ),
    _op("flushall", "`FLUSHALL`", ADMIN, lambda: ("FLUSHALL", "matrix-no-such-option"), NO_ROLE),
    _op("keys", "`KEYS`", ADMIN, lambda: ("KEYS", keys.all_keys_pattern(QM)), NO_ROLE),
    _op("shutdown", "`SHUTDOWN`", ADMIN, lambda: ("SHUTDOWN", "ABORT"), NO_ROLE),
    _op(
        "acl-setuser",
        "`ACL SETUSER`",
        ADMIN,
        lambda: ("ACL", "SETUSER", "matrix-nobody", "+matrix-no-such-command"),
        NO_ROLE,
    ),
    _op("acl-list", "`ACL LIST`", ADMIN, lambda: ("ACL", "LIST"), NO_ROLE),
    _op(
        "debug",
        "`DEBUG` (asked with `ACL DRYRUN`)",
        ADMIN,
        lambda: ("DEBUG", "SLEEP", "0"),
        NO_ROLE,
        dry_run=True,
    ),
    _op("monitor", "`MONITOR`", ADMIN, lambda: ("MONITOR",), NO_ROLE),
    _op("client-kill", "`CLIENT KILL`", ADMIN, lambda: ("CLIENT", "KILL", "ID", "999999999"), NO_ROLE),
    _op("save", "`SAVE`", ADMIN, lambda: ("SAVE",), NO_ROLE),
    # --- scripts and functions: untrusted roles call the library's functions, never scripts
    _op("eval", "`EVAL`", SCRIPTS, lambda: ("EVAL", PROBE_SCRIPT, "0"), BROKER_ROLES),
    _op("evalsha", "`EVALSHA`", SCRIPTS, lambda: ("EVALSHA", PROBE_SHA, "0"), BROKER_ROLES),
    _op("script-load", "`SCRIPT LOAD`", SCRIPTS, lambda: ("SCRIPT", "LOAD", PROBE_SCRIPT), BROKER_ROLES),
    _op("script-kill", "`SCRIPT KILL`", SCRIPTS, lambda: ("SCRIPT", "KILL"), NO_ROLE),
    _op("script-flush", "`SCRIPT FLUSH`", SCRIPTS, lambda: ("SCRIPT", "FLUSH"), NO_ROLE),
    _op(
        "function-load",
        "`FUNCTION LOAD`",
        SCRIPTS,
        lambda: ("FUNCTION", "LOAD", PROBE_LIBRARY),
        frozenset({"worker", "admin"}),
    ),
    _op(
        "function-list",
        "`FUNCTION LIST`",
        SCRIPTS,
        lambda: ("FUNCTION", "LIST"),
        frozenset({"worker", "admin"}),
    ),
    _op(
        "function-delete",
        "`FUNCTION DELETE`",
        SCRIPTS,
        lambda: ("FUNCTION", "DELETE", "matrixprobe"),
        NO_ROLE,
    ),
    _op(
        "function-flush",
        "`FUNCTION FLUSH`",
        SCRIPTS,
        lambda: ("FUNCTION", "FLUSH", "matrix-no-such-option"),
        NO_ROLE,
    ),
    _op(
        "fcall-own",
        "`FCALL` on its own subscription",
        SCRIPTS,
        lambda: ("FCALL", MISSING_FUNCTION, "1", _own_queue),
        BROKER_ROLES | {"subscriber"},
    ),
    _op(
        "fcall-ro-own",
        "`FCALL_RO` on its own subscription",
        SCRIPTS,
        lambda: ("FCALL_RO", MISSING_FUNCTION, "1", _own_queue),
        BROKER_ROLES | {"subscriber"},
    ),
    _op(
        "fcall-other",
        "`FCALL` on another client's subscription",
        SCRIPTS,
        lambda: ("FCALL", MISSING_FUNCTION, "1", _other_queue),
        BROKER_ROLES,
    ),
)

#: The cells of issue 27's target that the code does not meet yet: (operation id, role) -> why.
#: Their tests are strict xfails; take a cell out when its branch lands (docs: regenerate the table).
#: Empty: every branch of issue 27 has landed.
PENDING_27: dict[tuple[str, str], str] = {}


def markdown() -> str:
    """The table as docs/security.md shows it: roles as columns, operations as rows, a section per group."""
    head = ["| operation | " + " | ".join(ROLES) + " |", "|---|" + "---|" * len(ROLES)]
    lines = list(head)
    group = ""
    for op in OPERATIONS:
        if op.group != group:
            group = op.group
            lines.append(f"| **{group}** |" + " |" * len(ROLES))
        cells = []
        for role in ROLES:
            cell = "allowed" if role in op.allowed else "denied"
            if (op.id, role) in PENDING_27:
                cell += " †"
            cells.append(cell)
        lines.append(f"| {op.row} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


#: Where docs/security.md holds the table: between these two lines.
DOC = Path(__file__).resolve().parents[2] / "docs" / "security.md"
BEGIN = "<!-- role-matrix:begin (python -m tests.integration.role_matrix --markdown) -->\n"
END = "<!-- role-matrix:end -->\n"


def doc_table(text: str) -> str:
    """The table between ``BEGIN`` and ``END`` in ``text`` (docs/security.md).

    Raises:
        ValueError: the markers are missing or out of order.
    """
    _, begin, rest = text.partition(BEGIN)
    table, end, _ = rest.partition(END)
    if not begin or not end:
        raise ValueError(f"docs/security.md has no table between {BEGIN.strip()} and {END.strip()}")
    return table


def with_table(text: str) -> str:
    """``text`` (docs/security.md) with the table between the markers printed again from the data."""
    old = doc_table(text)
    return text.replace(BEGIN + old + END, BEGIN + markdown() + END)


def _main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true", help="print the table of docs/security.md")
    parser.add_argument("--write", action="store_true", help="write the table into docs/security.md")
    args = parser.parse_args()
    if args.write:
        DOC.write_text(with_table(DOC.read_text()))
    elif args.markdown:
        print(markdown(), end="")
    else:
        parser.print_help()


if __name__ == "__main__":
    _main()
