"""Proposals: hunks, partial application, atomic writes, stale detection, checkpoints and undo."""

import os
import stat

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from openjet_tui.agent.proposals import (EditDecision, ProposalBook, apply_proposal, make_proposal, split_hunks)
from openjet_tui.errors import StaleProposalError, WorkspaceError

OLD = "".join(f"line {i}\n" for i in range(1, 31))


def two_hunk_change(text=OLD):
    return text.replace("line 2\n", "line two\n").replace("line 25\n", "line 25\nline 25b\n")


def test_changes_far_apart_become_two_hunks_with_headers():
    hunks = split_hunks(OLD, two_hunk_change())
    assert len(hunks) == 2
    assert hunks[0].header == "@@ -1,5 +1,5 @@"
    assert hunks[0].lines[:3] == [" line 1", "-line 2", "+line two"]
    assert hunks[1].header == "@@ -23,6 +23,7 @@" and (hunks[1].num_added, hunks[1].num_removed) == (1, 0)


def test_missing_final_newline_is_marked_like_diff_does():
    (hunk,) = split_hunks("a\nb", "a\nc")
    assert hunk.lines == [" a", "-b", "\\ No newline at end of file", "+c", "\\ No newline at end of file"]


def test_partial_application_applies_exactly_the_chosen_hunks(tmp_path):
    target = tmp_path / "f.txt"
    target.write_text(OLD)
    proposal = make_proposal(target, "f.txt", target.read_bytes(), two_hunk_change())
    assert "line two" in proposal.diff() and proposal.diff().startswith("--- a/f.txt\n+++ b/f.txt\n")
    checkpoint = apply_proposal(proposal, frozenset({1}))
    assert target.read_text() == OLD.replace("line 25\n", "line 25\nline 25b\n")
    assert checkpoint.before == OLD.encode()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["a\n", "b\n", "c\n", "d\n", "e"]), max_size=25),
       st.lists(st.sampled_from(["a\n", "b\n", "x\n", "d\n", "y"]), max_size=25), st.data())
def test_any_subset_of_hunks_composes(old_lines, new_lines, data):
    old, new = "".join(old_lines), "".join(new_lines)
    proposal = make_proposal(__import__("pathlib").Path("/nonexistent"), "x", old.encode(), new)
    indices = [h.index for h in proposal.hunks]
    assert proposal.result_text(frozenset(indices)) == new
    assert proposal.result_text(frozenset()) == old
    chosen = frozenset(data.draw(st.lists(st.sampled_from(indices), unique=True)) if indices else [])
    partial = proposal.result_text(chosen)
    # applying the rest on top of the partial result gives the full edit: the hunks are independent
    rest = make_proposal(proposal.path, "x", partial.encode(), new)
    assert rest.result_text(frozenset(h.index for h in rest.hunks)) == new


def test_stale_file_is_refused_and_left_alone(tmp_path):
    target = tmp_path / "f.txt"
    target.write_text(OLD)
    proposal = make_proposal(target, "f.txt", target.read_bytes(), two_hunk_change())
    target.write_text(OLD + "someone else\n")
    with pytest.raises(StaleProposalError, match="changed on disk"):
        apply_proposal(proposal, frozenset({0, 1}))
    assert target.read_text() == OLD + "someone else\n" and proposal.is_stale


def test_new_file_proposal_and_stale_when_created_meanwhile(tmp_path):
    target = tmp_path / "pkg" / "new.py"
    proposal = make_proposal(target, "pkg/new.py", None, "print(1)\n", tool="write_file")
    assert proposal.diff().startswith("--- /dev/null\n+++ b/pkg/new.py\n@@ -0,0 +1,1 @@\n+print(1)")
    checkpoint = apply_proposal(proposal, frozenset({0}))
    assert target.read_text() == "print(1)\n" and checkpoint.before is None
    again = make_proposal(tmp_path / "other.py", "other.py", None, "x\n")
    (tmp_path / "other.py").write_text("y\n")
    with pytest.raises(StaleProposalError):
        apply_proposal(again, frozenset({0}))


def test_write_is_atomic_keeps_mode_and_leaves_no_temp_files(tmp_path):
    target = tmp_path / "run.sh"
    target.write_text("echo a\n")
    target.chmod(0o755)
    apply_proposal(make_proposal(target, "run.sh", target.read_bytes(), "echo b\n"), frozenset({0}))
    assert stat.S_IMODE(target.stat().st_mode) == 0o755
    assert os.listdir(tmp_path) == ["run.sh"]


def test_crlf_line_endings_survive_partial_application(tmp_path):
    target = tmp_path / "w.txt"
    old = "".join(f"row {i}\r\n" for i in range(20))
    target.write_bytes(old.encode())
    new = old.replace("row 1\r\n", "ROW 1\r\n").replace("row 18\r\n", "ROW 18\r\n")
    apply_proposal(make_proposal(target, "w.txt", target.read_bytes(), new), frozenset({0}))
    assert target.read_bytes() == old.replace("row 1\r\n", "ROW 1\r\n").encode()


def test_symlink_swapped_in_after_proposal_is_refused(tmp_path):
    target = tmp_path / "f.txt"
    target.write_text("a\n")
    proposal = make_proposal(target, "f.txt", target.read_bytes(), "b\n")
    outside = tmp_path / "outside.txt"
    outside.write_text("a\n")
    target.unlink()
    target.symlink_to(outside)
    with pytest.raises(WorkspaceError, match="resolves elsewhere"):
        apply_proposal(proposal, frozenset({0}))
    assert outside.read_text() == "a\n"


def test_undo_restores_in_reverse_order_and_refuses_over_newer_changes(tmp_path):
    target = tmp_path / "f.txt"
    target.write_text(OLD)
    book = ProposalBook()
    first = make_proposal(target, "f.txt", target.read_bytes(), two_hunk_change())
    book.push(apply_proposal(first, EditDecision.accept_all(first).accepted))
    created = make_proposal(tmp_path / "n.txt", "n.txt", None, "new\n")
    book.push(apply_proposal(created, frozenset({0})))
    book.undo_last()
    assert not (tmp_path / "n.txt").exists()
    target.write_text("edited by hand\n")
    with pytest.raises(StaleProposalError, match="undo would lose"):
        book.undo_last()
    target.write_text(two_hunk_change())
    book.undo_last()
    assert target.read_text() == OLD
    with pytest.raises(WorkspaceError, match="nothing to undo"):
        book.undo_last()


def test_book_marks_pending_proposals_stale_only_when_content_differs(tmp_path):
    target = tmp_path / "f.txt"
    target.write_text(OLD)
    book = ProposalBook()
    proposal = make_proposal(target, "f.txt", target.read_bytes(), two_hunk_change())
    book.add(proposal)
    target.write_text(OLD)  # touched, same content
    assert book.mark_stale(target) == []
    target.write_text(OLD + "x\n")
    assert book.mark_stale(target) == [proposal] and book.mark_stale(target) == []
