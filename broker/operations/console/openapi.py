"""The management API's OpenAPI 3.1 document, served at ``/api/openapi.json`` (written by hand here).

``OPERATIONS`` lists every endpoint of ``broker.operations.console.api`` once: its method,
path, summary, the role it needs, its parameters, its body and answer schemas. The
definitions document's schema comes from its pydantic model
(``broker.operations.definitions.Definitions``); the others are small and written out.
``document`` assembles them; ``tests/integration/test_console_api.py`` validates the result
(``openapi-spec-validator``) and checks that every route is documented.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from broker.operations.definitions import Definitions
from broker.topics.topic_objects import Attributes

#: The API's version (the document's ``info.version``).
API_VERSION = "1"


def _obj(required: tuple[str, ...] = (), **props: Any) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": props}
    if required:
        schema["required"] = list(required)
    return schema


_S, _I, _B = {"type": "string"}, {"type": "integer"}, {"type": "boolean"}
_NI = {"type": ["integer", "null"]}
_LIST_S = {"type": "array", "items": _S}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _array(name: str) -> dict[str, Any]:
    return {"type": "array", "items": _ref(name)}


#: The component schemas besides the definitions document's.
SCHEMAS: dict[str, Any] = {
    "Error": _obj(("error", "kind"), error=_S, kind=_S),
    "Whoami": _obj(("user", "role"), user=_S, role={"enum": ["monitor", "admin"]}, may_act=_B, csrf=_S),
    "Overview": {
        "type": "object",
        "description": "The status snapshot (broker status --json), rates, memory, totals.",
    },
    "Subscription": _obj(
        ("id", "filter", "durable", "mode"),
        id=_S,
        filter=_S,
        durable=_B,
        selector=_S,
        no_local=_B,
        mode={"enum": ["exclusive", "shared", "activestandby"]},
        share=_S,
        created_ms=_I,
        consumers=_NI,
        depth=_NI,
        inflight=_NI,
        skipped=_NI,
        slow=_NI,
        expired=_NI,
        consumer_leases={"type": "array", "items": _obj(consumer=_S, lease_deadline_ms=_I)},
    ),
    "Samples": _obj(
        ("interval_s", "t"),
        interval_s=_I,
        problem=_S,
        t={"type": "array", "items": {"type": "number"}, "description": "s since the epoch"},
        published_per_s={"type": "array", "items": {"type": ["number", "null"]}},
        handled_per_s={"type": "array", "items": {"type": ["number", "null"]}},
        depth={"type": "array", "items": _I},
        dead_letters={"type": "array", "items": _I},
    ),
    "Publication": _obj(
        ("topic",),
        topic=_S,
        body=_S,
        properties={"type": "object", "additionalProperties": {"type": ["string", "number", "boolean"]}},
        priority=_I,
        persistent=_B,
        msgid=_S,
        publisher_id=_S,
    ),
    "Published": _obj(("msgid", "entry_id"), msgid=_S, entry_id=_S, status=_S),
    "NewSubscription": _obj(("filter",), filter=_S, selector=_S, no_local=_B, shared=_B),
    "Message": {
        "type": "object",
        "description": "A message as a consumer would receive it; body_encoding utf-8 or base64.",
    },
    "Consumer": _obj(subscription=_S, consumer=_S, lease_deadline_ms=_I),
    "Link": _obj(("source", "target"), source=_S, target=_S, backward=_B),
    "TopicObject": _obj(
        ("name", "topic_string"),
        name=_S,
        topic_string=_S,
        attributes=_ref("Attributes"),
        description=_S,
        altered_ms=_I,
    ),
    "NewTopicObject": _obj(("topic_string",), topic_string=_S, attributes=_ref("Attributes"), description=_S),
    "DeclaredTopic": _obj(topic=_S, declared_ms=_I, source=_S),
    "DeadLetters": _obj(
        dead_letters={"type": "array", "items": {"type": "object"}},
        problems=_LIST_S,
        by_reason={"type": "object", "additionalProperties": _I},
    ),
    "DeadLetter": {
        "type": "object",
        "description": "One dead letter with every field (text, or hex of bytes).",
    },
    "DeadLetterSelection": _obj(
        ids=_LIST_S, reason=_S, publisher=_S, topic=_S, subscription=_S, all=_B, keep=_B
    ),
    "ReplayReport": _obj(
        replayed=_LIST_S,
        requeued=_LIST_S,
        kept=_B,
        live_workers=_I,
        skipped={"type": "array", "items": _obj(id=_S, why=_S)},
    ),
    "Purged": _obj(("purged",), purged=_I),
    "Worker": _obj(name=_S, pid={}, processed={}, heartbeat_age_ms=_I, state=_S),
    "Channels": _obj(network={"type": ["object", "null"]}, problems=_LIST_S),
    "User": _obj(
        ("name", "role"), name=_S, role=_S, publisher_ids=_LIST_S, client_id=_S, peers=_LIST_S, created_ms=_I
    ),
    "Grants": {
        "type": "object",
        "additionalProperties": _obj(
            publish=_LIST_S, publish_objects=_LIST_S, subscribe=_LIST_S, subscribe_objects=_LIST_S
        ),
    },
    "Grant": _obj(publish=_LIST_S, publish_objects=_LIST_S, subscribe=_LIST_S, subscribe_objects=_LIST_S),
    "Revocation": _obj(
        publish=_LIST_S, publish_objects=_LIST_S, subscribe=_LIST_S, subscribe_objects=_LIST_S, all=_B
    ),
    "ImportReport": _obj(
        created={"type": "object", "additionalProperties": _LIST_S},
        kept={"type": "object", "additionalProperties": _LIST_S},
        skipped={"type": "object", "additionalProperties": _LIST_S},
        notes=_LIST_S,
    ),
}


@dataclass(frozen=True)
class Operation:
    """One endpoint: ``method`` on ``/api`` + ``path``; ``role`` the least role that may call it."""

    method: str
    path: str
    summary: str
    answer: dict[str, Any] | None
    body: str | None = None
    status: int = 200
    query: tuple[tuple[str, str], ...] = ()

    @property
    def role(self) -> str:
        return "monitor" if self.method == "get" else "admin"


_SUB = "/subscriptions/{sub_id}"
_FILTERS = (
    ("reason", "a substring of the reason, any case"),
    ("publisher", "the publisher id"),
    ("topic", "the topic string"),
    ("subscription", "the subscription a poison message came from"),
    ("count", "the most answers, 1-1000"),
)

#: Every endpoint, in the order of docs/operations.md.
OPERATIONS: tuple[Operation, ...] = (
    Operation("get", "/whoami", "The caller: user, role, and (a session) its CSRF token", _ref("Whoami")),
    Operation("get", "/overview", "The queue manager's snapshot, rates and memory", _ref("Overview")),
    Operation("get", "/samples", "The charts' samples of the last hour (the console's own ring)", _ref("Samples")),
    Operation("post", "/publish", "Publish one message (handed to the broker; 202)", _ref("Published"), "Publication",
              202),
    Operation("get", "/subscriptions", "Every subscription with its queue's figures", _array("Subscription")),
    Operation("get", _SUB, "One subscription, with its consumers' leases", _ref("Subscription")),
    Operation("put", _SUB, "Create a durable subscription <client id>$<name> (201; 200 when it exists the same)",
              _ref("Subscription"), "NewSubscription", 201),
    Operation("delete", _SUB, "Delete a subscription with its queue and consumers", None, status=204),
    Operation("delete", _SUB + "/contents", "Purge the messages waiting in a subscription's queue", _ref("Purged")),
    Operation("get", _SUB + "/messages", "The next N waiting messages, left in the queue (browse)",
              _array("Message"), query=(("count", "how many, 1-1000 (default 10)"),)),
    Operation("get", "/consumers", "Every live consumer of every subscription", _array("Consumer")),
    Operation("get", "/links", "Every link", _array("Link")),
    Operation("post", "/links", "Link source to target", _ref("Link"), "Link", 201),
    Operation("delete", "/links", "Remove the link from source to target", None, status=204,
              query=(("source", "the source topic"), ("target", "the target topic"))),
    Operation("get", "/topic-objects", "Every topic object", _array("TopicObject")),
    Operation("get", "/topic-objects/{name}", "One topic object", _ref("TopicObject")),
    Operation("put", "/topic-objects/{name}", "Define (or redefine, same topic string) a topic object",
              _ref("TopicObject"), "NewTopicObject", 201),
    Operation("delete", "/topic-objects/{name}", "Delete a topic object", None, status=204),
    Operation("get", "/declared-topics", "Every declared topic (swiftmq)", _array("DeclaredTopic")),
    Operation("put", "/declared-topics/{topic}", "Declare a topic", _obj(topic=_S), status=201),
    Operation("delete", "/declared-topics/{topic}", "Remove a declared topic", None, status=204),
    Operation("get", "/dead-letters", "Dead letters, oldest first, and the count by reason",
              _ref("DeadLetters"), query=_FILTERS),
    Operation("get", "/dead-letters/{dlq_id}", "One dead letter with every field", _ref("DeadLetter")),
    Operation("post", "/dead-letters/replay", "Replay the selected dead letters", _ref("ReplayReport"),
              "DeadLetterSelection"),
    Operation("post", "/dead-letters/purge", "Delete the selected dead letters", _ref("Purged"),
              "DeadLetterSelection"),
    Operation("get", "/workers", "Every worker heartbeat", _array("Worker")),
    Operation("get", "/channels", "The network's queue managers and channels", _ref("Channels")),
    Operation("get", "/users", "The users the broker made (never a password)", _array("User")),
    Operation("get", "/grants", "Every user's grants", _ref("Grants")),
    Operation("post", "/grants/{user}", "Grant a user topic filters or topic objects (broker acl grant)",
              _ref("Grant"), "Grant"),
    Operation("post", "/grants/{user}/revoke", "Revoke a user's grants, or all of them (broker acl revoke)",
              _ref("Grant"), "Revocation"),
    Operation("get", "/definitions", "Export the definitions document", _ref("Definitions")),
    Operation("post", "/definitions", "Import a definitions document (refused whole, nothing written, when bad)",
              _ref("ImportReport"), "Definitions",
              query=(("skip_users", "true: leave out the users the queue manager lacks (403 without it "
                                    "when the caller may not make ACL users)"),)),
)  # fmt: skip

_ERRORS = {
    "400": "bad input",
    "401": "not authenticated",
    "403": "refused: the role, the CSRF token, or Redis",
    "404": "no such object",
    "409": "a conflict with what exists",
    "503": "Redis cannot be reached",
}


def _operation(op: Operation) -> dict[str, Any]:
    params = [
        {"name": name[1:-1], "in": "path", "required": True, "schema": _S}
        for name in op.path.split("/")
        if name.startswith("{")
    ]
    params += [
        {"name": n, "in": "query", "required": False, "schema": _S, "description": d} for n, d in op.query
    ]
    ok: dict[str, Any] = {"description": "done"}
    if op.answer is not None:
        ok["content"] = {"application/json": {"schema": op.answer}}
    error = {"content": {"application/json": {"schema": _ref("Error")}}}
    answers = {str(op.status): ok, **{code: {"description": d, **error} for code, d in _ERRORS.items()}}
    doc: dict[str, Any] = {
        "summary": op.summary,
        "description": f"Role: {op.role} (or admin).",
        "operationId": f"{op.method}_{op.path.strip('/').replace('/', '_').replace('{', '').replace('}', '')}",
        "responses": answers,
    }
    if params:
        doc["parameters"] = params
    if op.body is not None:
        doc["requestBody"] = {"required": True, "content": {"application/json": {"schema": _ref(op.body)}}}
    return doc


def document() -> dict[str, Any]:
    """The OpenAPI 3.1 document of the management API (a JSON-ready dict)."""
    schemas = dict(SCHEMAS)
    model = Definitions.model_json_schema(ref_template="#/components/schemas/{model}")
    schemas.update(model.pop("$defs", {}))
    schemas["Definitions"] = model
    schemas["Attributes"] = Attributes.model_json_schema(ref_template="#/components/schemas/{model}")
    paths: dict[str, dict[str, Any]] = {}
    for op in OPERATIONS:
        paths.setdefault("/api" + op.path, {})[op.method] = _operation(op)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "broker management API",
            "version": API_VERSION,
            "description": "JSON under /api/. Monitor reads (GET); admin also writes. HTTP basic auth, or the "
            "console's session cookie with its CSRF token in X-CSRF-Token on writes. See docs/operations.md.",
        },
        "security": [{"basic": []}, {"session": []}],
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                "basic": {"type": "http", "scheme": "basic"},
                "session": {"type": "apiKey", "in": "cookie", "name": "broker_console"},
            },
        },
    }
