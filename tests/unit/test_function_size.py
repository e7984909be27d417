"""Function size: no function in ``broker/`` or ``worker/`` over ``MAX_LINES`` lines (STYLE.md, issue 26).

A function's lines run from its ``def`` to its last line (``end_lineno - lineno + 1``: the
docstring counts, decorators do not); methods and nested functions are measured too.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: The most lines a function may have.
MAX_LINES = 120

#: Functions allowed over ``MAX_LINES``: pure data tables only (a literal the function returns),
#: ``"<path from the repository root>:<qualified name>": why``. None today.
ALLOWED: dict[str, str] = {}


def long_functions(source: str, path: str, max_lines: int = MAX_LINES) -> dict[str, int]:
    """``"<path>:<qualified name>" -> lines`` of every function in ``source`` over ``max_lines``."""
    found: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = prefix + child.name
                assert child.end_lineno is not None
                lines = child.end_lineno - child.lineno + 1
                if lines > max_lines:
                    found[f"{path}:{name}"] = lines
                visit(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return found


def _function(name: str, lines: int, indent: str = "") -> str:
    """Source of a function ``name`` of ``lines`` lines."""
    return f"{indent}def {name}(self=None):\n" + "".join(
        f"{indent}    x{i} = {i}\n" for i in range(lines - 1)
    )


def test_a_function_over_the_limit_is_found_with_its_qualified_name_and_lines():
    # Given a method one line over the limit, a function holding one that is, and one at the limit
    source = (
        "class C:\n"
        + _function("long", MAX_LINES + 1, "    ")
        + "def outer():\n"
        + _function("inner", MAX_LINES + 1, "    ")
        + _function("at_limit", MAX_LINES)
    )

    # When it is measured
    found = long_functions(source, "m.py")

    # Then the long ones are named with their lines, and the one at the limit is not
    assert found == {
        "m.py:C.long": MAX_LINES + 1,
        "m.py:outer": MAX_LINES + 2,
        "m.py:outer.inner": MAX_LINES + 1,
    }


def test_no_function_in_broker_or_worker_is_over_the_limit():
    # Given every module of the two shipped packages
    found: dict[str, int] = {}
    for package in ("broker", "worker"):
        for path in sorted((ROOT / package).rglob("*.py")):
            found.update(long_functions(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT))))

    # Then none is over the limit but the data tables allowed
    over = {name: lines for name, lines in found.items() if name not in ALLOWED}
    assert not over, f"functions over {MAX_LINES} lines (split them into named steps): {over}"
    assert not set(ALLOWED) - set(found), "an allowed function is no longer long: remove it from ALLOWED"
