"""docs/map.md, the one-page map, against the tree: every module of ``broker`` and ``worker`` has its
line, and every path the map names exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAP = ROOT / "docs" / "map.md"
PACKAGES = ("broker", "worker")
#: Where a path the map names may start (the repository's top-level folders it describes).
ROOTS = ("broker/", "worker/", "scripts/", "tests/", "docs/", "configs/")


def _named(text: str) -> set[str]:
    """Every code span of the map, as written (a span may hold a path, a name or a command)."""
    return set(re.findall(r"`([^`\n]+)`", text))


def _modules() -> list[str]:
    """Every Python module of the shipped packages, as a path from the repository's root."""
    return sorted(p.relative_to(ROOT).as_posix() for top in PACKAGES for p in (ROOT / top).rglob("*.py"))


def missing_modules(named: set[str], modules: list[str]) -> list[str]:
    """The modules the map does not name. A package's ``__init__.py`` is named by its folder
    (``broker/core/``): the heading of its table says what the package owns."""
    missing = []
    for module in modules:
        if module in named:
            continue
        if module.endswith("/__init__.py") and module.removesuffix("__init__.py") in named:
            continue
        missing.append(module)
    return missing


def gone_paths(named: set[str], root: Path) -> list[str]:
    """The paths the map names that are not in the tree: a ``.py`` or ``.lua`` file or a folder under
    one of ``ROOTS``, or a bare ``name.py`` that no file of the repository is called."""
    here = {p.name for top in (*PACKAGES, "scripts", "tests") for p in (root / top).rglob("*.py")}
    gone = []
    for span in sorted(named):
        if span.startswith(ROOTS) and re.fullmatch(r"[\w/.-]+", span):
            if span.endswith((".py", ".lua", "/")) and not (root / span).exists():
                gone.append(span)
        elif re.fullmatch(r"\w+\.py", span) and span not in here:
            gone.append(span)
    return gone


def test_every_module_of_broker_and_worker_has_its_line_in_the_map():
    # Given the map and the modules of the two shipped packages
    named = _named(MAP.read_text(encoding="utf-8"))
    # Then each module is named in a code span (a package's __init__ by its folder)
    assert missing_modules(named, _modules()) == []


def test_every_path_the_map_names_exists():
    # Given the map
    named = _named(MAP.read_text(encoding="utf-8"))
    # Then every file or folder it names is in the tree
    assert gone_paths(named, ROOT) == []


def test_the_checks_catch_a_module_left_out_and_a_path_that_is_gone():
    # Given a map naming a module that is gone and leaving one out
    named = {"broker/core/", "broker/core/keys.py", "broker/core/gone.py", "gone.py", "worker/"}
    modules = ["broker/core/__init__.py", "broker/core/keys.py", "broker/core/wire.py", "worker/__init__.py"]
    # Then each check names its one
    assert missing_modules(named, modules) == ["broker/core/wire.py"]
    assert gone_paths(named, ROOT) == ["broker/core/gone.py", "gone.py"]
