"""Regions in the control plane (real API and database, scripted agents): pins to a region or a cluster are
kept by the scheduler and by `tidal migrate`; a checkpoint knows the regions whose store holds it, and a
restore in another region is told where to copy it from, then recorded as a replica there."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tidal.control import tokens
from tidal.control.reconcile import Reconciler, snapshot
from tidal.control.regionstores import RegionStores
from tidal.core import Links
from tidal.policy.registry import make_live_policy
from tidal.testing.control import FakeAgent, Plane, checkpoint_result


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[Plane]:
    p = Plane(tmp_path)
    p.db.info["stores"] = RegionStores(None, {"west": "s3://ck-west/t", "east": "s3://ck-east/t"})
    yield p
    p.db.close()


def agents(plane: Plane) -> tuple[FakeAgent, FakeAgent]:
    w = FakeAgent(plane, "w1", "W", region="west", cluster="west-a")
    e = FakeAgent(plane, "e1", "E", region="east", cluster="east-a")
    assert w.register() == 200 and e.register() == 200
    return w, e


def started(agent: FakeAgent, pid: int, **extra: Any) -> dict[str, Any]:
    (act,) = [a for a in agent.actions() if a["kind"] in ("launch", "restore")]
    assert agent.result(act, ranks=[{"rank": 0, "pid": pid}], **extra)
    return act


def migrate(plane: Plane, jid: str, **body: Any) -> Any:
    return plane.http.post(f"/v1/jobs/{jid}/migrate", headers=plane.as_user(), json=body)


def test_a_job_pinned_to_a_region_or_cluster_starts_only_there(plane: Plane) -> None:
    w, e = agents(plane)
    east = plane.submit(region="east")
    plane.rec.once()
    assert plane.job(east)["placement"][0]["node"] == "e1"
    started(e, 10)
    west = plane.submit(cluster="west-a")
    plane.rec.once()
    assert plane.job(west)["placement"][0]["node"] == "w1"
    # Pinned where nothing is free: it waits, though a device is free elsewhere.
    started(w, 11)
    assert plane.http.post(f"/v1/jobs/{west}/cancel", headers=plane.as_user()).status_code == 200
    waiting = plane.submit(region="east")
    plane.rec.once()
    assert plane.job(waiting)["state"] == "pending"


def test_a_move_to_another_region_copies_the_checkpoint_there_first(plane: Plane) -> None:
    w, e = agents(plane)
    jid = plane.submit(region=None, cluster=None)
    plane.rec.once()
    first = plane.job(jid)["placement"][0]["node"]
    here, there = (w, e) if first == "w1" else (e, w)
    started(here, 10)
    r = migrate(plane, jid, region=there.region)
    assert r.status_code == 200 and r.json()["to"] == there.name, r.text
    (ck,) = [a for a in here.actions() if a["kind"] == "checkpoint"]
    assert ck["payload"]["warm"] is False  # no pre-copy: the cut comes at once
    assert here.result(ck, **checkpoint_result("000001-a"))
    # While it copies, its node reports what is left (tidal show: "copying its checkpoint ... to go").
    attempt = plane.job(jid)["attempt"]
    r = plane.http.post(f"/v1/agent/{there.name}/heartbeat", headers=plane.as_agent(), json={
        "agent_id": there.id, "jobs": {jid: {"attempt": attempt, "copy_to_go_bytes": 3 << 20,
                                             "copy_total_bytes": 5 << 20}}})
    assert r.status_code == 200, r.text
    prog = plane.job(jid)["progress"]
    assert (prog["copy_to_go_bytes"], prog["copy_total_bytes"]) == (3 << 20, 5 << 20)
    restore = started(there, 20, replicated_bytes=5 << 20, replicated_chunks=7, replicated_s=1.5)
    assert restore["kind"] == "restore"
    assert restore["payload"]["checkpoint"]["parts"] == ["000001-a"]
    assert restore["payload"]["checkpoint"]["source"] == f"s3://ck-{here.region}/t"
    j = plane.job(jid)
    assert j["state"] == "running" and j["placement"][0]["node"] == there.name
    assert j["checkpoints"][-1]["regions"] == sorted([here.region, there.region])
    (ev,) = [x for x in j["events"] if x["kind"] == "replicated"]
    ck = j["checkpoints"][-1]["id"]
    assert ev["detail"] == (f"checkpoint {ck} copied from region {here.region} to {there.region}: 7 chunk(s), "
                            "5.0 MiB crossed in 1.5s")

    # Back again: this region's store holds that checkpoint already, so nothing is to be copied for it;
    # the new checkpoint (taken there) is.
    r = migrate(plane, jid, region=here.region)
    (ck,) = [a for a in there.actions() if a["kind"] == "checkpoint"]
    assert there.result(ck, **checkpoint_result("000002-b"))
    restore = started(here, 30)
    assert restore["payload"]["checkpoint"]["source"] == f"s3://ck-{there.region}/t"
    assert plane.job(jid)["checkpoints"][-1]["regions"] == [there.region]  # not replicated: no bytes reported


def test_moves_outside_a_pin_and_to_unknown_places_are_refused(plane: Plane) -> None:
    w, _ = agents(plane)
    jid = plane.submit(region="west")
    plane.rec.once()
    started(w, 10)
    r = migrate(plane, jid, region="east")
    assert r.status_code == 409 and r.json()["message"] == f"job {jid} is pinned to region west: it cannot move to " \
                                                            "region east"
    r = migrate(plane, jid, to="e1")
    assert r.status_code == 409 and r.json()["message"] == f"job {jid} is pinned to region west: it cannot move to e1"
    r = migrate(plane, jid, region="north")
    assert r.status_code == 404 and r.json()["message"] == "no region north"
    assert r.json()["hint"] == "the regions are: east, west"
    r = migrate(plane, jid, cluster="east-a", to="e1")
    assert r.status_code == 422
    assert plane.job(jid)["state"] == "running"


def test_a_pin_is_a_name(plane: Plane) -> None:
    r = plane.http.post("/v1/jobs", headers=plane.as_user(), json={"command": ["true"], "workdir": "/tmp",
                                                                    "region": "../west"})
    assert r.status_code == 422
    assert r.json()["message"].startswith("region '../west' is not a region name")


def _running_with_a_checkpoint_in_west(plane: Plane) -> tuple[str, FakeAgent, FakeAgent, str]:
    """A job on w1 (west) with a committed checkpoint there, and node e1 (east) free."""
    w = FakeAgent(plane, "w1", "W", region="west", cluster="west-a")
    assert w.register() == 200
    jid = plane.submit()
    plane.rec.once()
    started(w, 10)
    assert plane.http.post(f"/v1/jobs/{jid}/preempt", headers=plane.as_user()).status_code == 200
    (ck,) = w.actions()
    assert w.result(ck, **checkpoint_result("000001-a"))
    assert plane.http.post(f"/v1/jobs/{jid}/resume", headers=plane.as_user()).status_code == 200
    plane.rec.once()
    started(w, 11)
    e = FakeAgent(plane, "e1", "E", region="east", cluster="east-a")
    assert e.register() == 200
    return jid, w, e, plane.job(jid)["checkpoints"][-1]["id"]


def test_a_move_to_another_region_pre_copies_the_last_checkpoint_while_the_job_runs(plane: Plane) -> None:
    jid, w, e, last = _running_with_a_checkpoint_in_west(plane)
    assert migrate(plane, jid, region="east").status_code == 200
    # First the copy, while the job runs on: no checkpoint is asked of its node yet.
    (prestage,) = e.actions()
    assert prestage["kind"] == "prestage"
    assert prestage["payload"]["checkpoint"]["id"] == last
    assert prestage["payload"]["checkpoint"]["source"] == "s3://ck-west/t"
    assert w.actions() == []
    j = plane.job(jid)
    assert j["state"] == "running" and j["busy"]
    assert [x["kind"] for x in j["events"]][-1] == "precopying"
    r = plane.http.post(f"/v1/jobs/{jid}/preempt", headers=plane.as_user())
    assert r.status_code == 409 and "copied to the target region's store" in r.json()["message"]

    assert e.result(prestage, checkpoint=last, ranks=[0], bytes=3 << 20, seconds=2.0, replicated_bytes=2 << 20,
                    replicated_chunks=40)
    j = plane.job(jid)
    assert j["checkpoints"][-1]["regions"] == ["east", "west"]
    (ev,) = [x for x in j["events"] if x["kind"] == "replicated"]
    assert ev["detail"] == (f"checkpoint {last} copied from region west to east: 40 chunk(s), 2.0 MiB crossed "
                            "ahead of the move")
    # Then the move's checkpoint; what the copy prestaged stays for the restore (no second prestage).
    (ck,) = w.actions()
    assert ck["kind"] == "checkpoint" and j["state"] == "checkpointing"
    # The job ran on through the copy: its dump's memory is made ready before the cut as well.
    assert ck["payload"]["warm"] is True
    assert w.result(ck, **checkpoint_result("000002-b"))
    restore = started(e, 20, replicated_bytes=1 << 20, replicated_chunks=3, replicated_s=0.5)
    assert restore["payload"]["checkpoint"]["source"] == "s3://ck-west/t"
    assert e.actions() == []  # nothing dropped: the restore took what was prestaged
    assert plane.job(jid)["state"] == "running" and plane.job(jid)["placement"][0]["node"] == "e1"


def test_a_failed_pre_copy_does_not_hold_the_move(plane: Plane) -> None:
    jid, w, e, _ = _running_with_a_checkpoint_in_west(plane)
    assert migrate(plane, jid, region="east").status_code == 200
    (prestage,) = e.actions()
    assert e.result(prestage, ok=False)
    (ck,) = w.actions()  # the move goes on: its restore copies the whole checkpoint
    assert ck["kind"] == "checkpoint"
    assert w.result(ck, **checkpoint_result("000002-b"))
    started(e, 20)
    assert plane.job(jid)["placement"][0]["node"] == "e1"


def test_a_target_lost_during_the_pre_copy_does_not_hold_the_move(plane: Plane) -> None:
    jid, w, e, _ = _running_with_a_checkpoint_in_west(plane)
    assert migrate(plane, jid, region="east").status_code == 200
    assert [a["kind"] for a in e.actions()] == ["prestage"]
    assert plane.http.post("/v1/agent/e1/leave", headers=plane.as_agent(), json={"agent_id": "E"}).status_code in (
        200, 204)
    j = plane.job(jid)
    assert any(x["kind"] == "migration_target_lost" for x in j["events"]), j["events"]
    (ck,) = w.actions()  # the checkpoint goes ahead; the job lands wherever there is room
    assert ck["kind"] == "checkpoint" and j["state"] == "checkpointing"


GB = 1_000_000_000


def links(plane: Plane) -> list[dict[str, Any]]:
    r = plane.http.get("/v1/links", headers=plane.as_user())
    assert r.status_code == 200, r.text
    return [{k: v for k, v in x.items() if k != "measured_at"} for x in r.json()]  # type: ignore[no-any-return]


def moved_to_east(plane: Plane, w: FakeAgent, e: FakeAgent, copied: int, seconds: float) -> str:
    """A job of one rank placed on w1 (e1 not registered yet, or w1 the best fit), moved to e1 by its user: the
    restore there reports that ``copied`` stored bytes of its checkpoint crossed from west's store in
    ``seconds``. Its id."""
    jid = plane.submit()
    plane.rec.once()
    started(w, 10)
    assert e.register() == 200
    assert migrate(plane, jid, region="east").status_code == 200
    (ck,) = [a for a in w.actions() if a["kind"] == "checkpoint"]
    assert w.result(ck, **checkpoint_result(f"00000{len(links(plane)) + 1}-a"))
    plane.rec.once()
    started(e, 20, replicated_bytes=copied, replicated_chunks=copied // (4 << 20), replicated_s=seconds)
    return jid


def test_the_link_between_two_regions_is_measured_from_the_copies_over_it(plane: Plane) -> None:
    w = FakeAgent(plane, "w1", "W", region="west", cluster="west-a")
    e = FakeAgent(plane, "e1", "E", devices=2, region="east", cluster="east-a")
    assert w.register() == 200 and e.register() == 200
    a = moved_to_east(plane, w, e, 5 << 20, 1.5)
    assert links(plane) == []  # 5 MiB: too small to time
    with plane.db.read() as s:
        view, _ = snapshot(s, links=Links(region_gbps=0.2))
    assert dict(view.links.pair_gbps) == {} and view.links.region_gbps == 0.2  # TIDAL_REGION_GBPS's, else 0.5
    assert e.exit(a, plane.job(a)["attempt"])

    b = moved_to_east(plane, w, e, 2 * GB, 4.0)
    assert links(plane) == [{"from": "west", "to": "east", "gbps": 0.5, "copies": 1, "samples": 1}]
    assert e.exit(b, plane.job(b)["attempt"])
    moved_to_east(plane, w, e, GB, 0.5)
    assert links(plane) == [{"from": "west", "to": "east", "gbps": 1.25, "copies": 2, "samples": 2}]
    with plane.db.read() as s:
        view, _ = snapshot(s, links=Links(region_gbps=0.2))
    # The measured rate of the pair, over the setting's; the other direction, unmeasured, keeps the setting's.
    assert view.links.between("west", "east") == 1.25
    assert view.links.between("east", "west") == 0.2
    # The metric says the same.
    with plane.db.tx() as s:
        token = tokens.create_user(s, "prometheus", "metrics")
    scraped = plane.http.get("/metrics", headers={"Authorization": f"Bearer {token}"}).text
    assert 'tidal_region_link_gbps{from="west",to="east"} 1.25' in scraped.splitlines()


def test_a_copy_ahead_of_a_move_is_timed_too(plane: Plane) -> None:
    jid, _, e, last = _running_with_a_checkpoint_in_west(plane)
    assert migrate(plane, jid, region="east").status_code == 200
    (prestage,) = e.actions()
    assert e.result(prestage, checkpoint=last, ranks=[0], bytes=3 * GB, seconds=9.0, replicated_bytes=3 * GB,
                    replicated_chunks=700, replicated_s=8.0)
    assert links(plane) == [{"from": "west", "to": "east", "gbps": 0.375, "copies": 1, "samples": 1}]


@pytest.mark.parametrize(("measured_gbps", "setting_gbps", "moved"), [
    (1.0, 0.001, True),  # measured fast: the move is worth it, though the setting says the link is slow
    (0.01, None, False),  # measured slow: 12.4 GB would take 1240 s, over the 600 s bound (at 0.5 GB/s, 25 s)
])
def test_the_scheduler_weighs_a_move_between_regions_at_the_measured_rate(
        plane: Plane, measured_gbps: float, setting_gbps: float | None, moved: bool) -> None:
    """A basic job of two ranks (no heartbeat yet: 6.2 GB a rank, 12.4 GB) fills west's node; a premium job
    pinned to west comes: the basic job moves to east's idle node, or is preempted, as the rate measured from
    west to east says."""
    plane.rec = Reconciler(plane.db, make_live_policy(),
                           links=Links(region_gbps=setting_gbps) if setting_gbps else None)
    w = FakeAgent(plane, "w1", "W", devices=2, region="west", cluster="west-a")
    e = FakeAgent(plane, "e1", "E", devices=2, region="east", cluster="east-a")
    assert w.register() == 200
    # A first job moved west → east: its restore times the link (200 MB at the rate measured).
    first = moved_to_east(plane, w, e, 200_000_000, 0.2 / measured_gbps)
    assert links(plane)[0]["gbps"] == pytest.approx(measured_gbps)
    basic = plane.submit(ranks=2, tier="basic")  # only west's node has two devices free
    plane.rec.once()
    (act,) = w.actions()
    assert act["kind"] == "launch" and act["job_id"] == basic
    assert w.result(act, ranks=[{"rank": 0, "pid": 30}, {"rank": 1, "pid": 31}])
    assert e.exit(first, plane.job(first)["attempt"])  # east's node is idle now

    premium = plane.submit(ranks=2, tier="premium", region="west")
    plane.rec.once()
    (ck,) = w.actions()
    assert ck["kind"] == "checkpoint" and ck["job_id"] == basic
    j = plane.job(basic)
    why = [x["detail"] for x in j["events"] if x["kind"] == "migrate"]
    if moved:
        assert len(why) == 1 and why[0].startswith("to e1 by the scheduler: ") and f"make room for {premium}" in why[0]
    else:
        assert why == [] and j["state"] == "checkpointing"
        assert plane.job(premium)["state"] == "pending"


WEST_STORE = "s3://ck-west/t"
UNREACHABLE = (f"the checkpoint store {WEST_STORE} cannot be reached: checkpoint store error reading "
               f"{WEST_STORE}/jobs/j/x/manifest.json: ConnectionRefusedError (tried 6 times in 5.8 s)")


def unreachable(store: str = WEST_STORE) -> dict[str, Any]:
    """What an agent reports when a restore could not copy its checkpoint from ``store`` (Executor._run)."""
    return {"unreachable": {"store": store, "message": UNREACHABLE}}


def user(plane: Plane, path: str) -> None:
    assert plane.http.post(path, headers=plane.as_user()).status_code == 200


def _held_in_west_only(plane: Plane, *, older_in_east: bool,
                       **submit: Any) -> tuple[str, FakeAgent, list[dict[str, Any]]]:
    """A job preempted on w1 (west) with its newest checkpoint in west's store alone, and, with
    ``older_in_east``, an older one in both regions' stores (taken on e1, where the job ran first, and copied to
    west by its move there). Then w1 leaves: the job can be resumed only on e1 (east). Its id, e1's agent, and
    its checkpoints (as `tidal show` lists them), oldest first."""
    w = FakeAgent(plane, "w1", "W", region="west", cluster="west-a")
    e = FakeAgent(plane, "e1", "E", region="east", cluster="east-a")
    first, other = (e, w) if older_in_east else (w, e)
    assert first.register() == 200
    jid = plane.submit(**submit)
    plane.rec.once()
    started(first, 10)
    assert other.register() == 200
    if older_in_east:
        assert migrate(plane, jid, region="west").status_code == 200
        (ck,) = e.actions()
        assert e.result(ck, **checkpoint_result("000001-a"))
        started(w, 11, replicated_bytes=1 << 20, replicated_chunks=3, replicated_s=0.1)
    user(plane, f"/v1/jobs/{jid}/preempt")
    (ck,) = w.actions()
    assert w.result(ck, **checkpoint_result("000002-b"))
    j = plane.job(jid)
    assert [c["regions"] for c in j["checkpoints"]] == ([["east", "west"], ["west"]] if older_in_east else [["west"]])
    assert plane.http.post("/v1/agent/w1/leave", headers=plane.as_agent(), json={"agent_id": "W"}).status_code in (
        200, 204)
    user(plane, f"/v1/jobs/{jid}/resume")
    return jid, e, j["checkpoints"]


def ref(ck: dict[str, Any], source: str | None) -> dict[str, Any]:
    """A restore order's checkpoint: ``ck`` (`tidal show`'s), copied first from ``source``."""
    return {"id": ck["id"], "parts": ck["parts"], "source": source}


def test_a_checkpoint_in_a_store_that_cannot_be_reached_is_skipped_for_an_older_one_held_elsewhere(
        plane: Plane) -> None:
    jid, e, (old, new) = _held_in_west_only(plane, older_in_east=True)
    older, newest = old["id"], new["id"]
    plane.rec.once()
    (act,) = e.actions()
    assert act["kind"] == "restore"
    assert act["payload"]["checkpoint"] == ref(new, WEST_STORE)
    assert e.result(act, ok=False, **unreachable())

    j = plane.job(jid)
    assert j["state"] == "pending" and j["restarts"] == 0 and j["resume_from"] == older
    (skipped,) = [x for x in j["events"] if x["kind"] == "checkpoint_skipped"]
    assert skipped["detail"] == (
        f"checkpoint {newest} is skipped: e1 could not copy it from region west's store: {UNREACHABLE}; resuming "
        f"from checkpoint {older}, the newest older one, held in region east's store")
    assert skipped["cause"] == act["id"]
    assert j["events"][-1]["detail"] == (f"checkpoint {newest} is in a store that cannot be reached; requeued from "
                                         f"checkpoint {older}, not counted as a restart (0/3 used)")
    # Both checkpoints stay committed: the newest is not damaged, only out of reach for now.
    assert [(c["id"], c["state"]) for c in j["checkpoints"]] == [(older, "committed"), (newest, "committed")]

    plane.rec.once()
    (act,) = e.actions()
    assert act["kind"] == "restore"
    assert act["payload"]["checkpoint"] == ref(old, None)  # east's store has it: nothing to copy
    assert e.result(act, ranks=[{"rank": 0, "pid": 20}])
    j = plane.job(jid)
    assert j["state"] == "running" and j["restarts"] == 0 and j["placement"][0]["node"] == "e1"
    running = [x["detail"] for x in j["events"] if x["kind"] == "running"]
    assert running[-1] == f"on e1 devices [0], restoring from checkpoint {older}"


def test_with_no_older_checkpoint_held_elsewhere_the_restore_fails_naming_the_store(plane: Plane) -> None:
    jid, e, (ck,) = _held_in_west_only(plane, older_in_east=False, max_restarts=0)
    only = ck["id"]
    plane.rec.once()
    (act,) = e.actions()
    assert act["payload"]["checkpoint"] == ref(ck, WEST_STORE)
    assert e.result(act, ok=False, **unreachable())
    j = plane.job(jid)
    assert j["state"] == "failed" and j["restarts"] == 0
    assert j["error"] == (f"restore failed: checkpoint {only} must be copied from the checkpoint store of region west "
                          f"({WEST_STORE}), which cannot be reached from e1, and no older checkpoint of job {jid} is "
                          "held elsewhere")
    assert j["events"][-1]["detail"] == f"{j['error']}; no restarts left (0)"
    assert not any(x["kind"] == "checkpoint_skipped" for x in j["events"])


def test_a_store_that_cannot_be_reached_counts_a_restart_while_restarts_are_left(plane: Plane) -> None:
    """The store may come back: the restore is tried again from the same checkpoint, as a restart."""
    jid, e, (ck,) = _held_in_west_only(plane, older_in_east=False)
    plane.rec.once()
    (act,) = e.actions()
    assert e.result(act, ok=False, **unreachable())
    j = plane.job(jid)
    assert j["state"] == "pending" and j["restarts"] == 1 and j["resume_from"] is None
    plane.rec.once()
    (act,) = e.actions()
    assert act["payload"]["checkpoint"] == ref(ck, WEST_STORE)


def test_another_store_reported_unreachable_is_an_ordinary_failure(plane: Plane) -> None:
    jid, e, _ = _held_in_west_only(plane, older_in_east=True)
    plane.rec.once()
    (act,) = e.actions()
    assert e.result(act, ok=False, **unreachable("s3://ck-east/t"))  # not the one it was to copy from
    j = plane.job(jid)
    assert j["state"] == "pending" and j["restarts"] == 1 and j["resume_from"] is None
    assert not any(x["kind"] == "checkpoint_skipped" for x in j["events"])
