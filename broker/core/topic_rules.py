"""Topic names, topic filters, subscription matching and topic links.

The rules are those of MQTT 5 §4.7 ("Topic Names and Topic Filters"),
followed exactly:

* A topic is a string of levels separated by ``/`` (§4.7.1.1). Empty levels
  are allowed and significant: ``/finance`` has the two levels ``""`` and
  ``"finance"``, ``a//b`` has an empty middle level, and ``/a`` is not ``a``.
* Topic names (what a publication is published on) and topic filters (what a
  subscription names) are at least one character long, at most 65,535 bytes
  of UTF-8, and never contain U+0000 (§4.7.3). They are case-sensitive and
  may contain spaces.
* A topic name must not contain a wildcard character (``+`` or ``#``)
  anywhere (§4.7.1).
* In a filter, the single-level wildcard ``+`` must occupy a whole level
  (§4.7.1.3) and matches exactly one level, possibly empty: ``sport/+``
  matches ``sport/`` but not ``sport``. The multi-level wildcard ``#`` must be
  the whole last level (§4.7.1.2) and matches the parent level and any number
  of child levels: ``sport/#`` matches ``sport`` and ``sport/x/y``.
* Topics whose first level starts with ``$`` (such as ``$SYS/...``) are not
  matched by a filter whose first level is ``+`` or ``#`` (§4.7.2): ``#``
  does not match ``$SYS/monitor/Clients`` but ``$SYS/#`` does.

Seed 001 asks the broker to tell a publisher how an invalid topic can be
amended, hence :func:`suggest_topic`. Seed 001 also asks for a fast match of a
topic against many subscriptions: :class:`TopicIndex` keeps exact filters in a
hash table and wildcard filters in a trie over levels, so the cost of a match
grows with the depth of the topic, never with the number of subscriptions.

Seed 000 asks for administratively linked topics: a publication on a topic is
also delivered on every topic linked from it, transitively. :class:`LinkGraph`
refuses links that would close a cycle unless they are explicitly requested
as backward links, and cuts the loops those create when a publication is
fanned out.
"""

from __future__ import annotations

import re
from collections import deque

from broker.core.errors import (
    InvalidLink,
    InvalidTopic,
    InvalidTopicFilter,
    LinkCycle,
    NoSuchLink,
    shown,
)

__all__ = [
    "LEVEL_SEPARATOR",
    "MAX_TOPIC_BYTES",
    "LinkGraph",
    "TopicIndex",
    "is_wildcard",
    "limit_problem",
    "matches",
    "suggest_topic",
    "validate_filter",
    "validate_topic",
]

MAX_TOPIC_BYTES = 65535
LEVEL_SEPARATOR = "/"

_SINGLE = "+"
_MULTI = "#"
_WILDCARDS = frozenset(_SINGLE + _MULTI)
_SYSTEM_PREFIX = "$"
#: Control characters MQTT 5 §1.5.4 says a UTF-8 string SHOULD NOT contain (a receiver MAY refuse them).
_CONTROL = re.compile("[\x01-\x1f\x7f-\x9f]")


def _encoded_length(text: str) -> int | None:
    """Return the length of ``text`` in UTF-8.

    Args:
        text: the string to measure.

    Returns:
        The number of bytes, or None when the string holds a lone surrogate
        and so has no UTF-8 encoding.
    """
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:
        return None


def common_problem(text: str) -> str | None:
    """Check the rules that topic names and topic filters share.

    Args:
        text: a topic name or a topic filter.

    Returns:
        Why ``text`` breaks a shared rule, or None when it breaks none.
    """
    if not text:
        return "it must be at least one character long"
    if "\x00" in text:
        return "it must not contain the null character U+0000"
    control = _CONTROL.search(text)
    if control is not None:
        return f"it must not contain the control character U+{ord(control.group()):04X} (MQTT 5 §1.5.4)"
    size = _encoded_length(text)
    if size is None:
        return "it is not valid UTF-8 (it contains a lone surrogate)"
    if size > MAX_TOPIC_BYTES:
        return f"it is {size} bytes long in UTF-8, more than the {MAX_TOPIC_BYTES} allowed"
    return None


def _topic_problem(topic: str) -> str | None:
    """Check every rule for a topic name.

    Args:
        topic: the topic name to check.

    Returns:
        Why ``topic`` is invalid, or None when it is valid.
    """
    problem = common_problem(topic)
    if problem is not None:
        return problem
    if _SINGLE in topic or _MULTI in topic:
        return "a topic name must not contain the wildcard characters '+' or '#'"
    return None


def _filter_problem(topic_filter: str) -> str | None:
    """Check every rule for a topic filter.

    Args:
        topic_filter: the topic filter to check.

    Returns:
        Why ``topic_filter`` is invalid, or None when it is valid.
    """
    problem = common_problem(topic_filter)
    if problem is not None:
        return problem
    if _SINGLE not in topic_filter and _MULTI not in topic_filter:
        return None
    levels = topic_filter.split(LEVEL_SEPARATOR)
    last = len(levels) - 1
    for position, level in enumerate(levels):
        if _SINGLE in level and level != _SINGLE:
            return f"'+' must occupy a whole level, not be part of level {level!r}"
        if _MULTI in level:
            if level != _MULTI:
                return f"'#' must occupy a whole level, not be part of level {level!r}"
            if position != last:
                return "'#' must be the last level of a filter"
    return None


def limit_problem(
    text: str, max_bytes: int, max_levels: int, separator: str = LEVEL_SEPARATOR, subject: str = "it"
) -> str | None:
    """Check a topic or filter against the broker's limits (``Settings.max_topic_bytes`` and
    ``max_topic_levels``), stricter than MQTT's 65,535 bytes; cheap enough for every publication.

    Args:
        text: a topic name or a topic filter (without a ``$share/<ShareName>/`` prefix).
        max_bytes: the most bytes of UTF-8.
        max_levels: the most levels, counted between ``separator`` s.
        separator: ``/``, or ``.`` under the swiftmq scheme (whose levels are nodes).
        subject: how the reason names ``text`` ("it", "the topic").

    Returns:
        Why ``text`` is over a limit (naming the setting), or None.
    """
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        return f"{subject} is {size} bytes long, more than the broker allows (max_topic_bytes {max_bytes})"
    levels = text.count(separator) + 1
    if levels > max_levels:
        what = "nodes" if separator != LEVEL_SEPARATOR else "levels"
        return f"{subject} has {levels} {what}, more than the broker allows (max_topic_levels {max_levels})"
    return None


def validate_topic(topic: str) -> str:
    """Check a topic name (the topic a publication is published on).

    Args:
        topic: the topic name to check.

    Returns:
        ``topic`` itself, when it is valid.

    Raises:
        InvalidTopic: when ``topic`` breaks a rule of MQTT 5 §4.7; its
            ``suggestion`` holds :func:`suggest_topic` of the topic, or None
            when no correction can be proposed.
    """
    problem = _topic_problem(topic)
    if problem is not None:
        raise InvalidTopic(topic, problem, suggest_topic(topic))
    return topic


#: The prefix of an MQTT 5 shared subscription's filter: ``$share/<ShareName>/<filter>`` (§4.8.2).
SHARE_PREFIX = "$share/"


def split_shared(topic_filter: str) -> tuple[str, str]:
    """Split an MQTT 5 shared subscription filter into ``(ShareName, filter)``.

    ``$share/<ShareName>/<filter>`` (MQTT 5 §4.8.2): the ShareName is at least
    one character with no ``/``, ``+`` or ``#``, followed by ``/`` and a
    non-empty valid filter that is not itself a ``$share/`` filter (EMQX refuses
    ``$share/g1/$share/t``). Any other filter is returned as ``("", topic_filter)``.

    Raises:
        InvalidTopicFilter: the filter starts with ``$share/`` but breaks those rules.
    """
    if not topic_filter.startswith(SHARE_PREFIX):
        return "", topic_filter
    share, sep, inner = topic_filter[len(SHARE_PREFIX) :].partition(LEVEL_SEPARATOR)
    if not share:
        raise InvalidTopicFilter(topic_filter, "a $share filter needs a ShareName of at least one character")
    if _SINGLE in share or _MULTI in share:
        raise InvalidTopicFilter(topic_filter, "a ShareName must not contain '+' or '#' (MQTT 5 §4.8.2)")
    if not sep or not inner:
        raise InvalidTopicFilter(
            topic_filter, "a $share filter needs '/' and a topic filter after the ShareName"
        )
    if inner.startswith(SHARE_PREFIX):  # EMQX refuses it too: one subscription is shared once
        raise InvalidTopicFilter(
            topic_filter, "the topic filter after the ShareName must not be a $share filter"
        )
    return share, inner


def validate_filter(topic_filter: str) -> str:
    """Check a topic filter (what a subscription names), plain or ``$share/<ShareName>/<filter>``.

    Args:
        topic_filter: the topic filter to check.

    Returns:
        ``topic_filter`` itself, when it is valid.

    Raises:
        InvalidTopicFilter: when ``topic_filter`` breaks a rule of MQTT 5 §4.7,
            or the shared subscription syntax of §4.8.2.
    """
    _, inner = split_shared(topic_filter)
    problem = _filter_problem(inner)
    if problem is not None:
        raise InvalidTopicFilter(topic_filter, problem)
    return topic_filter


def is_wildcard(topic_filter: str) -> bool:
    """Tell whether a topic filter has a wildcard level.

    Args:
        topic_filter: a topic filter, assumed valid.

    Returns:
        True when the filter has a ``+`` or ``#`` level, so that it can match
        more than one topic name.
    """
    return _SINGLE in topic_filter or _MULTI in topic_filter


def _levels_match(filter_levels: list[str], topic_levels: list[str]) -> bool:
    """Match the levels of a valid filter against those of a valid topic.

    Args:
        filter_levels: the filter split on the level separator.
        topic_levels: the topic name split on the level separator.

    Returns:
        True when the filter matches the topic name.
    """
    if topic_levels[0].startswith(_SYSTEM_PREFIX) and filter_levels[0] in (
        _SINGLE,
        _MULTI,
    ):
        return False
    for position, level in enumerate(filter_levels):
        if level == _MULTI:
            return True
        if position >= len(topic_levels):
            return False
        if level != _SINGLE and level != topic_levels[position]:
            return False
    return len(filter_levels) == len(topic_levels)


def matches(topic_filter: str, topic: str) -> bool:
    """Tell whether a topic filter matches a topic name.

    Args:
        topic_filter: the subscription's topic filter; a shared subscription's
            ``$share/<ShareName>/<filter>`` matches as its filter part (MQTT 5 §4.8.2).
        topic: the publication's topic name.

    Returns:
        True when the filter matches the topic name under MQTT 5 §4.7.

    Raises:
        InvalidTopicFilter: when ``topic_filter`` is invalid.
        InvalidTopic: when ``topic`` is invalid.
    """
    validate_filter(topic_filter)
    validate_topic(topic)
    _, inner = split_shared(topic_filter)
    return _levels_match(inner.split(LEVEL_SEPARATOR), topic.split(LEVEL_SEPARATOR))


def _truncate(topic: str) -> str | None:
    """Cut a topic name at a level boundary so that it fits the size limit.

    Args:
        topic: the topic name to cut, encodable in UTF-8.

    Returns:
        The longest run of whole leading levels that fits in
        ``MAX_TOPIC_BYTES``, or None when not even the first level fits or
        the result would be empty.
    """
    kept: list[str] = []
    size = -1  # the first level has no separator before it
    for level in topic.split(LEVEL_SEPARATOR):
        size += len(level.encode("utf-8")) + 1
        if size > MAX_TOPIC_BYTES:
            break
        kept.append(level)
    truncated = LEVEL_SEPARATOR.join(kept)
    return truncated or None


def strip_invalid_characters(text: str) -> str:
    """``text`` without U+0000, control characters and lone surrogates (for a suggested correction)."""
    return _CONTROL.sub(
        "", "".join(char for char in text if char != "\x00" and not "\ud800" <= char <= "\udfff")
    )


def suggest_topic(topic: str) -> str | None:
    """Propose a valid topic name close to an invalid one.

    The correction removes U+0000, control characters and lone surrogates, drops every level made
    only of wildcard characters (``sport/#`` becomes ``sport``, ``a/+/b``
    becomes ``a/b``), removes the wildcard characters from levels that mix
    them with text (``sport/tennis#`` becomes ``sport/tennis``), and, when the
    result is too long, cuts it at the last level boundary under the limit.

    Args:
        topic: the topic name to correct; a valid one is returned unchanged.

    Returns:
        A valid topic name, or None when no correction can be proposed (for
        example when the topic is made only of wildcard levels).
    """
    if _topic_problem(topic) is None:
        return topic
    cleaned = strip_invalid_characters(topic)
    levels: list[str] = []
    for level in cleaned.split(LEVEL_SEPARATOR):
        stripped = "".join(char for char in level if char not in _WILDCARDS)
        if stripped or not level:
            levels.append(stripped)
        # else: the level was made only of wildcard characters; drop it.
    candidate: str | None = LEVEL_SEPARATOR.join(levels)
    if candidate and len(candidate.encode("utf-8")) > MAX_TOPIC_BYTES:
        candidate = _truncate(candidate)
    if not candidate or _topic_problem(candidate) is not None:
        return None
    return candidate


class _Node:
    """One level of the wildcard trie of :class:`TopicIndex`.

    Every container is created on first use and dropped again when it
    empties, so that a node costs little more than its four slots.

    Attributes:
        children: literal next level -> child node, or None.
        plus: the child node for a ``+`` level, or None.
        subs: ids of the subscriptions whose filter ends at this node, or None.
        hash_subs: ids of the subscriptions whose filter is this node's path
            followed by ``#``, or None.
    """

    __slots__ = ("children", "hash_subs", "plus", "subs")

    def __init__(self) -> None:
        self.children: dict[str, _Node] | None = None
        self.plus: _Node | None = None
        self.subs: set[str] | None = None
        self.hash_subs: set[str] | None = None

    def is_empty(self) -> bool:
        """Tell whether the node holds nothing and can be pruned.

        Returns:
            True when the node has no child and no subscription.
        """
        return not (self.children or self.plus or self.subs or self.hash_subs)

    def child(self, level: str) -> _Node | None:
        """Return the child for a filter level, without creating it.

        Args:
            level: a filter level other than ``#``; ``+`` means the plus child.

        Returns:
            The child node, or None when there is none.
        """
        if level == _SINGLE:
            return self.plus
        if self.children is None:
            return None
        return self.children.get(level)

    def child_or_new(self, level: str) -> _Node:
        """Return the child for a filter level, creating it when missing.

        Args:
            level: a filter level other than ``#``; ``+`` means the plus child.

        Returns:
            The child node.
        """
        if level == _SINGLE:
            if self.plus is None:
                self.plus = _Node()
            return self.plus
        if self.children is None:
            self.children = {}
        node = self.children.get(level)
        if node is None:
            node = self.children[level] = _Node()
        return node

    def drop_child(self, level: str) -> None:
        """Remove the child for a filter level.

        Args:
            level: a filter level other than ``#``; ``+`` means the plus child.
        """
        if level == _SINGLE:
            self.plus = None
        elif self.children is not None:
            self.children.pop(level, None)
            if not self.children:
                self.children = None


class TopicIndex:
    """The subscriptions of a broker, indexed for matching topic names.

    Exact filters (with no wildcard level) live in a dict from topic name to
    subscription ids; wildcard filters live in a trie over levels. A match
    does one dict lookup and walks the trie along the topic's levels,
    following both the literal child and the ``+`` child at each level, so
    its cost grows with the depth of the topic and never with the number of
    subscriptions.
    """

    __slots__ = ("_count", "_exact", "_root")

    def __init__(self) -> None:
        self._exact: dict[str, set[str]] = {}
        self._root = _Node()
        self._count = 0

    def __len__(self) -> int:
        """Return the number of (filter, subscription id) entries.

        Returns:
            The number of entries.
        """
        return self._count

    def add(self, topic_filter: str, sub_id: str) -> None:
        """Index a subscription; adding the same entry twice is a no-op.

        Args:
            topic_filter: the subscription's filter, assumed already valid.
            sub_id: the subscription's id.
        """
        if not is_wildcard(topic_filter):
            ids = self._exact.get(topic_filter)
            if ids is None:
                ids = self._exact[topic_filter] = set()
        else:
            node = self._root
            levels = topic_filter.split(LEVEL_SEPARATOR)
            if levels[-1] == _MULTI:
                for level in levels[:-1]:
                    node = node.child_or_new(level)
                if node.hash_subs is None:
                    node.hash_subs = set()
                ids = node.hash_subs
            else:
                for level in levels:
                    node = node.child_or_new(level)
                if node.subs is None:
                    node.subs = set()
                ids = node.subs
        if sub_id not in ids:
            ids.add(sub_id)
            self._count += 1

    def remove(self, topic_filter: str, sub_id: str) -> bool:
        """Remove a subscription from the index and prune emptied trie nodes.

        Args:
            topic_filter: the subscription's filter, as it was added.
            sub_id: the subscription's id.

        Returns:
            True when the entry was indexed, False when it was not.
        """
        if not is_wildcard(topic_filter):
            ids = self._exact.get(topic_filter)
            if ids is None or sub_id not in ids:
                return False
            ids.discard(sub_id)
            if not ids:
                del self._exact[topic_filter]
            self._count -= 1
            return True

        levels = topic_filter.split(LEVEL_SEPARATOR)
        multi = levels[-1] == _MULTI
        if multi:
            levels.pop()
        path: list[tuple[_Node, str]] = []
        node = self._root
        for level in levels:
            child = node.child(level)
            if child is None:
                return False
            path.append((node, level))
            node = child
        if multi:
            if node.hash_subs is None or sub_id not in node.hash_subs:
                return False
            node.hash_subs.discard(sub_id)
            if not node.hash_subs:
                node.hash_subs = None
        else:
            if node.subs is None or sub_id not in node.subs:
                return False
            node.subs.discard(sub_id)
            if not node.subs:
                node.subs = None
        self._count -= 1
        for parent, level in reversed(path):
            if not node.is_empty():
                break
            parent.drop_child(level)
            node = parent
        return True

    def match(self, topic: str) -> set[str]:
        """Find the subscriptions whose filter matches a topic name.

        Args:
            topic: the publication's topic name, assumed valid.

        Returns:
            The ids of the matching subscriptions, in a new set.
        """
        found: set[str] = set()
        exact = self._exact.get(topic)
        if exact:
            found.update(exact)

        levels = topic.split(LEVEL_SEPARATOR)
        root = self._root
        # The root step on its own: a '$' topic skips the root's '+' and '#'.
        system = levels[0].startswith(_SYSTEM_PREFIX)
        current: list[_Node] = []
        if not system:
            if root.hash_subs:
                found.update(root.hash_subs)
            if root.plus is not None:
                current.append(root.plus)
        if root.children is not None:
            child = root.children.get(levels[0])
            if child is not None:
                current.append(child)

        for level in levels[1:]:
            if not current:
                return found
            following: list[_Node] = []
            for node in current:
                if node.hash_subs:
                    found.update(node.hash_subs)
                if node.children is not None:
                    child = node.children.get(level)
                    if child is not None:
                        following.append(child)
                if node.plus is not None:
                    following.append(node.plus)
            current = following

        for node in current:
            if node.subs:
                found.update(node.subs)
            if node.hash_subs:
                found.update(node.hash_subs)  # 'a/#' matches the parent level 'a'
        return found


class LinkGraph:
    """Administratively linked topics (seed 000).

    A link from a source topic name to a target topic name makes every
    publication on the source also published on the target, transitively.
    A link that would close a cycle is refused at link time unless it is
    requested as a backward link; the loops that backward links make are cut
    when a publication is fanned out (:meth:`closure`).
    """

    __slots__ = ("_targets",)

    def __init__(self) -> None:
        self._targets: dict[str, dict[str, bool]] = {}

    def __len__(self) -> int:
        """The number of topics with at least one link from them."""
        return len(self._targets)

    def sources(self) -> list[str]:
        """The topics with at least one link from them."""
        return list(self._targets)

    def add(self, source: str, target: str, backward: bool = False) -> None:
        """Link a source topic to a target topic.

        Adding an existing link again only updates its backward flag; turning
        a backward link into a forward one checks for a cycle like a new link.
        A link of a topic to itself is accepted and changes no delivery: seed 000
        says linked topics "can be recursive, either simply by referring to
        themselves or cyclically", and a publication is delivered on each topic
        once (:meth:`closure`). It is listed and removed like any other link.

        Args:
            source: the topic name publications are copied from.
            target: the topic name publications are copied to.
            backward: True to allow the link to close a cycle.

        Raises:
            InvalidLink: when a topic name is invalid.
            LinkCycle: when ``target`` (another topic) already reaches ``source`` through
                existing links and ``backward`` is False; its ``path`` is the
                chain from ``target`` to ``source``.
        """
        for topic in (source, target):
            try:
                validate_topic(topic)
            except InvalidTopic as exc:
                raise InvalidLink(f"cannot link {shown(source)} -> {shown(target)}: {exc.reason}") from exc
        existing = self._targets.get(source, {}).get(target)
        if not backward and existing is not False and source != target:
            path = self.find_path(target, source)
            if path is not None:
                raise LinkCycle(source, target, path)
        self._targets.setdefault(source, {})[target] = backward

    def remove(self, source: str, target: str) -> None:
        """Remove the link from a source topic to a target topic.

        Args:
            source: the link's source topic name.
            target: the link's target topic name.

        Raises:
            NoSuchLink: when there is no such link.
        """
        targets = self._targets.get(source)
        if targets is None or target not in targets:
            raise NoSuchLink(f"there is no link {shown(source)} -> {shown(target)}")
        del targets[target]
        if not targets:
            del self._targets[source]

    def targets(self, source: str) -> dict[str, bool]:
        """Return the direct targets of a topic.

        Args:
            source: a topic name.

        Returns:
            A new dict from each target directly linked from ``source`` to
            the link's backward flag; empty when there is none.
        """
        return dict(self._targets.get(source, {}))

    def links(self) -> list[tuple[str, str, bool]]:
        """Return every link.

        Returns:
            The ``(source, target, backward)`` triples, sorted.
        """
        return sorted(
            (source, target, backward)
            for source, targets in self._targets.items()
            for target, backward in targets.items()
        )

    def closure(self, topic: str) -> list[str]:
        """Return the topics a publication on ``topic`` is delivered on.

        Args:
            topic: the publication's topic name.

        Returns:
            ``topic`` followed by every topic reachable from it through links,
            transitively, breadth-first (the targets of one topic in sorted
            order), each topic once, so loops closed by backward links end.
        """
        order = [topic]
        seen = {topic}
        queue = deque(order)
        while queue:
            current = queue.popleft()
            for target in sorted(self._targets.get(current, ())):
                if target not in seen:
                    seen.add(target)
                    order.append(target)
                    queue.append(target)
        return order

    def find_path(self, start: str, goal: str) -> list[str] | None:
        """Find a chain of links from one topic to another.

        Args:
            start: the topic name the chain starts from.
            goal: the topic name the chain ends at.

        Returns:
            A shortest chain ``[start, ..., goal]`` where each topic links to
            the next (``[start]`` when ``start`` equals ``goal``), or None when
            ``goal`` cannot be reached from ``start``.
        """
        if start == goal:
            return [start]
        parents: dict[str, str] = {start: start}
        queue = deque([start])
        while queue:
            current = queue.popleft()
            for target in sorted(self._targets.get(current, ())):
                if target in parents:
                    continue
                parents[target] = current
                if target == goal:
                    path = [goal]
                    while path[-1] != start:
                        path.append(parents[path[-1]])
                    path.reverse()
                    return path
                queue.append(target)
        return None
