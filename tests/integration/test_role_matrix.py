"""Issue 27's role x operation table (``tests/integration/role_matrix.py``), one test per cell, on a real server.

One ACL user per role, made with ``broker.operations.acl.add_user`` on a server of this module's own
(a command wrongly allowed cannot harm the session's server), runs each operation of the table on a
connection of its own (``MONITOR`` turns a connection into a monitor). A cell expects *allowed* (no
NOPERM: any other error means the ACL let the command through) or *denied* (NOPERM). The cells the
code does not meet yet (``role_matrix.PENDING_27``) are strict xfails.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest
import redis

from broker.core.connection import connect
from broker.operations.acl import RoleSpec, add_user
from broker.testing import start_server
from tests.integration import role_matrix as matrix
from tests.integration.role_matrix import OPERATIONS, PENDING_27, QM, ROLES, USERS, Operation

SPECS = {
    "publisher": RoleSpec("publisher", [matrix.PUBLISHER_ID]),
    "subscriber": RoleSpec("subscriber", client_id=matrix.CLIENT_ID),
    "monitor": RoleSpec("monitor"),
    "worker": RoleSpec("worker"),
    "channel": RoleSpec("channel"),
    "admin": RoleSpec("admin"),
}


class Matrix:
    """A server of its own with one broker user per role (random passwords)."""

    def __init__(self) -> None:
        self.server = start_server()
        self.admin = connect(self.server.url)
        self.passwords = {role: secrets.token_urlsafe(18) for role in ROLES}
        for role in ROLES:
            add_user(self.admin, QM, USERS[role], SPECS[role], self.passwords[role])

    def allowed(self, role: str, op: Operation) -> tuple[bool, str]:
        """Whether the ACL let ``role``'s user run ``op``, and what the server answered."""
        argv = op.argv()
        self.admin.flushall()  # each cell on an empty database: no cell's answer depends on another's
        if op.dry_run:
            answer = self.admin.execute_command("ACL", "DRYRUN", USERS[role], *argv)
            return answer == b"OK", repr(answer)
        client = redis.Redis(
            port=self.server.port,
            username=USERS[role],
            password=self.passwords[role],
            single_connection_client=True,
            socket_timeout=10,
        )
        try:
            return True, repr(client.execute_command(*argv))
        except redis.exceptions.NoPermissionError as exc:
            return False, str(exc)
        except redis.ResponseError as exc:
            return not refused_in_script(exc), f"{type(exc).__name__}: {exc}"
        finally:
            client.close()

    def close(self) -> None:
        self.admin.close()
        self.server.stop()


def refused_in_script(exc: redis.ResponseError) -> bool:
    """A command a script ran, refused by the caller's ACL (Redis words it without NOPERM)."""
    return str(exc).startswith(("ACL failure in script", "The user executing the script can't"))


@pytest.fixture(scope="module")
def roles() -> Iterator[Matrix]:
    made = Matrix()
    yield made
    made.close()


def _cells() -> list[object]:
    """One param per cell; a pending one is a strict xfail with its reason."""
    out: list[object] = []
    for op in OPERATIONS:
        for role in ROLES:
            pending = PENDING_27.get((op.id, role))
            marks = [pytest.mark.xfail(strict=True, reason=pending)] if pending else []
            out.append(pytest.param(op, role, id=f"{op.id}-{role}", marks=marks))
    return out


@pytest.mark.parametrize(("op", "role"), _cells())
def test_each_role_is_allowed_exactly_the_operations_of_issue_27s_table(
    roles: Matrix, op: Operation, role: str
) -> None:
    # Given the role's user; When it runs the operation
    allowed, answer = roles.allowed(role, op)
    # Then the ACL let it through exactly when the table says so
    expected = role in op.allowed
    assert allowed == expected, (
        f"{role} {op.argv()!r}: expected {'allowed' if expected else 'denied'}, got {answer}"
    )


def test_the_table_covers_every_role_and_names_each_row_once() -> None:
    # Given the table; Then each row is named once, allows only known roles, and every pending cell is a cell
    ids = [op.id for op in OPERATIONS]
    assert len(ids) == len(set(ids))
    assert all(op.allowed <= set(ROLES) for op in OPERATIONS)
    assert {op for op, _ in PENDING_27} <= set(ids)
    assert {role for _, role in PENDING_27} <= set(ROLES)
