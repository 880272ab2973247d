"""The control plane in-process, and a scripted agent to drive it: for tests of the API, the reconcile
loop and the agent protocol without agents, ranks or CRIU.

:class:`Plane` is a real control plane (SQLite database, reconciler, the API app) called through
FastAPI's test client; :class:`FakeAgent` speaks the agent protocol to it as a test tells it to: it
registers, fetches actions, reports results and exits, and runs nothing."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from tidal.control import projects, submission, tokens
from tidal.control.api.app import Context, create_app
from tidal.control.reconcile import Reconciler
from tidal.control.store.db import Database
from tidal.control.userlimits import Defaults
from tidal.core import JobSpec, protocol
from tidal.policy.admission import Quotas
from tidal.policy.firstfit import FirstFitPolicy
from tidal.policy.sla_admission import SlaMode

#: The limits of a test's plane unless it gives its own: the defaults, but no request rate (a test polls the API
#: as fast as it likes).
UNLIMITED_RATE = Defaults(user_rate=None, admin_rate=None)


class Plane:
    """A control plane over a SQLite database in ``home``, with a user ``alice`` and the cluster's agent
    credential. ``rec.once()`` runs one round of the reconcile loop; ``http`` calls the API. ``limits``: the
    users' and projects' default limits (:mod:`tidal.control.userlimits`)."""

    def __init__(self, home: Path, lease_s: float = 30.0, quotas: Quotas | None = None,
                 admit_sla: SlaMode = "off", limits: Defaults = UNLIMITED_RATE, url: str | None = None) -> None:
        """``url``: the database (default: SQLite in ``home``)."""
        self.db = Database(url or f"sqlite:///{home / 'tidal.db'}")
        self.db.info["limits"] = limits
        self.db.migrate()
        with self.db.tx() as s:
            self.user = tokens.create_user(s, "alice", "user")
            self.agent = tokens.create_user(s, "cluster", "agent")
        self.rec = Reconciler(self.db, FirstFitPolicy())
        self.http = TestClient(create_app(Context(db=self.db, home=home, lease_s=lease_s, quotas=quotas,
                                                  admit_sla=admit_sla)))
        self.workdir = home

    def add_projects(self, *names: str, members: tuple[str, ...] = ("alice",)) -> None:
        """Make projects (as an admin does), ``members`` in each: alice may then submit under them."""
        with self.db.tx() as s:
            for name in names:
                projects.add(s, name, "test", members)

    def as_user(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.user}"}

    def as_agent(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.agent}"}

    def submit(self, **kw: Any) -> str:
        """Submit a job as alice (``kw``: the submission's fields); its id."""
        return str(self.submit_reply(**kw)["id"])

    def submit_reply(self, **kw: Any) -> dict[str, Any]:
        r = self.http.post("/v1/jobs", headers=self.as_user(),
                           json={"command": ["train"], "workdir": str(self.workdir), **kw})
        assert r.status_code == 201, r.text
        return r.json()  # type: ignore[no-any-return]

    def submit_many(self, n: int, owner: str = "alice", **kw: Any) -> list[str]:
        """Submit ``n`` jobs as ``owner`` through the control plane's own submission, in-process (thousands in a
        few seconds; ``kw``: the submission's fields, ``{i}`` in ``name`` numbered); their ids, oldest first."""
        ids: list[str] = []
        for start in range(0, n, 500):
            with self.db.tx() as s:
                for i in range(start, min(n, start + 500)):
                    fields = {"command": ["train"], "workdir": str(self.workdir), **kw}
                    if "name" in fields:
                        fields["name"] = str(fields["name"]).format(i=i)
                    job, _ = submission.submit(s, JobSpec.submitted(fields, owner=owner), owner, f"test:{owner}")
                    ids.append(job.id)
        return ids

    def job(self, jid: str) -> dict[str, Any]:
        return self.http.get(f"/v1/jobs/{jid}", headers=self.as_user()).json()  # type: ignore[no-any-return]


class FakeAgent:
    """The agent of node ``name`` (instance ``agent_id``, with ``devices`` devices), scripted by a test;
    ``gpus``: the devices' GPUs as a GPU node registers them (``{"index", "uuid", "model", "memory_bytes"}``
    each; None: CPU devices)."""

    def __init__(self, plane: Plane, name: str, agent_id: str, devices: int = 1, region: str = "local",
                 cluster: str = "local", gpus: list[dict[str, Any]] | None = None) -> None:
        self.p, self.name, self.id, self.devices = plane, name, agent_id, devices
        self.region, self.cluster, self.gpus = region, cluster, gpus

    def register(self) -> int:
        """Register the node; the HTTP status."""
        r = self.p.http.post("/v1/agent/register", headers=self.p.as_agent(), json={
            "name": self.name, "agent_id": self.id, "devices": self.devices,
            "cpus": [[i] for i in range(self.devices)], "region": self.region, "cluster": self.cluster,
            **({"gpus": self.gpus} if self.gpus is not None else {})})
        return int(r.status_code)

    def actions(self) -> list[dict[str, Any]]:
        """The actions handed to this node now (each is handed out once), read as an agent reads them
        (:func:`protocol.decode_action`), each as ``{"id", "kind", "job_id", "payload"}`` (the order's
        fields) for the tests to look into."""
        r = self.p.http.get(f"/v1/agent/{self.name}/actions", headers=self.p.as_agent(),
                            params={"agent_id": self.id, "wait": 0})
        assert r.status_code == 200, r.text
        out = []
        for a in r.json():
            action = protocol.decode_action(a)
            out.append({"id": action.id, "kind": action.kind, "job_id": action.job_id,
                        "payload": protocol.encode(action.order)})
        return out

    def result(self, action: dict[str, Any], ok: bool = True, **data: Any) -> bool:
        """Report ``action`` done (``data``: its result) or failed; whether the plane applied the report."""
        r = self.p.http.post(f"/v1/agent/{self.name}/results", headers=self.p.as_agent(), json={
            "agent_id": self.id, "action_id": action["id"], "ok": ok, "data": data,
            "error": None if ok else "boom"})
        return bool(r.json()["applied"])

    def exit(self, job: str, attempt: int, code: int | None = 0, signal: int | None = None) -> bool:
        """Report that rank 0 of ``job``'s ``attempt`` ended; whether the plane applied the report."""
        r = self.p.http.post(f"/v1/agent/{self.name}/exits", headers=self.p.as_agent(), json={
            "agent_id": self.id, "job_id": job, "attempt": attempt,
            "ranks": [{"rank": 0, "code": code, "signal": signal}]})
        return bool(r.json()["applied"])


    def committed(self, job: str, attempt: int, checkpoint_id: str, ok: bool = True, *, size: int = 100,
                  stored: int = 10) -> bool:
        """Report the end of the commit of a checkpoint answered before it; whether the plane applied it."""
        r = self.p.http.post(f"/v1/agent/{self.name}/commits", headers=self.p.as_agent(), json={
            "agent_id": self.id, "job_id": job, "attempt": attempt, "checkpoint_id": checkpoint_id, "ok": ok,
            "bytes": size if ok else 0, "stored_bytes": stored if ok else 0, "error": None if ok else "disk full"})
        assert r.status_code == 200, r.text
        return bool(r.json()["applied"])


def start(p: Plane, a: FakeAgent, jid: str) -> dict[str, Any]:
    """Run one reconcile round, which must hand ``a`` the launch of job ``jid`` alone; report it started
    (rank 0, pid 4242). The launch action."""
    p.rec.once()
    (act,) = a.actions()
    assert act["job_id"] == jid
    assert a.result(act, ranks=[{"rank": 0, "pid": 4242}])
    return act


def checkpoint_result(checkpoint_id: str, *, size: int = 100, stored: int = 10,
                      committing: bool = False) -> dict[str, Any]:
    """The result data (:class:`protocol.Dumped`) of a checkpoint action that committed ``checkpoint_id``
    now (``size`` bytes, ``stored`` of them written); ``committing``: dumped, its commit still under way."""
    return protocol.encode(protocol.Dumped(checkpoint=protocol.StoredCheckpoint(
        id=checkpoint_id, created_at=time.time(), bytes=size, stored_bytes=0 if committing else stored),
        committing=committing))
