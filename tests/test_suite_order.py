"""The suite's own scheduling hint (tests/conftest.py): the files named to run first exist, and collection puts
them first in their order while every other test keeps its place."""

from __future__ import annotations

import pathlib
import types

import conftest

TESTS = pathlib.Path(__file__).resolve().parent


def test_every_file_named_to_run_first_exists():
    assert [n for n in conftest.SLOW_FILES_FIRST if not (TESTS / n).is_file()] == []


def test_the_slow_files_go_first_and_the_rest_keep_their_order():
    def item(file, name):
        return types.SimpleNamespace(path=TESTS / file, name=name, get_closest_marker=lambda _: None,
                                     add_marker=lambda _: None)

    first, second = conftest.SLOW_FILES_FIRST[:2]
    items = [item("test_a.py", "a1"), item(second, "s1"), item("test_b.py", "b1"), item(first, "f1"),
             item("test_a.py", "a2"), item(second, "s2"), item(first, "f2")]
    conftest.pytest_collection_modifyitems(None, items)
    assert [i.name for i in items] == ["f1", "f2", "s1", "s2", "a1", "b1", "a2"]


def test_make_test_hands_the_files_to_its_workers_in_collection_order():
    """pytest-xdist 3.6+ reorders --dist loadfile's files by their number of tests unless told not to, which undoes
    the order above (the list went unused that way; the workers ended 58 s apart)."""
    makefile = (TESTS.parent / "Makefile").read_text(encoding="utf-8")
    unit = [line for line in makefile.splitlines() if "--dist loadfile" in line]
    assert len(unit) == 1 and "--no-loadscope-reorder" in unit[0], unit
