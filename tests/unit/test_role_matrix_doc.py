"""docs/security.md's role x operation table is the one ``tests/integration/role_matrix.py`` prints."""

from __future__ import annotations

import pytest

from tests.integration import role_matrix


def test_the_security_docs_table_is_the_role_matrix_data() -> None:
    # Given docs/security.md; When its table is read; Then it is the table the data prints
    shown = role_matrix.doc_table(role_matrix.DOC.read_text())
    assert shown == role_matrix.markdown(), (
        "docs/security.md's role table differs from tests/integration/role_matrix.py: "
        "run python -m tests.integration.role_matrix --write"
    )


def test_a_doc_with_one_cell_changed_is_seen_to_differ() -> None:
    # Given docs/security.md with one cell flipped by hand
    text = role_matrix.DOC.read_text()
    edited = text.replace("| `FLUSHALL` | denied |", "| `FLUSHALL` | allowed |", 1)
    assert edited != text
    # Then its table is not the data's, and --write puts the data's back
    assert role_matrix.doc_table(edited) != role_matrix.markdown()
    assert role_matrix.doc_table(role_matrix.with_table(edited)) == role_matrix.markdown()


def test_a_doc_without_the_markers_is_refused() -> None:
    with pytest.raises(ValueError, match="no table between"):
        role_matrix.doc_table("# Security\n")
