"""Scratch directories removed in the background: the name and the parent are free at once."""

from __future__ import annotations

from pathlib import Path

from tidal.mechanisms.criu.discard import discard, empty_trash, trash_of, wait_discarded


def _tree(d: Path) -> Path:
    (d / "sub").mkdir(parents=True)
    (d / "sub" / "pages-1.img").write_bytes(b"x" * 4096)
    return d


def test_discard_frees_the_name_and_the_parent_at_once(tmp_path: Path) -> None:
    area = tmp_path / "staging" / "node-a"
    img = _tree(area / "job-1234")
    discard(img, parent_too=True)
    assert not img.exists() and not area.exists()  # the node's staging area was left empty
    wait_discarded()
    assert list(trash_of(area).iterdir()) == []


def test_parent_kept_while_it_holds_something_else(tmp_path: Path) -> None:
    area = tmp_path / "node-a"
    a, b = _tree(area / "a"), _tree(area / "b")
    discard(a, parent_too=True)
    assert area.exists() and b.exists() and not a.exists()
    discard(area / "missing", parent_too=False)  # gone already: nothing to do
    wait_discarded()
    assert (b / "sub" / "pages-1.img").read_bytes() == b"x" * 4096


def test_empty_trash_removes_what_a_killed_remover_left(tmp_path: Path) -> None:
    area = tmp_path / "node-a"
    left = _tree(trash_of(area) / "job-1-abcd")
    empty_trash(area)
    assert not left.exists() and trash_of(area).exists()
