"""``broker.scripts``: the one registry of the broker's Lua scripts."""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

import fakeredis
import pytest

from broker.core import scripts


def test_the_registry_names_every_script_in_broker_lua_but_lib() -> None:
    # Given the files shipped in broker/lua
    shipped = {
        p.name[:-4] for p in resources.files("broker").joinpath("lua").iterdir() if p.name.endswith(".lua")
    }
    # Then the registry holds each one but lib.lua (which starts every script)
    assert shipped - {"lib"} == scripts.SCRIPTS


def test_register_gives_a_script_that_starts_with_lib_and_refuses_an_unknown_name() -> None:
    client = fakeredis.FakeRedis()
    script = scripts.register(client, "give_up")
    assert script.script == scripts.script_source("give_up")
    assert "local function require_types" in script.script
    with pytest.raises(KeyError, match="no script 'acks'"):
        scripts.register(client, "acks")


def test_no_module_of_the_product_registers_a_script_itself() -> None:
    # Given every module of the two shipped packages but the registry
    root = Path(__file__).resolve().parents[2]
    sources = [p for d in ("broker", "worker") for p in (root / d).rglob("*.py") if p.name != "scripts.py"]
    # Then none calls register_script or loads a script's source: each asks broker.scripts.register
    own = [str(p) for p in sources if re.search(r"register_script\(|script_source\(", p.read_text())]
    assert sources and own == []


def test_the_function_library_is_lib_then_each_library_file_with_the_protocol_version() -> None:
    from broker.core import keys, library

    # Given the files shipped in broker/lua/library
    shipped = {
        p.name[:-4]
        for p in resources.files("broker").joinpath("lua", "library").iterdir()
        if p.name.endswith(".lua")
    }
    source = library.library_source()
    # Then the library is named broker, carries PROTOCOL_VERSION, starts with lib.lua, and holds
    # every file once, each function registered with a broker_ name
    assert shipped == {"subscription", *library.LIBRARY_FILES}
    assert source.startswith(f"#!lua name=broker\nlocal PROTOCOL_VERSION = {keys.PROTOCOL_VERSION}\n")
    assert source.count("local function require_types") == 1
    names = re.findall(r"function_name = '([a-z_]+)'", source)
    assert sorted(names) == sorted(library.FUNCTIONS)
