"""Message selectors: the SQL subset of Jakarta Messaging 3.1 §3.8.1.1.

A selector is a boolean expression over a message's properties and header
fields, such as ``JMSPriority > 4 AND region = 'eu' AND price BETWEEN 10 AND
20``. Shapes:

* properties: a mapping from a name (a user property or a header field such
  as ``JMSPriority``, ``JMSDeliveryMode``, ``JMSType``) to its value. An absent
  name and a value of None are both NULL. Values are ``int`` and ``float``
  (numbers; ``bool`` is *not* a number), ``str`` and ``bool``; a value of any
  other type (bytes, a list) is set but unusable: every test on it is unknown.
* selector text: literals (``'it''s'``, ``57``, ``57L``, ``-957``, ``7E3``,
  ``7.``, ``.5``, ``TRUE``, ``FALSE``), identifiers (case-sensitive, Java
  identifiers that are not keywords), and, from lowest to highest
  precedence: ``OR``; ``AND``; ``NOT``; ``= <> < > <= >=``, ``[NOT] BETWEEN``,
  ``[NOT] IN``, ``[NOT] LIKE ... [ESCAPE ...]``, ``IS [NOT] NULL``; binary
  ``+ -``; ``* /``; unary ``+ -``. Keywords are case-insensitive.

Evaluation uses SQL's three-valued logic: every test is True, False or
unknown (None); a NULL operand, a comparison of unlike types (a string with a
number: never converted), an ordering comparison of strings or booleans,
arithmetic on a non-number and a division by zero are unknown. A message is
selected only when the selector is True. Division is exact, even of two
exact numbers (``size / 4`` is 2.5 when size is 10), as ActiveMQ and Qpid
Broker-J evaluate it (the specification leaves it open). An empty (or blank) selector selects
every message.

A selector is parsed once (a hand-written tokenizer and a recursive-descent
parser) into nested closures, cached by :func:`compile_selector`; evaluating
never re-parses and never raises, whatever the property values.

Errors: :class:`broker.core.errors.InvalidSelector` (a ``ValueError``) for a
selector that does not parse, or whose literals make it wrong whatever the
properties (``5``, ``'a' < 'b'``, ``TRUE > 0``, ``'a' + 1 = 2``), with the 0-based position;
:func:`like` raises it for an invalid pattern or escape character. Its subclass
:class:`broker.core.errors.SelectorTooComplex` refuses a selector over a bound on the
work it costs every publication it is evaluated for: ``MAX_TERMS``, ``MAX_TOKENS``,
``MAX_DEPTH``, ``MAX_PARENS`` here, and its size in bytes (:func:`check_size`,
``Settings.max_selector_bytes``).
"""

from __future__ import annotations

import dataclasses
import functools
import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from broker.core.errors import InvalidSelector, SelectorTooComplex

__all__ = [
    "InvalidSelector",
    "Selector",
    "SelectorTooComplex",
    "check_size",
    "compile_selector",
    "like",
    "select",
]

Evaluator = Callable[[Mapping[str, object]], object]
Comparator = Callable[[Any, Any], object]

KEYWORDS = frozenset({"NULL", "TRUE", "FALSE", "NOT", "AND", "OR", "BETWEEN", "LIKE", "IN", "IS", "ESCAPE"})
#: Bounds on the work of one selector (``SelectorTooComplex``), checked as it is parsed: a
#: subscription's selector is evaluated for every publication its filter matches.
#: Terms: the parsed expression's nodes (identifiers, literals, operators), each string of an
#: IN list and each ``%`` of a LIKE pattern (each a scan of the value). 1,000 terms (333 ORed
#: comparisons, none true) evaluate in 70-140 µs, against 23 ms for the 60,000 comparisons that
#: issue 24 saw accepted; a selector people write has tens.
MAX_TERMS = 1_000
#: Tokens (words, literals, symbols) read before parsing stops: a selector of MAX_TERMS terms
#: has two or three tokens a term, parentheses and commas included.
MAX_TOKENS = 4 * MAX_TERMS
#: Deepest nesting of parentheses, and of operators: bounds the parser's and the evaluation's
#: recursion (Eclipse Amlen allows 255 levels of parentheses and 32 of operators).
MAX_PARENS = 50
MAX_DEPTH = 200

_COMPARISONS: dict[str, Comparator] = {
    "=": operator.eq,
    "<>": operator.ne,
    "<": operator.lt,
    ">": operator.gt,
    "<=": operator.le,
    ">=": operator.ge,
}
#: Numeric literals: ASCII digits only (Java's), not every character ``str.isdigit`` accepts.
_NUMBER = re.compile(
    r"(?:\d+\.\d*|\.\d+)(?:[eE][+-]?\d+)?[fFdD]?|\d+(?:[eE][+-]?\d+[fFdD]?|[fFdD]|[lL])?", re.ASCII
)
_DIGITS = frozenset("0123456789")
_OPERATORS = ("<>", "<=", ">=", "=", "<", ">", "+", "-", "*", "/", "(", ")", ",")
_PLAIN = frozenset({int, float, str, bool, type(None)})
#: The value of a property of an unsupported type: set (IS NOT NULL), but unknown in every test.
_UNUSABLE = object()


# --------------------------------------------------------------------------
# Values and three-valued logic


def _normalize(value: object) -> object:
    """``value`` as a plain int, float, str or bool, or ``_UNUSABLE``: no user code runs after this."""
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int.__int__(value)  # an IntEnum or int subclass, without its overrides
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, str):
        return str.__str__(value)
    return _UNUSABLE


def _compare(op: Comparator, left: object, right: object) -> bool | None:
    """``op`` on two values: numbers with numbers, strings and booleans with their own kind and only by = / <>."""
    lt, rt = type(left), type(right)
    if lt is int or lt is float:
        return bool(op(left, right)) if rt is int or rt is float else None
    if (lt is str or lt is bool) and lt is rt and (op is operator.eq or op is operator.ne):
        return bool(op(left, right))
    return None


def _divide(left: int | float, right: int | float) -> float | None:
    """``left / right``, exact even for two ints (``10 / 4`` is 2.5, as ActiveMQ and Qpid Broker-J
    divide); by zero is unknown."""
    if right == 0:
        return None
    return left / right


_ARITHMETIC: dict[str, Callable[[int | float, int | float], int | float | None]] = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": _divide,
}


def _not(value: object) -> bool | None:
    return None if value is None else not value


def _negation(inner: Evaluator) -> Evaluator:
    return lambda properties: _not(inner(properties))


def _constant(value: object) -> Evaluator:
    return lambda _properties: value


def _identifier(name: str) -> Evaluator:
    def evaluate(properties: Mapping[str, object]) -> object:
        value = properties.get(name)
        return value if type(value) in _PLAIN else _normalize(value)

    return evaluate


def _truth(inner: Evaluator) -> Evaluator:
    """An operand in a boolean position: anything but True or False is unknown."""

    def evaluate(properties: Mapping[str, object]) -> object:
        value = inner(properties)
        return value if value is True or value is False else None

    return evaluate


def _all(operands: tuple[Evaluator, ...]) -> Evaluator:
    """SQL AND: False if any is False, else unknown if any is unknown, else True."""

    def evaluate(properties: Mapping[str, object]) -> object:
        result: bool | None = True
        for operand in operands:
            value = operand(properties)
            if value is False:
                return False
            if value is None:
                result = None
        return result

    return evaluate


def _any(operands: tuple[Evaluator, ...]) -> Evaluator:
    """SQL OR: True if any is True, else unknown if any is unknown, else False."""

    def evaluate(properties: Mapping[str, object]) -> object:
        result: bool | None = False
        for operand in operands:
            value = operand(properties)
            if value is True:
                return True
            if value is None:
                result = None
        return result

    return evaluate


def _comparison(op: Comparator, left: Evaluator, right: _Expr) -> Evaluator:
    if right.const:
        value = right.value
        return lambda properties: _compare(op, left(properties), value)
    right_fn = right.fn
    return lambda properties: _compare(op, left(properties), right_fn(properties))


def _arithmetic(symbol: str, left: Evaluator, right: Evaluator) -> Evaluator:
    op = _ARITHMETIC[symbol]

    def evaluate(properties: Mapping[str, object]) -> object:
        a, b = left(properties), right(properties)
        if (type(a) is int or type(a) is float) and (type(b) is int or type(b) is float):
            try:
                return op(a, b)
            except (ArithmeticError, ValueError):  # an int too large for a float
                return None
        return None

    return evaluate


def _sign(negate: bool, inner: Evaluator) -> Evaluator:
    def evaluate(properties: Mapping[str, object]) -> object:
        value = inner(properties)
        if type(value) is int or type(value) is float:
            return -value if negate else value
        return None

    return evaluate


def _between(value: Evaluator, low: Evaluator, high: Evaluator, negated: bool) -> Evaluator:
    """``value BETWEEN low AND high`` is ``value >= low AND value <= high``; NOT BETWEEN its negation."""

    def evaluate(properties: Mapping[str, object]) -> object:
        v = value(properties)
        above = _compare(operator.ge, v, low(properties))
        below = _compare(operator.le, v, high(properties))
        result = (
            False if above is False or below is False else (None if above is None or below is None else True)
        )
        return _not(result) if negated else result

    return evaluate


def _membership(value: Evaluator, choices: frozenset[str], negated: bool) -> Evaluator:
    def evaluate(properties: Mapping[str, object]) -> object:
        v = value(properties)
        if type(v) is not str:
            return None
        return (v not in choices) if negated else (v in choices)

    return evaluate


def _likeness(value: Evaluator, regex: re.Pattern[str], negated: bool) -> Evaluator:
    def evaluate(properties: Mapping[str, object]) -> object:
        v = value(properties)
        if type(v) is not str:
            return None
        return (regex.fullmatch(v) is None) if negated else (regex.fullmatch(v) is not None)

    return evaluate


def _nullness(value: Evaluator, negated: bool) -> Evaluator:
    return lambda properties: (value(properties) is not None) if negated else (value(properties) is None)


# --------------------------------------------------------------------------
# LIKE


@functools.lru_cache(maxsize=1024)
def _like_regex(pattern: str, escape: str | None) -> re.Pattern[str]:
    """The regular expression (``fullmatch``, DOTALL) of a LIKE pattern; raises InvalidSelector."""
    if escape is not None and len(escape) != 1:
        raise InvalidSelector(pattern, 0, f"the escape must be exactly one character, not {escape!r}")
    # The pattern's runs between '%' (each of fixed length: characters and '_'), as regexes.
    runs: list[list[str]] = [[]]
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if char == escape:
            if i + 1 == len(pattern):
                raise InvalidSelector(pattern, i, f"escape character {escape!r} at the end of the pattern")
            following = pattern[i + 1]
            if following not in ("%", "_", escape):
                raise InvalidSelector(pattern, i, f"escape character {escape!r} before {following!r}")
            runs[-1].append(re.escape(following))
            i += 2
            continue
        if char == "%":
            runs.append([])
        else:
            runs[-1].append("." if char == "_" else re.escape(char))
        i += 1
    parts = ["".join(run) for run in runs]
    if len(parts) == 1:
        return re.compile(parts[0], re.DOTALL)
    # First run at the start, last run at the end, each run between at its earliest place after
    # the one before: the earliest place leaves the most room, so it is never wrong, and the
    # atomic group (?>...) keeps the engine from trying the others. ".*a.*a.*b" without it
    # backtracks through every placement: "%a%a%a%a%a%a%a%a%a%a%a%a%b" against forty "a"s
    # would take hours (a selector or a swiftmq predicate node would stall the worker).
    first, *middle, last = parts
    return re.compile(first + "".join(f"(?>.*?{run})" for run in middle if run) + ".*" + last, re.DOTALL)


def like_regex(pattern: str, escape: str | None = None) -> re.Pattern[str]:
    """The compiled form of a SQL LIKE pattern: ``like_regex(p, e).fullmatch(v)`` is ``like(p, v, e)``.

    Raises:
        InvalidSelector: as ``like``.
    """
    return _like_regex(pattern, escape)


def like(pattern: str, value: str, escape: str | None = None) -> bool:
    """Whether the whole of ``value`` matches the SQL LIKE ``pattern`` (case-sensitive).

    ``%`` matches any run of characters (empty too), ``_`` exactly one, and
    ``escape`` makes the character after it (``%``, ``_`` or ``escape``
    itself) literal.

    Raises:
        InvalidSelector: ``escape`` is not exactly one character, or in the
            pattern it is last or followed by another character.
    """
    return _like_regex(pattern, escape).fullmatch(value) is not None


# --------------------------------------------------------------------------
# Tokenizer


@dataclass(frozen=True, slots=True)
class _Token:
    kind: str  # "str", "num", "ident", "kw" (text upper-cased), "op" or "end"
    text: str
    pos: int
    value: object = None

    def describe(self) -> str:
        if self.kind == "end":
            return "the end of the selector"
        if self.kind == "kw":
            return f"keyword {self.text}"
        return f"{self.text!r}"


def _number(selector: str, start: int) -> _Token:
    match = _NUMBER.match(selector, start)
    assert match is not None  # the caller saw a digit, or a dot and a digit
    text, end = match.group(), match.end()
    if end < len(selector) and (selector[end].isalnum() or selector[end] in "_$."):
        while end < len(selector) and (selector[end].isalnum() or selector[end] in "_$."):
            end += 1
        raise InvalidSelector(selector, start, f"malformed number {selector[start:end]!r}")
    if any(c in text for c in ".eE") or text[-1] in "fFdD":
        return _Token("num", text, start, float(text.rstrip("fFdD")))
    digits = text.rstrip("lL")
    if len(digits) > 1 and digits[0] == "0":
        raise InvalidSelector(selector, start, f"octal number {text!r} is not supported")
    try:
        value = int(digits)
    except ValueError:  # more digits than Python converts (sys.get_int_max_str_digits)
        raise InvalidSelector(selector, start, f"the number has too many digits ({len(digits)})") from None
    return _Token("num", text, start, value)


def _too_complex(
    selector: str, pos: int, limit: str, maximum: int, found: int, what: str
) -> SelectorTooComplex:
    reason = f"{what}, more than the broker allows ({limit} {maximum})"
    return SelectorTooComplex(selector, pos, limit, maximum, found, reason)


def _tokenize(selector: str) -> list[_Token]:
    """The tokens of ``selector``, ending with an "end" token; raises InvalidSelector (SelectorTooComplex
    past ``MAX_TOKENS``)."""
    tokens: list[_Token] = []
    i, n = 0, len(selector)
    while i < n:
        if len(tokens) == MAX_TOKENS:
            raise _too_complex(
                selector, i, "MAX_TOKENS", MAX_TOKENS, MAX_TOKENS + 1, f"it has more than {MAX_TOKENS} tokens"
            )
        char = selector[i]
        if char.isspace():
            i += 1
        elif char == "'":
            parts: list[str] = []
            j = i + 1
            while True:
                close = selector.find("'", j)
                if close < 0:
                    raise InvalidSelector(selector, i, "unterminated string literal")
                parts.append(selector[j:close])
                if not selector.startswith("'", close + 1):
                    break
                parts.append("'")
                j = close + 2
            tokens.append(_Token("str", selector[i : close + 1], i, "".join(parts)))
            i = close + 1
        elif char in _DIGITS or (char == "." and selector[i + 1 : i + 2] in _DIGITS):
            token = _number(selector, i)
            tokens.append(token)
            i += len(token.text)
        elif char.isalpha() or char in "_$":
            j = i + 1
            while j < n and (selector[j].isalnum() or selector[j] in "_$"):
                j += 1
            word = selector[i:j]
            upper = word.upper()
            tokens.append(_Token("kw", upper, i) if upper in KEYWORDS else _Token("ident", word, i))
            i = j
        else:
            symbol = next((op for op in _OPERATORS if selector.startswith(op, i)), None)
            if symbol is None:
                raise InvalidSelector(selector, i, f"unexpected character {char!r}")
            tokens.append(_Token("op", symbol, i))
            i += len(symbol)
    tokens.append(_Token("end", "", n))
    return tokens


# --------------------------------------------------------------------------
# Parser


@dataclass(frozen=True, slots=True)
class _Expr:
    """A parsed expression: its closure, its static kind, where it starts, how deep it nests."""

    fn: Evaluator
    kind: str  # "bool", "num", "str" or "any" (an identifier: known only from the properties)
    pos: int
    depth: int = 1
    name: str | None = None  # the identifier, when the expression is one
    const: bool = False  # fn ignores the properties and returns value
    value: object = None


class _Parser:
    """Recursive descent over the tokens, one method a precedence level, lowest first."""

    def __init__(self, selector: str) -> None:
        self.selector = selector
        self.tokens = _tokenize(selector)
        self.index = 0
        self.parens = 0
        self.terms = 0

    def error(self, pos: int, reason: str) -> InvalidSelector:
        return InvalidSelector(self.selector, pos, reason)

    def peek(self) -> _Token:
        return self.tokens[self.index]

    def advance(self) -> _Token:
        token = self.tokens[self.index]
        if token.kind != "end":
            self.index += 1
        return token

    def at(self, kind: str, *texts: str) -> bool:
        token = self.tokens[self.index]
        return token.kind == kind and token.text in texts

    def expect(self, kind: str, text: str, reason: str) -> _Token:
        token = self.advance()
        if token.kind != kind or token.text != text:
            raise self.error(token.pos, self.found(reason, token))
        return token

    @staticmethod
    def found(reason: str, token: _Token) -> str:
        return reason if token.kind == "end" else f"{reason}, found {token.describe()}"

    def count(self, pos: int, terms: int = 1) -> None:
        """Count ``terms`` more terms; past ``MAX_TERMS`` the selector is refused."""
        self.terms += terms
        if self.terms > MAX_TERMS:
            raise _too_complex(
                self.selector,
                pos,
                "MAX_TERMS",
                MAX_TERMS,
                self.terms,
                f"it has more than {MAX_TERMS} terms (identifiers, literals, operators, "
                "strings of IN lists, % of LIKE patterns)",
            )

    def node(self, fn: Evaluator, kind: str, pos: int, *children: _Expr) -> _Expr:
        """A new expression over ``children``: too deep is an error, over constants it is folded."""
        self.count(pos)
        depth = 1 + max((child.depth for child in children), default=0)
        if depth > MAX_DEPTH:
            raise _too_complex(
                self.selector, pos, "MAX_DEPTH", MAX_DEPTH, depth, f"it nests operators {depth} deep"
            )
        if children and all(child.const for child in children):
            value = fn({})
            return _Expr(_constant(value), kind, pos, depth, const=True, value=value)
        return _Expr(fn, kind, pos, depth)

    def boolean(self, expr: _Expr) -> _Expr:
        if expr.kind in ("num", "str"):
            kind = "numeric" if expr.kind == "num" else "string"
            raise self.error(expr.pos, f"expected a boolean expression, found a {kind} expression")
        if expr.kind == "any":
            return self.node(_truth(expr.fn), "bool", expr.pos, expr)
        return expr

    def numeric(self, expr: _Expr) -> _Expr:
        if expr.kind in ("str", "bool"):
            kind = "string" if expr.kind == "str" else "boolean"
            raise self.error(expr.pos, f"expected a numeric expression, found a {kind} expression")
        return expr

    def identifier(self, expr: _Expr, keyword: str) -> None:
        if expr.name is None:
            raise self.error(expr.pos, f"{keyword} needs an identifier on its left")

    def parse(self) -> _Expr:
        expr = self.disjunction()
        token = self.peek()
        if token.kind != "end":
            raise self.error(token.pos, f"unexpected {token.describe()} after a complete expression")
        return self.boolean(expr)

    def disjunction(self) -> _Expr:
        return self.chain("OR", self.conjunction, _any)

    def conjunction(self) -> _Expr:
        return self.chain("AND", self.negation, _all)

    def chain(
        self,
        keyword: str,
        operand: Callable[[], _Expr],
        combine: Callable[[tuple[Evaluator, ...]], Evaluator],
    ) -> _Expr:
        first = operand()
        if not self.at("kw", keyword):
            return first
        operands = [self.boolean(first)]
        while self.at("kw", keyword):
            self.advance()
            operands.append(self.boolean(operand()))
        return self.node(combine(tuple(o.fn for o in operands)), "bool", first.pos, *operands)

    def negation(self) -> _Expr:
        nots: list[int] = []
        while self.at("kw", "NOT"):
            nots.append(self.advance().pos)
        expr = self.predicate()
        for pos in reversed(nots):
            operand = self.boolean(expr)
            expr = self.node(_negation(operand.fn), "bool", pos, operand)
        return expr

    def predicate(self) -> _Expr:
        left = self.additive()
        token = self.peek()
        if token.kind == "op" and token.text in _COMPARISONS:
            self.advance()
            right = self.additive()
            kinds = {left.kind, right.kind}
            if "bool" in kinds and kinds & {"num", "str"}:  # JORAM's conformance tests: TRUE > 0
                raise self.error(token.pos, "a boolean can only be compared with a boolean or a property")
            if token.text not in ("=", "<>") and kinds <= {"str", "bool"}:
                raise self.error(token.pos, "strings and booleans can only be compared with = or <>")
            return self.node(
                _comparison(_COMPARISONS[token.text], left.fn, right), "bool", left.pos, left, right
            )
        negated = self.at("kw", "NOT")
        if negated:
            self.advance()
            if not self.at("kw", "BETWEEN", "IN", "LIKE"):
                raise self.error(
                    self.peek().pos, self.found("expected BETWEEN, IN or LIKE after NOT", self.peek())
                )
        if self.at("kw", "BETWEEN"):
            self.advance()
            low = self.numeric(self.additive())
            self.expect("kw", "AND", "expected AND between the bounds of BETWEEN")
            high = self.numeric(self.additive())
            left = self.numeric(left)
            return self.node(_between(left.fn, low.fn, high.fn, negated), "bool", left.pos, left, low, high)
        if self.at("kw", "IN"):
            return self.membership(left, negated)
        if self.at("kw", "LIKE"):
            return self.likeness(left, negated)
        if self.at("kw", "IS"):
            self.advance()
            self.identifier(left, "IS NULL")
            negated = self.at("kw", "NOT")
            if negated:
                self.advance()
            self.expect("kw", "NULL", "expected NULL after IS" + (" NOT" if negated else ""))
            return self.node(_nullness(left.fn, negated), "bool", left.pos, left)
        return left

    def membership(self, left: _Expr, negated: bool) -> _Expr:
        self.advance()  # IN
        self.identifier(left, "IN")
        self.expect("op", "(", "expected '(' after IN")
        choices: list[str] = []
        while True:
            token = self.advance()
            if token.kind != "str":
                raise self.error(token.pos, self.found("expected a string literal in the IN list", token))
            self.count(token.pos)
            choices.append(str(token.value))
            token = self.advance()
            if token.kind == "op" and token.text == ")":
                break
            if not (token.kind == "op" and token.text == ","):
                raise self.error(token.pos, self.found("expected ',' or ')' in the IN list", token))
        return self.node(_membership(left.fn, frozenset(choices), negated), "bool", left.pos, left)

    def likeness(self, left: _Expr, negated: bool) -> _Expr:
        self.advance()  # LIKE
        self.identifier(left, "LIKE")
        pattern = self.advance()
        if pattern.kind != "str":
            raise self.error(pattern.pos, self.found("expected a string literal pattern after LIKE", pattern))
        escape: str | None = None
        if self.at("kw", "ESCAPE"):
            self.advance()
            token = self.advance()
            if token.kind != "str":
                raise self.error(token.pos, self.found("expected a string literal after ESCAPE", token))
            escape = str(token.value)
            if len(escape) != 1:
                raise self.error(token.pos, f"the escape must be exactly one character, not {escape!r}")
        self.count(pattern.pos, str(pattern.value).count("%"))
        try:
            regex = _like_regex(str(pattern.value), escape)
        except InvalidSelector as exc:
            raise self.error(pattern.pos, f"invalid LIKE pattern: {exc.reason}") from None
        return self.node(_likeness(left.fn, regex, negated), "bool", left.pos, left)

    def additive(self) -> _Expr:
        return self.arithmetic(("+", "-"), self.multiplicative)

    def multiplicative(self) -> _Expr:
        return self.arithmetic(("*", "/"), self.unary)

    def arithmetic(self, symbols: tuple[str, ...], operand: Callable[[], _Expr]) -> _Expr:
        left = operand()
        while self.at("op", *symbols):
            symbol = self.advance().text
            left = self.numeric(left)
            right = self.numeric(operand())
            left = self.node(_arithmetic(symbol, left.fn, right.fn), "num", left.pos, left, right)
        return left

    def unary(self) -> _Expr:
        signs: list[_Token] = []
        while self.at("op", "+", "-"):
            signs.append(self.advance())
        expr = self.primary()
        for sign in reversed(signs):
            operand = self.numeric(expr)
            expr = self.node(_sign(sign.text == "-", operand.fn), "num", sign.pos, operand)
        return expr

    def primary(self) -> _Expr:
        token = self.advance()
        if token.kind in ("num", "str", "ident", "kw"):
            self.count(token.pos)
        if token.kind == "num":
            return _Expr(_constant(token.value), "num", token.pos, const=True, value=token.value)
        if token.kind == "str":
            return _Expr(_constant(token.value), "str", token.pos, const=True, value=token.value)
        if token.kind == "ident":
            return _Expr(_identifier(token.text), "any", token.pos, name=token.text)
        if token.kind == "kw" and token.text in ("TRUE", "FALSE"):
            value = token.text == "TRUE"
            return _Expr(_constant(value), "bool", token.pos, const=True, value=value)
        if token.kind == "kw" and token.text == "NULL":
            raise self.error(token.pos, "NULL is allowed only in IS NULL and IS NOT NULL")
        if token.kind == "op" and token.text == "(":
            self.parens += 1
            if self.parens > MAX_PARENS:
                raise _too_complex(
                    self.selector,
                    token.pos,
                    "MAX_PARENS",
                    MAX_PARENS,
                    self.parens,
                    f"it nests parentheses {self.parens} deep",
                )
            inner = self.disjunction()
            self.expect("op", ")", "expected ')'")
            self.parens -= 1
            return dataclasses.replace(inner, pos=token.pos)
        raise self.error(token.pos, self.found("expected an expression", token))


# --------------------------------------------------------------------------
# Public interface


@dataclass(frozen=True, slots=True)
class Selector:
    """A compiled selector: ``text`` as given, and :meth:`matches` to evaluate it."""

    text: str
    _evaluate: Evaluator = field(repr=False, compare=False)

    def matches(self, properties: Mapping[str, object]) -> bool:
        """Whether the selector is True (not False, not unknown) for ``properties``; never raises."""
        return self._evaluate(properties) is True


@functools.lru_cache(maxsize=1024)
def compile_selector(selector: str) -> Selector:
    """Parse ``selector`` once into a :class:`Selector` (cached by text).

    An empty or blank selector selects every message. The work a selector may cost is
    bounded (``MAX_TERMS``, ``MAX_TOKENS``, ``MAX_DEPTH``, ``MAX_PARENS``); its size in
    bytes is the caller's to check (:func:`check_size`, ``Settings.max_selector_bytes``).

    Raises:
        InvalidSelector: the selector does not parse, or is wrong whatever the
            properties (not boolean, an ordering of string literals, a boolean
            compared with a number or a string, a string in arithmetic); ``position``
            says where.
        SelectorTooComplex: (an ``InvalidSelector``) it has more terms or tokens, or nests
            deeper, than those bounds, or deeper than this process's stack lets it be parsed.
    """
    if not selector.strip():
        return Selector(selector, _constant(True))
    parser = _Parser(selector)
    try:
        return Selector(selector, parser.parse().fn)
    except RecursionError:  # a caller deep in its own stack: the bounds above did not suffice
        token = parser.tokens[parser.index]
        reason = f"it nests parentheses {parser.parens} deep, more than this process's stack allows"
        raise SelectorTooComplex(
            selector, token.pos, "MAX_PARENS", MAX_PARENS, parser.parens, reason
        ) from None


def selector_bytes(selector: str) -> int:
    """The size of ``selector`` in bytes of UTF-8 (a lone surrogate counts its 3 bytes)."""
    return len(selector.encode("utf-8", "surrogatepass"))


def check_size(selector: str, max_bytes: int) -> None:
    """Refuse a selector longer than ``max_bytes`` bytes of UTF-8 (``Settings.max_selector_bytes``).

    Checked before the selector is parsed: a long text costs its parse.

    Raises:
        SelectorTooComplex: ``selector`` is longer; ``found`` is its size in bytes.
    """
    size = selector_bytes(selector)
    if size > max_bytes:
        raise _too_complex(selector, 0, "max_selector_bytes", max_bytes, size, f"it is {size} bytes long")


def select(selector: str, properties: Mapping[str, object]) -> bool:
    """Whether ``selector`` selects a message with ``properties`` (absent or None is NULL).

    Raises:
        InvalidSelector: the selector is invalid (see :func:`compile_selector`).
    """
    return compile_selector(selector).matches(properties)
