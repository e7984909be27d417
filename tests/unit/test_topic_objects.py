"""Topic object records and inheritance, without a server."""

from __future__ import annotations

import pytest

from broker.core.errors import ConfigError, CorruptRecord
from broker.topics.topic_objects import (
    BASE,
    Attributes,
    TopicObject,
    TopicTree,
    fixed_prefix,
    load_file,
    parent_of,
)


def _tree(*objects: TopicObject) -> TopicTree:
    return TopicTree.parse("QM", {o.name: o.to_json() for o in objects})


def test_parent_walk_and_fixed_prefix():
    assert [parent_of(t) for t in ("/a/b", "/a", "", "a")] == ["/a", "", None, ""]
    assert (
        fixed_prefix("/PAY/+/EU") == "/PAY"
        and fixed_prefix("#") == ""
        and fixed_prefix("$share/g/a/#") == "a"
    )


def test_base_defaults_keep_the_behaviour_without_objects_and_the_tree_is_trivial():
    tree = _tree()
    assert tree.trivial
    effective = tree.effective("/any/topic")
    assert (effective["pub"], effective["defprty"], effective["defpsist"], effective["maxdepth"]) == (
        "ENABLED",
        4,
        "YES",
        "NOLIMIT",
    )
    assert set(effective.source.values()) == {BASE}


def test_closest_object_wins_and_asparent_walks_up():
    tree = _tree(
        TopicObject(name="A", topic_string="/a", attributes=Attributes(defprty=1, usedlq="NO")),
        TopicObject(name="AB", topic_string="/a/b", attributes=Attributes(defprty=2)),
        TopicObject(name="W", topic_string="/a/b/w", attributes=Attributes(wildcard="BLOCK")),
    )
    assert not tree.trivial
    assert tree.effective("/a/b/c")["defprty"] == 2 and tree.effective("/a/c")["defprty"] == 1
    assert tree.effective("/a/b/c")["usedlq"] == "NO"
    assert tree.effective("/a/b/w/x").blocks == 4 and tree.effective("/a/b/w/x").blocked_by == "W"
    assert tree.effective("/a/b")["wildcard"] == "PASSTHRU"  # WILDCARD belongs to one object


def test_a_corrupt_object_is_skipped_and_named():
    tree = TopicTree.parse(
        "QM",
        {
            b"OK": b'{"topic_string":"/ok"}',
            b"BAD": b"not json",
            b"ODD": b'{"topic_string":"/o","pub":"MAYBE"}',
        },
    )
    assert "OK" in tree.objects and "BAD" not in tree.objects and "ODD" not in tree.objects
    assert {p.field for p in tree.problems} == {"BAD", "ODD"}
    with pytest.raises(CorruptRecord):
        TopicObject.from_json("X", '{"topic_string":"/x","defprty":10}')


def test_a_bad_topic_file_is_one_clear_error(tmp_path):
    path = tmp_path / "t.toml"
    path.write_text('[[topic]]\nname = "A"\ntopic_string = "/a"\nmaxdepth = -1\n')
    with pytest.raises(ConfigError, match="MAXDEPTH must be >= 0"):
        load_file(path)
    path.write_text('[[topic]]\ntopic_string = "/a"\n')
    with pytest.raises(ConfigError, match="has no 'name'"):
        load_file(path)
