"""`GET /v1/jobs` for thousands of jobs: its filters (state, user, name, tier, since), who may name whom, its keyset
paging (every job once, in order, while jobs are submitted), and the bulk requests (`POST /v1/jobs/cancel`,
`POST /v1/jobs/preempt`) by ids and by filter, with each job's outcome; and what errors quote of what was sent
(a short prefix) and say of a body that is not JSON (where)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update

from tidal.control import bulk, jobfilter, tokens
from tidal.control.store.models import JobRow
from tidal.testing.control import UNLIMITED_RATE, FakeAgent, Plane, start


class Team:
    """A plane with users alice and bob and an admin root; each one's request headers."""

    def __init__(self, plane: Plane) -> None:
        self.p = plane
        with plane.db.tx() as s:
            self.bob = {"Authorization": f"Bearer {tokens.create_user(s, 'bob', 'user')}"}
            self.root = {"Authorization": f"Bearer {tokens.create_user(s, 'root', 'admin')}"}
        self.alice = plane.as_user()

    def ls(self, who: dict[str, str], **params: Any) -> list[str]:
        r = self.p.http.get("/v1/jobs", headers=who, params=params)
        assert r.status_code == 200, r.text
        return [j["id"] for j in r.json()]

    def submit(self, who: dict[str, str], **kw: Any) -> str:
        r = self.p.http.post("/v1/jobs", headers=who, json={"command": ["train"], "workdir": str(self.p.workdir), **kw})
        assert r.status_code == 201, r.text
        return str(r.json()["id"])

    def state(self, jid: str) -> str:
        return str(self.p.http.get(f"/v1/jobs/{jid}", headers=self.root).json()["state"])


@pytest.fixture(params=["sqlite", "postgresql"])
def team(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Team]:
    """On SQLite, and on PostgreSQL (the name's glob is each one's own SQL)."""
    url = request.getfixturevalue("postgres_url") if request.param == "postgresql" else None
    plane = Plane(tmp_path, url=url)
    yield Team(plane)
    plane.db.close()


@pytest.fixture
def jobs(team: Team) -> Iterator[dict[str, str]]:
    """Alice's and bob's jobs, by a label; each submitted 100 s after the one before (the first at t=1000)."""
    a, b = team.alice, team.bob
    made = {
        "a_sweep1": team.submit(a, name="sweep-1"),
        "a_sweep2": team.submit(a, name="sweep-2"),  # cancelled below
        "a_Sweep3": team.submit(a, name="Sweep-3", tier="standard"),
        "a_train": team.submit(a, name="train", tier="premium"),  # held below
        "a_sweep10": team.submit(a, name="sweep-10"),
        "a_pct": team.submit(a, name="50%_off"),
        "b_sweep1": team.submit(b, name="sweep-1"),
        "b_eval": team.submit(b, name="eval", tier="premium"),
    }
    with team.p.db.tx() as s:
        for i, jid in enumerate(made.values()):
            s.execute(update(JobRow).where(JobRow.id == jid).values(submitted_at=1000.0 + 100 * i))
    assert team.p.http.post(f"/v1/jobs/{made['a_sweep2']}/cancel", headers=a).status_code == 200
    assert team.p.http.post(f"/v1/jobs/{made['a_train']}/preempt", headers=a).status_code == 200
    yield made


def ids(jobs: dict[str, str], *labels: str) -> list[str]:
    """The jobs of ``labels`` in the listing's order: newest first."""
    order = list(jobs)
    return [jobs[x] for x in sorted(labels, key=order.index, reverse=True)]


ALICES = ("a_sweep1", "a_sweep2", "a_Sweep3", "a_train", "a_sweep10", "a_pct")


def test_each_filter_selects_exactly_its_jobs(team: Team, jobs: dict[str, str]) -> None:
    a, root = team.alice, team.root
    assert team.ls(a) == ids(jobs, *ALICES)
    assert team.ls(a, state="pending") == ids(jobs, "a_sweep1", "a_Sweep3", "a_sweep10", "a_pct")
    assert team.ls(a, state="held") == ids(jobs, "a_train")
    both = ids(jobs, "a_sweep2", "a_train")
    assert team.ls(a, state=["held", "cancelled"]) == both == team.ls(a, state="held,cancelled")
    assert team.ls(a, state="running") == []
    # A name is exact; with * or ? a glob, case-sensitive; %, _ and [ are themselves.
    assert team.ls(a, name="sweep-1") == ids(jobs, "a_sweep1")
    assert team.ls(a, name="sweep-*") == ids(jobs, "a_sweep1", "a_sweep2", "a_sweep10")
    assert team.ls(a, name="sweep-?") == ids(jobs, "a_sweep1", "a_sweep2")
    assert team.ls(a, name="*weep-*") == ids(jobs, "a_sweep1", "a_sweep2", "a_Sweep3", "a_sweep10")
    assert team.ls(a, name="50%*") == ids(jobs, "a_pct")
    assert team.ls(a, name="5_*") == [] == team.ls(a, name="[s]*")
    assert team.ls(a, tier="premium") == ids(jobs, "a_train")
    assert team.ls(a, tier=["standard", "premium"]) == ids(jobs, "a_Sweep3", "a_train")
    assert team.ls(a, tier="basic") == ids(jobs, "a_sweep1", "a_sweep2", "a_sweep10", "a_pct")
    assert team.ls(a, since=1300) == ids(jobs, "a_train", "a_sweep10", "a_pct")  # submitted at 1300 or after
    assert team.ls(a, since=1300.5) == ids(jobs, "a_sweep10", "a_pct")
    assert team.ls(a, state="pending", name="sweep-*", tier="basic", since=1100) == ids(jobs, "a_sweep10")
    # Whose: a user names themselves at most; an admin anyone, or every user's.
    assert team.ls(a, user="alice") == team.ls(a)
    assert team.ls(a, all="true") == team.ls(a)
    assert team.ls(root) == []
    assert team.ls(root, user="bob") == ids(jobs, "b_sweep1", "b_eval")
    assert team.ls(root, user="bob", name="sweep-*") == ids(jobs, "b_sweep1")
    assert team.ls(root, user=["alice", "bob"]) == team.ls(root, all="true") == ids(jobs, *jobs)
    assert team.ls(root, all="true", name="sweep-1") == ids(jobs, "a_sweep1", "b_sweep1")
    assert team.ls(root, user="nobody") == []


def test_the_headers_say_whose_jobs_and_how_many(team: Team, jobs: dict[str, str]) -> None:
    def heads(who: dict[str, str], **params: Any) -> tuple[str | None, str | None, str | None]:
        r = team.p.http.get("/v1/jobs", headers=who, params=params)
        return (r.headers.get("X-Tidal-Total-Count"), r.headers.get("X-Tidal-Scope"),
                r.headers.get("X-Tidal-Next-Cursor"))

    assert heads(team.alice) == ("6", "own", None)
    assert heads(team.alice, all="true") == ("6", "own", None)  # not an admin: their own
    assert heads(team.root, all="true") == ("8", "all", None)
    assert heads(team.root, user="bob") == ("2", "users", None)
    total, scope, cursor = heads(team.alice, name="sweep-*", limit=2)
    assert (total, scope) == ("3", "own") and cursor is not None
    r = team.p.http.get("/v1/jobs", headers=team.alice, params={"name": "sweep-*", "limit": 2, "cursor": cursor})
    assert [j["id"] for j in r.json()] == ids(jobs, "a_sweep1")
    assert "X-Tidal-Next-Cursor" not in r.headers and r.headers["X-Tidal-Total-Count"] == "3"


def test_a_user_naming_another_user_is_refused(team: Team, jobs: dict[str, str]) -> None:
    for user in ("bob", ["alice", "bob"], "alice,bob"):
        r = team.p.http.get("/v1/jobs", headers=team.alice, params={"user": user})
        assert r.status_code == 403, r.text
        assert r.json() == {"error": "Forbidden",
                            "message": "user: alice may list and act on their own jobs only, not those of 'bob'",
                            "hint": "only an admin may name another user; leave out --user for your own jobs",
                            "field": "user"}
    r = team.p.http.post("/v1/jobs/cancel", headers=team.alice, json={"filter": {"user": ["bob"]}})
    assert r.status_code == 403 and r.json()["field"] == "user"
    assert team.state(jobs["b_sweep1"]) == "pending" and team.state(jobs["b_eval"]) == "pending"


def test_paging_walks_2500_jobs_each_once_in_order_while_jobs_are_submitted(tmp_path: Path) -> None:
    # Alice may keep every one of them waiting (the default is 1000 a user).
    plane = Plane(tmp_path, limits=dataclasses.replace(UNLIMITED_RATE, user_max_queued=None))
    made = plane.submit_many(2500, name="j-{i}")
    newest_first = made[::-1]
    walked: list[str] = []
    totals: list[str] = []
    cursor: str | None = None
    added: list[str] = []
    while True:
        params: dict[str, Any] = {"limit": 1000, **({"cursor": cursor} if cursor else {})}
        r = plane.http.get("/v1/jobs", headers=plane.as_user(), params=params)
        assert r.status_code == 200, r.text
        walked += [j["id"] for j in r.json()]
        totals.append(r.headers["X-Tidal-Total-Count"])
        if not added:  # a job submitted midway: before the first page, so no page shifts
            added.append(plane.submit(name="late"))
        cursor = r.headers.get("X-Tidal-Next-Cursor")
        if cursor is None:
            break
    assert walked == newest_first
    assert totals == ["2500", "2501", "2501"]
    assert added[0] not in walked
    assert plane.http.get("/v1/jobs", headers=plane.as_user(), params={"limit": 1}).json()[0]["id"] == added[0]


def test_paging_keeps_jobs_of_one_submission_number_apart(team: Team) -> None:
    # Two submissions racing on PostgreSQL may draw the same number: the id orders them, each is listed once.
    plane = team.p
    made = plane.submit_many(5)
    with plane.db.tx() as s:
        s.execute(update(JobRow).where(JobRow.id.in_(made[1:4])).values(seq=2))
    expected = [made[4], *sorted(made[1:4], reverse=True), made[0]]
    walked: list[str] = []
    cursor: str | None = None
    for _ in range(10):
        r = plane.http.get("/v1/jobs", headers=plane.as_user(),
                           params={"limit": 2, **({"cursor": cursor} if cursor else {})})
        walked += [j["id"] for j in r.json()]
        cursor = r.headers.get("X-Tidal-Next-Cursor")
        if cursor is None:
            break
    assert walked == expected


def test_a_bad_cursor_or_limit_is_refused(plane: Plane) -> None:
    r = plane.http.get("/v1/jobs", headers=plane.as_user(), params={"cursor": "yesterday"})
    assert r.status_code == 422
    assert r.json() == {"error": "ValidationError", "message": "cursor: 'yesterday' is not a cursor this API gave",
                        "hint": "give the X-Tidal-Next-Cursor of the previous page as it is", "field": "cursor"}
    r = plane.http.get("/v1/jobs", headers=plane.as_user(), params={"limit": 10_001})
    assert r.status_code == 422 and r.json()["field"] == "limit"


def test_cancel_by_ids_answers_each_jobs_outcome(team: Team, jobs: dict[str, str]) -> None:
    asked = [jobs["a_sweep1"], jobs["a_sweep2"], jobs["b_sweep1"], "deadbeef", jobs["a_train"], jobs["a_sweep1"]]
    r = team.p.http.post("/v1/jobs/cancel", headers=team.alice, json={"ids": asked})
    assert r.status_code == 200, r.text
    assert r.json() == {"results": [
        {"id": jobs["a_sweep1"], "outcome": "cancelled", "state": "cancelled",
         "message": f"job {jobs['a_sweep1']} cancelled"},
        {"id": jobs["a_sweep2"], "outcome": "already_finished", "state": "cancelled",
         "message": f"job {jobs['a_sweep2']} has already cancelled"},
        # Bob's job is not alice's to see: not found, as a single job's request answers.
        {"id": jobs["b_sweep1"], "outcome": "not_found", "state": None, "message": f"no job {jobs['b_sweep1']}"},
        {"id": "deadbeef", "outcome": "not_found", "state": None, "message": "no job deadbeef"},
        {"id": jobs["a_train"], "outcome": "cancelled", "state": "cancelled",
         "message": f"job {jobs['a_train']} cancelled"},
    ], "counts": {"cancelled": 2, "already_finished": 1, "not_found": 2}, "next_cursor": None}
    states = {k: team.state(v) for k, v in jobs.items()}
    assert states == {"a_sweep1": "cancelled", "a_sweep2": "cancelled", "a_Sweep3": "pending",
                      "a_train": "cancelled", "a_sweep10": "pending", "a_pct": "pending",
                      "b_sweep1": "pending", "b_eval": "pending"}
    # An admin's reaches anyone's.
    r = team.p.http.post("/v1/jobs/cancel", headers=team.root, json={"ids": [jobs["b_eval"]]})
    assert r.json()["counts"] == {"cancelled": 1} and team.state(jobs["b_eval"]) == "cancelled"


def test_cancel_by_filter_touches_only_what_it_selects(team: Team, jobs: dict[str, str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bulk, "BATCH", 2)  # several transactions for one request
    r = team.p.http.post("/v1/jobs/cancel", headers=team.alice, json={"filter": {"name": "sweep-*"}})
    assert r.status_code == 200, r.text
    # Without a state: the jobs not yet ended (a_sweep2 was cancelled before), newest first; bob's untouched.
    assert [(x["id"], x["outcome"]) for x in r.json()["results"]] == [
        (jobs["a_sweep10"], "cancelled"), (jobs["a_sweep1"], "cancelled")]
    assert r.json()["next_cursor"] is None
    assert [team.state(jobs[x]) for x in ("b_sweep1", "a_Sweep3", "a_train", "a_pct")] == [
        "pending", "pending", "held", "pending"]
    # An admin, for bob's pending sweeps only.
    r = team.p.http.post("/v1/jobs/cancel", headers=team.root,
                         json={"filter": {"user": ["bob"], "state": ["pending"], "name": "sweep-*"}})
    assert [(x["id"], x["outcome"]) for x in r.json()["results"]] == [(jobs["b_sweep1"], "cancelled")]
    assert team.state(jobs["b_eval"]) == "pending" and team.state(jobs["a_pct"]) == "pending"
    # Naming a finished state: those are reported as such.
    r = team.p.http.post("/v1/jobs/cancel", headers=team.alice,
                         json={"filter": {"state": ["cancelled"], "since": 1100}})
    assert r.json()["counts"] == {"already_finished": 2}


def test_a_filter_selects_a_page_at_a_time(team: Team, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jobfilter, "MAX_BULK", 2)
    made = team.p.submit_many(5, name="n-{i}")
    done: list[str] = []
    body: dict[str, Any] = {"filter": {"state": ["pending", "cancelled"]}}
    for _ in range(5):
        r = team.p.http.post("/v1/jobs/cancel", headers=team.alice, json=body).json()
        assert len(r["results"]) <= 2
        done += [x["id"] for x in r["results"]]
        if r["next_cursor"] is None:
            break
        body["cursor"] = r["next_cursor"]
    assert done == made[::-1]
    assert {team.state(j) for j in made} == {"cancelled"}


def test_preempt_several_jobs(team: Team, jobs: dict[str, str]) -> None:
    agent = FakeAgent(team.p, "node-1", "A", devices=1)
    assert agent.register() == 200
    team.p.http.post("/v1/jobs/cancel", headers=team.root,  # nothing else may take the device
                     json={"filter": {"all": True, "state": ["pending"]}})
    running = team.submit(team.alice, name="run")
    start(team.p, agent, running)
    asked = [running, jobs["a_train"], jobs["a_sweep2"], jobs["b_eval"], jobs["a_Sweep3"]]
    r = team.p.http.post("/v1/jobs/preempt", headers=team.alice, json={"ids": asked})
    assert r.status_code == 200, r.text
    assert [(x["id"], x["outcome"], x["state"]) for x in r.json()["results"]] == [
        (running, "preempting", "checkpointing"),
        (jobs["a_train"], "held", "held"),
        (jobs["a_sweep2"], "already_finished", "cancelled"),
        (jobs["b_eval"], "not_found", None),
        (jobs["a_Sweep3"], "already_finished", "cancelled"),  # cancelled by the admin's filter above
    ]
    # Its checkpoint is in flight: asked again, it is busy.
    r = team.p.http.post("/v1/jobs/preempt", headers=team.alice, json={"ids": [running]})
    assert r.json()["results"][0]["outcome"] == "busy"


def test_a_bulk_request_gives_ids_or_a_filter_within_bounds(team: Team) -> None:
    def post(body: Any) -> dict[str, Any]:
        r = team.p.http.post("/v1/jobs/cancel", headers=team.alice, json=body)
        assert r.status_code == 422, r.text
        return dict(r.json())

    both = post({"ids": ["a"], "filter": {}})
    assert both["message"] == "give the jobs' ids or a filter, one of the two"
    assert post({})["message"] == both["message"]
    assert post({"ids": []})["message"] == "ids: give at least one job id"
    assert post({"ids": ["a"] * 1001})["field"] == "ids"
    assert post({"ids": ["x" * 65]})["field"] == "ids.0"
    assert post({"ids": ["a"], "cursor": "1.a"})["field"] == "cursor"
    assert post({"filter": {"state": ["pending"], "colour": "red"}})["field"] == "filter.colour"


# -- errors quote a short prefix of what was sent -------------------------------------------------------------------
LONG = "x" * 100_000  # in a body; in a URL (which clients bound at 64 kB):
LONG_Q = "x" * 20_000
PREFIX = "'" + "x" * 64 + "…'"


@pytest.mark.parametrize(("method", "path", "kw", "message"), [
    ("GET", "/v1/jobs", {"params": {"state": LONG_Q}}, f"state: unknown state {PREFIX}"),
    ("GET", "/v1/jobs", {"params": {"state": "pending," + LONG_Q}}, f"state: unknown state {PREFIX}"),
    ("GET", "/v1/jobs", {"params": {"name": LONG_Q}}, f"name: {PREFIX} is 20000 characters, over 256"),
    ("GET", "/v1/jobs", {"params": {"tier": LONG_Q}}, f"unknown tier {PREFIX}"),
    ("GET", "/v1/jobs", {"params": {"user": LONG_Q}},
     f"user: {PREFIX} is not a user name (at most 64 characters)"),
    ("GET", "/v1/jobs", {"params": {"cursor": LONG_Q}}, f"cursor: {PREFIX} is not a cursor this API gave"),
    ("POST", "/v1/jobs/cancel", {"json": {"filter": {"state": [LONG]}}}, f"state: unknown state {PREFIX}"),
    ("POST", "/v1/jobs", {"json": {"command": ["a"], "workdir": "WORKDIR", "tier": LONG}}, f"unknown tier {PREFIX}"),
    ("POST", "/v1/jobs", {"json": {"command": ["a"], "workdir": "WORKDIR", LONG: 1}},
     f"unknown key {PREFIX} in the job's submission"),
    ("POST", "/v1/jobs", {"json": {"command": ["a"], "workdir": LONG}}, "workdir is 100000 bytes, over 4096"),
    ("POST", "/v1/jobs", {"json": {"command": ["a"], "workdir": "WORKDIR", "region": LONG}},
     f"region {PREFIX} is not a region name (letters, digits, '.', '_', '-', at most 64 characters)"),
    ("GET", f"/v1/jobs/{LONG_Q}", {}, f"no job {PREFIX}"),
    ("POST", "/v1/jobs/abc/resume", {"json": {"from": LONG}}, None),
])
def test_an_error_quotes_a_short_prefix_of_what_was_sent(plane: Plane, method: str, path: str, kw: dict[str, Any],
                                                         message: str | None) -> None:
    if "json" in kw:
        kw = {"json": {k: (str(plane.workdir) if v == "WORKDIR" else v) for k, v in kw["json"].items()}}
    r = plane.http.request(method, path, headers=plane.as_user(), **kw)
    assert 400 <= r.status_code < 500, r.text
    body = r.json()
    if message is not None:
        assert body["message"] == message
    assert len(r.text) < 2000 and "x" * 65 not in r.text, body


def test_a_body_that_is_not_json_is_refused_saying_where(plane: Plane) -> None:
    def post(path: str, text: str) -> dict[str, Any]:
        r = plane.http.post(path, headers={**plane.as_user(), "Content-Type": "application/json"}, content=text)
        assert r.status_code == 422, r.text
        return dict(r.json())

    assert post("/v1/jobs", '{"command": ["a"] "x": 1}') == {
        "error": "ValidationError",
        "message": "the request body is not valid JSON: Expecting ',' delimiter at line 1, column 19 (char 18)",
        "hint": "send the body as JSON text (Content-Type: application/json)", "field": None}
    assert post("/v1/jobs/cancel", '{\n  "ids": ["a",\n  ]\n}')["message"] == (
        "the request body is not valid JSON: Expecting value at line 3, column 3 (char 19)")
    assert post("/v1/jobs", '{"name": "unterminated')["message"] == (
        "the request body is not valid JSON: Unterminated string starting at line 1, column 10 (char 9)")


def test_the_listing_stays_a_json_list(plane: Plane, tmp_path: Path) -> None:
    # Clients that read the list as it was (the CLI before paging, tidal.testing, scripts) read it still.
    jid = plane.submit(name="one")
    (job,) = plane.http.get("/v1/jobs", headers=plane.as_user()).json()
    assert job["id"] == jid and job["name"] == "one" and job["owner"] == "alice"
