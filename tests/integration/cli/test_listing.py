"""`tidal ls` with thousands of jobs (its filters, a notice when more exist than it shows, every page with
--all-pages, a notice when --all shows a user their own jobs only) and `tidal cancel`/`tidal preempt` of several
jobs, by id or by filter, confirmed for more than a few (refused without a terminal unless --yes)."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from typing import Any

import pytest
from sqlalchemy import update

from tests.integration.cli.conftest import Served
from tidal.control import tokens
from tidal.control.store.models import JobRow


def tidal(s: Served, *args: str, token: str | None = None, stdin: Any = subprocess.DEVNULL,
          input: str | None = None) -> subprocess.CompletedProcess[str]:
    """`tidal ARGS` with no terminal on stdin (unless ``stdin`` gives one), as alice (or ``token``'s user)."""
    env = {**s.env, **({"TIDAL_TOKEN": token} if token else {})}
    return subprocess.run([sys.executable, "-m", "tidal.cli.main", *args], capture_output=input is None, text=True,
                          env=env, timeout=120, check=False, stdin=stdin if input is None else None, input=input)


def listed(s: Served, *args: str, token: str | None = None) -> list[str]:
    p = tidal(s, "ls", "-o", "json", *args, token=token)
    assert p.returncode == 0, p.stderr
    return [j["id"] for j in json.loads(p.stdout)]


def states(s: Served, ids: list[str]) -> list[str]:
    with s.plane.db.read() as db:
        rows = {j.id: j.state for j in db.query(JobRow).filter(JobRow.id.in_(ids))}
    return [rows[i] for i in ids]


def user(s: Served, name: str, role: str = "user") -> str:
    with s.plane.db.tx() as db:
        return tokens.create_user(db, name, role)


def test_ls_says_when_more_jobs_exist_than_it_shows(served_plane: Served) -> None:
    made = served_plane.plane.submit_many(1006, name="j-{i}")
    p = tidal(served_plane, "ls")
    assert p.returncode == 0, p.stderr
    rows = p.stdout.splitlines()
    assert rows[0].split()[:2] == ["ID", "NAME"] and len(rows) == 1 + 1000
    assert rows[1].split()[:2] == [made[-1], "j-1005"] and rows[-1].split()[:2] == [made[6], "j-6"]
    assert p.stderr == ("note: showing 1,000 of 1,006 jobs: narrow with --state/--user/--name/--tier/--since, "
                        "or see more with --limit N or --all-pages\n")
    p = tidal(served_plane, "ls", "--limit", "5", "-o", "json")
    assert [j["id"] for j in json.loads(p.stdout)] == made[:-6:-1]
    assert p.stderr.startswith("note: showing 5 of 1,006 jobs: ")
    # Every page: every job once, and no notice.
    p = tidal(served_plane, "ls", "--all-pages", "--limit", "400", "-o", "json")
    assert [j["id"] for j in json.loads(p.stdout)] == made[::-1] and p.stderr == ""
    p = tidal(served_plane, "ls", "--name", "j-100?")
    assert len(p.stdout.splitlines()) == 1 + 6 and p.stderr == ""


def test_ls_filters(served_plane: Served) -> None:
    p = served_plane.plane
    bob = user(served_plane, "bob")
    root = user(served_plane, "root", "admin")
    sweeps = p.submit_many(3, name="sweep-{i}")
    train = p.submit(name="train", tier="premium")
    old = p.submit(name="sweep-old")
    with p.db.tx() as db:
        db.execute(update(JobRow).where(JobRow.id == old).values(submitted_at=1000.0))
    theirs = p.submit_many(2, owner="bob", name="sweep-{i}")
    assert tidal(served_plane, "cancel", sweeps[0]).returncode == 0
    assert tidal(served_plane, "preempt", train).returncode == 0  # pending: held at once

    assert listed(served_plane) == [old, train, *sweeps[::-1]]
    assert listed(served_plane, "--state", "pending") == [old, sweeps[2], sweeps[1]]
    assert listed(served_plane, "--state", "held,cancelled") == [train, sweeps[0]]
    assert listed(served_plane, "--state", "held", "--state", "cancelled") == [train, sweeps[0]]
    assert listed(served_plane, "--name", "sweep-*") == [old, *sweeps[::-1]]
    assert listed(served_plane, "--tier", "premium") == [train]
    assert listed(served_plane, "--since", "1h") == [train, *sweeps[::-1]]
    assert listed(served_plane, "--since", "1970-01-01T00:10+00:00") == [old, train, *sweeps[::-1]]
    assert listed(served_plane, "--name", "sweep-*", "--since", "1h", "--state", "pending", "--user", "alice") == [
        sweeps[2], sweeps[1]]
    assert listed(served_plane, "--user", "bob", token=root) == theirs[::-1]
    assert listed(served_plane, "--user", "alice,bob", "--name", "sweep-1", token=root) == [theirs[1], sweeps[1]]
    assert listed(served_plane, "--all", token=bob) == theirs[::-1]
    # Alice may not list bob's.
    r = tidal(served_plane, "ls", "--user", "bob")
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr == ("error: user: alice may list and act on their own jobs only, not those of 'bob'\n"
                        "hint: only an admin may name another user; leave out --user for your own jobs\n")
    r = tidal(served_plane, "ls", "--since", "soon")
    assert r.returncode == 2 and r.stderr.startswith("error: --since: 'soon' is neither a time ago nor a date")


def test_ls_all_says_it_shows_a_user_their_own_jobs(served_plane: Served) -> None:
    mine = served_plane.plane.submit()
    theirs = served_plane.plane.submit_many(1, owner="bob")
    root = user(served_plane, "root", "admin")
    p = tidal(served_plane, "ls", "--all", "-o", "json")
    assert [j["id"] for j in json.loads(p.stdout)] == [mine]
    assert p.stderr == "note: --all lists every user's jobs for an admin only: these are your own\n"
    p = tidal(served_plane, "ls", "--all", "-o", "json", token=root)
    assert [j["id"] for j in json.loads(p.stdout)] == [*theirs, mine] and p.stderr == ""
    assert tidal(served_plane, "ls").stderr == ""


def test_cancel_several_jobs_by_id(served_plane: Served) -> None:
    a, b, c = served_plane.plane.submit_many(3)
    done = served_plane.plane.submit()
    assert tidal(served_plane, "cancel", done).stdout == f"job {done} cancelled\n"
    p = tidal(served_plane, "cancel", a, b, c)
    assert p.returncode == 0, p.stderr
    assert p.stdout == (f"job {a} cancelled\njob {b} cancelled\njob {c} cancelled\n"
                        "3 jobs: 3 cancelled\n")
    assert states(served_plane, [a, b, c]) == ["cancelled"] * 3
    # Finished and unknown ones are said so; an unknown one fails the command.
    p = tidal(served_plane, "cancel", a, "deadbeef")
    assert p.returncode == 1
    assert p.stdout == f"job {a} has already cancelled\nno job deadbeef\n2 jobs: 1 already finished, 1 not found\n"
    # One id: as it always was.
    p = tidal(served_plane, "cancel", a)
    assert p.returncode == 1 and p.stderr.startswith(f"error: job {a} has already cancelled")
    p = tidal(served_plane, "cancel", "deadbeef")
    assert p.returncode == 1 and p.stderr.startswith("error: no job deadbeef")


def test_cancel_asks_first_and_refuses_without_a_terminal(served_plane: Served) -> None:
    many = served_plane.plane.submit_many(6, name="sweep-{i}")
    other = served_plane.plane.submit(name="train")
    for args in (many, ["--name", "sweep-*"], ["--state", "pending"]):
        p = tidal(served_plane, "cancel", *args)
        assert p.returncode == 2 and p.stdout == ""
        what = "6 jobs" if args is many or args[0] == "--name" else "7 jobs"
        assert p.stderr == (f"error: cancel {what}? There is no terminal to confirm it on: nothing was done\n"
                            "hint: give --yes to go ahead without a confirmation\n")
    assert states(served_plane, [*many, other]) == ["pending"] * 7
    p = tidal(served_plane, "cancel", "--name", "sweep-*", "--yes")
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[-1] == "6 jobs: 6 cancelled"
    assert states(served_plane, [*many, other]) == ["cancelled"] * 6 + ["pending"]
    p = tidal(served_plane, "cancel", "--name", "sweep-*", "--yes")  # those not yet ended: none left
    assert p.returncode == 0 and p.stderr == "note: no job matches: nothing to cancel\n"


@pytest.mark.parametrize(("answer", "cancelled"), [("n", False), ("y", True)])
def test_cancel_asks_on_a_terminal(served_plane: Served, answer: str, cancelled: bool) -> None:
    many = served_plane.plane.submit_many(7, name="sweep-{i}")
    leader, follower = pty.openpty()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "tidal.cli.main", "cancel", "--name", "sweep-*"],
                                stdin=follower, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=served_plane.env)
        os.write(leader, f"{answer}\n".encode())
        out, err = proc.communicate(timeout=60)
    finally:
        os.close(follower)
        os.close(leader)
    # The jobs it would cancel (the first 10 at most), then the question.
    assert f"{many[-1]}  sweep-6" in out and "cancel these 7 jobs (name sweep-*)? [y/N]: " in out
    assert proc.returncode == (0 if cancelled else 1), err
    assert states(served_plane, many) == ["cancelled" if cancelled else "pending"] * 7
    if not cancelled:
        assert err == "note: nothing was done\n"


def test_cancel_by_filter_as_an_admin_and_a_user(served_plane: Served) -> None:
    root = user(served_plane, "root", "admin")
    alices = served_plane.plane.submit_many(2, name="sweep-{i}")
    bobs = served_plane.plane.submit_many(2, owner="bob", name="sweep-{i}")
    p = tidal(served_plane, "cancel", "--user", "bob", "--state", "pending", "--name", "sweep-*", "--yes", token=root)
    assert p.returncode == 0, p.stderr
    assert p.stdout == f"job {bobs[1]} cancelled\njob {bobs[0]} cancelled\n2 jobs: 2 cancelled\n"
    assert states(served_plane, alices) == ["pending", "pending"]
    p = tidal(served_plane, "cancel", "--user", "bob", "--yes")
    assert p.returncode == 1 and p.stderr.startswith("error: user: alice may list and act on their own jobs only")
    p = tidal(served_plane, "cancel", "--all", "--yes")
    assert p.stderr == "note: --all lists every user's jobs for an admin only: these are your own\n"
    assert states(served_plane, alices) == ["cancelled", "cancelled"]


def test_cancel_needs_ids_or_filters(served_plane: Served) -> None:
    p = tidal(served_plane, "cancel")
    assert p.returncode == 2
    assert p.stderr == ("error: give the jobs to cancel: their ids, or filters (--state, --user, --name, --tier, "
                        "--since, --all)\nhint: see `tidal cancel --help`\n")
    p = tidal(served_plane, "cancel", "abc", "--state", "pending")
    assert p.returncode == 2 and p.stderr.startswith("error: give the jobs to cancel by id or by filters, not both")


def test_preempt_several_jobs(served_plane: Served) -> None:
    a, b = served_plane.plane.submit_many(2)
    done = served_plane.plane.submit()
    assert tidal(served_plane, "cancel", done).returncode == 0
    p = tidal(served_plane, "preempt", a, b, done)
    assert p.returncode == 0, p.stderr
    assert p.stdout == (f"job {a} held\njob {b} held\njob {done} has already cancelled\n"
                        "3 jobs: 2 held, 1 already finished\n")
    assert states(served_plane, [a, b]) == ["held", "held"]
