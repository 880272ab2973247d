"""The rendezvous host looks for distributed jobs, and tries to start the store, at most once per database
commit: a reconcile pass that finds nothing new costs no query and starts no process."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tidal.control import rendezvous
from tidal.errors import MechanismError
from tidal.mechanisms.interpose import storeserver


def test_no_store_is_looked_for_again_until_something_commits(monkeypatch: pytest.MonkeyPatch) -> None:
    looks: list[int] = []
    starts: list[int] = []
    db = SimpleNamespace(generation=1)
    monkeypatch.setattr(rendezvous, "_distributed_jobs", lambda d: looks.append(d.generation) or True)

    def fail() -> object:
        starts.append(db.generation)
        raise MechanismError("the rendezvous store did not start: no torch")

    monkeypatch.setattr(storeserver, "shared", fail)
    host = rendezvous.RendezvousHost()
    for _ in range(3):
        host.prepare(db)  # type: ignore[arg-type]
    assert host.addr() is None and looks == [1] and starts == [1]
    db.generation = 2
    host.prepare(db)  # type: ignore[arg-type]
    assert looks == [1, 2] and starts == [1, 2]


def prepared(monkeypatch: pytest.MonkeyPatch, distributed: bool) -> rendezvous.RendezvousHost:
    """A host advertising 198.18.0.1 whose store would start on port 4321, after a pass's look that found
    distributed jobs or none."""
    monkeypatch.setattr(rendezvous, "_distributed_jobs", lambda d: distributed)
    monkeypatch.setattr(storeserver, "shared", lambda: SimpleNamespace(port=4321))
    monkeypatch.setattr(storeserver, "shared_alive", lambda: True)
    host = rendezvous.RendezvousHost(advertise="198.18.0.1")
    host.prepare(SimpleNamespace(generation=1))  # type: ignore[arg-type]
    return host


def test_a_started_store_is_given_at_the_advertised_address(monkeypatch: pytest.MonkeyPatch) -> None:
    assert prepared(monkeypatch, distributed=True).addr() == "198.18.0.1:4321"


def test_a_job_placed_before_any_pass_saw_it_gets_the_store_started_then(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pass's look found no distributed job (it was committed just after), and the same pass places it:
    the store is started for it rather than its ranks launched without one (they all fail)."""
    host = prepared(monkeypatch, distributed=False)
    assert host.addr() is None
    s = SimpleNamespace(info={"rendezvous": host})
    job = SimpleNamespace(id="j1", attempt=1, ranks=2)
    rdv = rendezvous.rendezvous(s, job, "start")  # type: ignore[arg-type]
    assert rdv is not None and rdv.addr == "198.18.0.1:4321" and rdv.prefix == "j1/1/start"
    assert host.addr() == "198.18.0.1:4321"
