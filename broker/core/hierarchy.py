"""SwiftMQ's topic hierarchies and SQL-LIKE predicate topics (seed 003): the ``swiftmq`` topic scheme.

A topic is a string of **nodes** separated by ``.``: ``<roottopic>.<subtopic>.<subsubtopic>``
(``iit.sales.EU``). The rules, from SwiftMQ's Topic Manager:

* **Publishing** to a node reaches the node and all its sub-nodes: a publication on
  ``iit.sales`` reaches the subscribers of ``iit.sales``, ``iit.sales.US`` and
  ``iit.sales.EU``.
* **Subscribing** to a node receives what is published on the node, on its parents and
  on its sub-nodes: a subscription to ``iit.sales.US`` receives what is published on
  ``iit``, ``iit.sales`` and ``iit.sales.US``; one to ``iit.sales`` also receives
  ``iit.sales.EU``, but nothing of ``iit.projects``.
  So a subscription matches a publication when one of the two, node by node, is a
  prefix of the other.
* A subscriber receives a message **once**, however many of its topics match.
* Every node after the root may be a **SQL-LIKE predicate**: ``%`` matches any run of
  characters (empty too), ``_`` exactly one, ``\\`` makes the next ``%``, ``_`` or ``\\``
  literal (``iit.%.US``). A predicate never spans a ``.``: it matches one node. A
  node whose only special characters are escaped is a plain node (``a\\_b`` is ``a_b``).
  The **root** node cannot be a predicate (``i%.%.swiftmq`` is refused).
* **Direct subscriber selection** (the default, ``direct_subscriber_selection``): a
  publication's topic is a plain string (``%`` and ``_`` in it are ordinary
  characters), matched against the subscriptions' predicates.
  **Indirect selection**: the publication's topic is itself a predicate; it selects
  among the **declared** topics (SwiftMQ's ``<topics>``; ``broker topic declare``) the
  nodes it addresses and their sub-nodes, and each selected topic is then matched
  against the subscriptions as in direct selection. A topic that is not declared
  reaches nobody in this mode.

Topic names and filters follow the size and character rules of the mqtt scheme (at
least one character, at most 65,535 bytes of UTF-8, no U+0000, no control characters);
in addition no node may be empty (``iit..US``, ``.iit``, ``iit.`` are refused, with a
suggested correction for a publication).

Matching keeps two indexes (seed 001's "cost grows with the topic, not with the number
of subscriptions"): plain subscriptions in a trie of literal nodes, walked by dict
lookups along the publication's nodes; predicate subscriptions in a trie of their own,
whose predicate children are tried at the nodes that have them. A plain topic's match
never looks at a predicate, so it costs the same whatever the number of predicate
subscriptions (``python -m scripts.bench --only swiftmq`` measures both).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

from broker.core.errors import InvalidSelector, InvalidTopic, InvalidTopicFilter
from broker.core.selectors import like_regex
from broker.core.topic_rules import MAX_TOPIC_BYTES, common_problem, strip_invalid_characters

__all__ = [
    "ESCAPE",
    "SEPARATOR",
    "DeclaredTopics",
    "HierarchyIndex",
    "is_predicate",
    "matches",
    "suggest_topic",
    "validate_filter",
    "validate_predicate_topic",
    "validate_topic",
]

SEPARATOR = "."
ESCAPE = "\\"
_WILD = frozenset("%_")


def _string_problem(text: str) -> str | None:
    """The rules a swiftmq topic name and a swiftmq filter share; None when ``text`` keeps them.

    Those of the mqtt scheme (``broker.core.topic_rules.common_problem``), and no empty node.
    """
    problem = common_problem(text)
    if problem is not None:
        return problem
    if any(not node for node in text.split(SEPARATOR)):
        return "a node must not be empty (two '.' in a row, or a '.' first or last)"
    return None


def _node_pattern(node: str) -> re.Pattern[str] | None:
    """Parse one node of a filter: None for a plain node, else its compiled SQL-LIKE predicate.

    The predicate's semantics are ``broker.core.selectors.like`` with ``\\`` as the escape.

    Raises:
        InvalidSelector: a ``\\`` last, or before a character other than ``%``, ``_`` or ``\\``.
    """
    if ESCAPE not in node and not _WILD.intersection(node):
        return None
    regex = like_regex(node, ESCAPE)  # checks the escapes
    i = 0
    while i < len(node):
        if node[i] == ESCAPE:
            i += 2
            continue
        if node[i] in _WILD:
            return regex
        i += 1
    return None


def _unescaped(node: str) -> str:
    """A plain node as the string it stands for: ``a\\_b`` -> ``a_b``."""
    if ESCAPE not in node:
        return node
    return re.sub(r"\\(.)", r"\1", node)


def is_predicate(node: str) -> bool:
    """Whether a filter node is a SQL-LIKE predicate (an unescaped ``%`` or ``_``).

    Raises:
        InvalidSelector: the node's escapes are invalid.
    """
    return _node_pattern(node) is not None


def _parse_filter(topic_filter: str) -> list[tuple[str, re.Pattern[str] | None]]:
    """A valid filter as ``[(node, compiled predicate or None)]``; plain nodes unescaped.

    Raises:
        InvalidTopicFilter: the filter breaks a rule (the reason names it).
    """
    problem = _string_problem(topic_filter)
    if problem is not None:
        raise InvalidTopicFilter(topic_filter, problem)
    parsed: list[tuple[str, re.Pattern[str] | None]] = []
    for position, node in enumerate(topic_filter.split(SEPARATOR)):
        try:
            pattern = _node_pattern(node)
        except InvalidSelector as exc:
            raise InvalidTopicFilter(topic_filter, f"node {node!r}: {exc.reason}") from None
        if pattern is None:
            parsed.append((_unescaped(node), None))
        elif position == 0:
            raise InvalidTopicFilter(
                topic_filter,
                f"the root node {node!r} cannot be a predicate (SwiftMQ: root nodes cannot be addressed "
                "as a predicate; escape '%' and '_' as '\\%' and '\\_' to mean them literally)",
            )
        else:
            parsed.append((node, pattern))
    return parsed


def suggest_topic(topic: str) -> str | None:
    """A valid topic name close to an invalid one: control characters and empty nodes removed.

    Returns:
        The correction, ``topic`` itself when it is valid, or None when nothing is left.
    """
    if _string_problem(topic) is None:
        return topic
    cleaned = strip_invalid_characters(topic)
    candidate = SEPARATOR.join(node for node in cleaned.split(SEPARATOR) if node)
    while candidate and len(candidate.encode("utf-8")) > MAX_TOPIC_BYTES:
        candidate = candidate.rpartition(SEPARATOR)[0]
    return candidate if candidate and _string_problem(candidate) is None else None


def validate_topic(topic: str) -> str:
    """Check a topic name published on under direct selection (a plain string).

    Returns:
        ``topic`` itself.

    Raises:
        InvalidTopic: it breaks a rule; ``suggestion`` holds a correction or None.
    """
    problem = _string_problem(topic)
    if problem is not None:
        raise InvalidTopic(topic, problem, suggest_topic(topic))
    return topic


def validate_filter(topic_filter: str) -> str:
    """Check a subscription's topic (predicate nodes allowed after the root).

    Returns:
        ``topic_filter`` itself.

    Raises:
        InvalidTopicFilter: it breaks a rule, e.g. a predicate root node (``i%.%.swiftmq``)
            or a ``\\`` that escapes nothing.
    """
    _parse_filter(topic_filter)
    return topic_filter


def _parse_predicate_topic(topic: str) -> list[tuple[str, re.Pattern[str] | None]]:
    """``_parse_filter`` of a published predicate topic, refusing it as a topic (``InvalidTopic``)."""
    try:
        return _parse_filter(topic)
    except InvalidTopicFilter as exc:
        raise InvalidTopic(
            topic, exc.reason, suggest_topic(topic) if _string_problem(topic) else None
        ) from None


def validate_predicate_topic(topic: str) -> str:
    """Check a topic published on under indirect selection: a predicate, like a filter.

    Raises:
        InvalidTopic: it breaks a rule of ``validate_filter`` (the root node cannot be a predicate).
    """
    _parse_predicate_topic(topic)
    return topic


def matches(topic_filter: str, topic: str) -> bool:
    """Whether a subscription to ``topic_filter`` receives a publication on ``topic`` (direct selection).

    The reference definition, node by node: one of the two is a prefix of the
    other, each filter node matching its topic node (equal, or its predicate matches).

    Raises:
        InvalidTopicFilter: the filter is invalid.
        InvalidTopic: the topic is invalid.
    """
    parsed = _parse_filter(topic_filter)
    validate_topic(topic)
    for (node, pattern), level in zip(parsed, topic.split(SEPARATOR), strict=False):
        if pattern is None:
            if node != level:
                return False
        elif pattern.fullmatch(level) is None:
            return False
    return True


def _literal_prefix(node: str) -> str:
    """The characters a predicate node's matches all start with: its text before the first wildcard."""
    out: list[str] = []
    i = 0
    while i < len(node) and node[i] not in _WILD:
        if node[i] == ESCAPE:
            i += 1
        out.append(node[i])
        i += 1
    return "".join(out)


class _Node:
    """One node of a hierarchy trie: literal children, predicate children, and subscriptions ending here.

    Predicate children are grouped by their literal prefix (``d12_`` under ``d12``), so a
    level is tested only against the predicates whose prefix it starts with.
    """

    __slots__ = ("children", "predicates", "subs")

    def __init__(self) -> None:
        self.children: dict[str, _Node] | None = None
        #: literal prefix -> predicate node text -> (compiled predicate, child)
        self.predicates: dict[str, dict[str, tuple[re.Pattern[str], _Node]]] | None = None
        self.subs: set[str] | None = None

    def matching(self, level: str) -> Iterator[_Node]:
        """The predicate children whose predicate matches ``level``."""
        groups = self.predicates
        if not groups:
            return
        if len(groups) <= len(level):
            chosen = [g for prefix, g in groups.items() if level.startswith(prefix)]
        else:
            chosen = [g for i in range(len(level) + 1) if (g := groups.get(level[:i])) is not None]
        for group in chosen:
            for pattern, child in group.values():
                if pattern.fullmatch(level) is not None:
                    yield child

    def is_empty(self) -> bool:
        return not (self.children or self.predicates or self.subs)

    def below(self) -> Iterator[_Node]:
        """Every node under this one (not itself), depth first."""
        stack: list[_Node] = [self]
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            if node.predicates:
                stack.extend(child for group in node.predicates.values() for _, child in group.values())
            if node is not self:
                yield node


class _Trie:
    """Subscriptions by their nodes: ``add``/``remove``/``match`` for one of the two indexes."""

    __slots__ = ("count", "root")

    def __init__(self) -> None:
        self.root = _Node()
        self.count = 0

    def add(self, parsed: list[tuple[str, re.Pattern[str] | None]], sub_id: str) -> None:
        node = self.root
        for text, pattern in parsed:
            if pattern is None:
                if node.children is None:
                    node.children = {}
                child = node.children.get(text)
                if child is None:
                    child = node.children[text] = _Node()
            else:
                if node.predicates is None:
                    node.predicates = {}
                group = node.predicates.setdefault(_literal_prefix(text), {})
                found = group.get(text)
                if found is None:
                    found = group[text] = (pattern, _Node())
                child = found[1]
            node = child
        if node.subs is None:
            node.subs = set()
        if sub_id not in node.subs:
            node.subs.add(sub_id)
            self.count += 1

    def remove(self, parsed: list[tuple[str, re.Pattern[str] | None]], sub_id: str) -> bool:
        path: list[tuple[_Node, str, bool]] = []
        node = self.root
        for text, pattern in parsed:
            if pattern is None:
                child = node.children.get(text) if node.children else None
            else:
                group = node.predicates.get(_literal_prefix(text)) if node.predicates else None
                found = group.get(text) if group else None
                child = found[1] if found else None
            if child is None:
                return False
            path.append((node, text, pattern is not None))
            node = child
        if not node.subs or sub_id not in node.subs:
            return False
        node.subs.discard(sub_id)
        if not node.subs:
            node.subs = None
        self.count -= 1
        for parent, text, predicate in reversed(path):
            if not node.is_empty():
                break
            if predicate and parent.predicates is not None:
                prefix = _literal_prefix(text)
                group = parent.predicates.get(prefix)
                if group is not None:
                    group.pop(text, None)
                    if not group:
                        del parent.predicates[prefix]
            elif parent.children is not None:
                parent.children.pop(text, None)
            if not parent.children:
                parent.children = None
            if not parent.predicates:
                parent.predicates = None
            node = parent
        return True

    def match(self, levels: list[str], found: set[str]) -> None:
        """Add to ``found`` the subscriptions matching the topic of ``levels`` (a prefix either way)."""
        current = [self.root]
        for level in levels:
            following: list[_Node] = []
            for node in current:
                if node.children is not None:
                    child = node.children.get(level)
                    if child is not None:
                        following.append(child)
                if node.predicates is not None:
                    following.extend(node.matching(level))
            if not following:
                return
            for node in following:
                if node.subs:
                    found.update(node.subs)  # the subscription's node is this node or a parent of the topic
            current = following
        for node in current:  # the topic's sub-nodes: every subscription below it
            for below in node.below():
                if below.subs:
                    found.update(below.subs)


class HierarchyIndex:
    """The subscriptions of a queue manager with the swiftmq scheme, indexed for matching.

    Plain subscriptions and predicate subscriptions live in two tries, so that
    a plain topic's match does not grow with the number of predicates. Same
    interface as ``broker.core.topic_rules.TopicIndex``.
    """

    __slots__ = ("_plain", "_predicates")

    def __init__(self) -> None:
        self._plain = _Trie()
        self._predicates = _Trie()

    def __len__(self) -> int:
        """The number of (filter, subscription id) entries."""
        return self._plain.count + self._predicates.count

    @property
    def predicate_count(self) -> int:
        """How many entries have a predicate node."""
        return self._predicates.count

    def _trie(self, parsed: list[tuple[str, re.Pattern[str] | None]]) -> _Trie:
        return self._predicates if any(p is not None for _, p in parsed) else self._plain

    def add(self, topic_filter: str, sub_id: str) -> None:
        """Index a subscription; adding the same entry twice is a no-op.

        Raises:
            InvalidTopicFilter: the filter is invalid for the swiftmq scheme.
        """
        parsed = _parse_filter(topic_filter)
        self._trie(parsed).add(parsed, sub_id)

    def remove(self, topic_filter: str, sub_id: str) -> bool:
        """Remove an entry; True when it was indexed.

        Raises:
            InvalidTopicFilter: the filter is invalid for the swiftmq scheme.
        """
        parsed = _parse_filter(topic_filter)
        return self._trie(parsed).remove(parsed, sub_id)

    def match(self, topic: str) -> set[str]:
        """The ids of the subscriptions that receive a publication on ``topic`` (a plain string), in a new set."""
        found: set[str] = set()
        levels = topic.split(SEPARATOR)
        self._plain.match(levels, found)
        if self._predicates.count:
            self._predicates.match(levels, found)
        return found


class DeclaredTopics:
    """The declared topics (SwiftMQ's ``<topics>``), and indirect selection among them."""

    __slots__ = ("_root", "_topics")

    def __init__(self, topics: Iterable[str] = ()) -> None:
        self._root = _Node()
        self._topics: set[str] = set()
        for topic in topics:
            self.add(topic)

    def __len__(self) -> int:
        return len(self._topics)

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._topics))

    def add(self, topic: str) -> None:
        """Declare ``topic`` (a plain topic name).

        Raises:
            InvalidTopic: the topic name is invalid.
        """
        validate_topic(topic)
        node = self._root
        for level in topic.split(SEPARATOR):
            if node.children is None:
                node.children = {}
            child = node.children.get(level)
            if child is None:
                child = node.children[level] = _Node()
            node = child
        node.subs = {topic}
        self._topics.add(topic)

    def select(self, predicate_topic: str) -> list[str]:
        """The declared topics a publication on ``predicate_topic`` addresses (indirect selection).

        Each node of ``predicate_topic`` selects the declared nodes it matches; the
        publication reaches the declared topics at the selected nodes and under them.

        Returns:
            The selected declared topics, sorted.

        Raises:
            InvalidTopic: ``predicate_topic`` is not a valid predicate topic.
        """
        parsed = _parse_predicate_topic(predicate_topic)
        current = [self._root]
        for text, pattern in parsed:
            following: list[_Node] = []
            for node in current:
                if not node.children:
                    continue
                if pattern is None:
                    child = node.children.get(text)
                    if child is not None:
                        following.append(child)
                else:
                    following.extend(c for name, c in node.children.items() if pattern.fullmatch(name))
            current = following
        selected: set[str] = set()
        for node in current:
            if node.subs:
                selected.update(node.subs)
            for below in node.below():
                if below.subs:
                    selected.update(below.subs)
        return sorted(selected)
