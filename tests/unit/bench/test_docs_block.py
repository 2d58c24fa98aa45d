"""``bench.docs_block``: a benchmark's table between its markers, nothing else touched."""

from __future__ import annotations

from pathlib import Path

from bench import docs_block

START, END = "<!-- b:start -->", "<!-- b:end -->"


def test_the_text_between_the_markers_is_replaced_and_the_rest_kept(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(f"before\n{START}\nold\ntable\n{END}\nafter\n")
    assert docs_block.replace_between(page, START, END, "| new |")
    assert page.read_text() == f"before\n{START}\n| new |\n{END}\nafter\n"


def test_a_page_without_its_markers_is_left_alone(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    for text in ("no markers\n", f"{END}\nreversed\n{START}\n"):
        page.write_text(text)
        assert not docs_block.replace_between(page, START, END, "| new |")
        assert page.read_text() == text
