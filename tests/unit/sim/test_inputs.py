"""Trace loaders, bad rows, the tier rule, load rescaling and --cluster parsing."""

from __future__ import annotations

import lzma
from pathlib import Path
from typing import Any

import pytest

from tidal.core import Tier
from tidal.errors import ValidationError
from tidal.policy.registry import make_policy
from tidal.sim.cluster_spec import parse_cluster
from tidal.sim.engine import Simulator
from tidal.sim.experiment import check_policies, prepare
from tidal.sim.trace import TraceJob, assign_tiers, assign_users, load_trace, offered_load, rescale_load


def write(tmp_path: Path, name: str, text: str) -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_generic_csv_with_tiers_and_projects(tmp_path: Path) -> None:
    path = write(tmp_path, "t.csv", "submit_time,duration,num_gpus,tier,project\n10,100,2,premium,a\n0,50,1,,b\n")
    tr = load_trace(path)
    assert [(j.submit, j.duration, j.gpus, j.tier, j.project) for j in tr.jobs] == [
        (0.0, 50.0, 1, None, "b"), (10.0, 100.0, 2, Tier.PREMIUM, "a")]


def test_generic_csv_with_users(tmp_path: Path) -> None:
    path = write(tmp_path, "t.csv", "submit_time,duration,num_gpus,user\n0,50,1,alice\n5,50,1,\n")
    assert [j.user for j in load_trace(path).jobs] == ["alice", None]  # None: every such job one user's


def test_synthetic_users_are_seeded_and_keep_a_burst_together() -> None:
    jobs = [TraceJob(f"j{i}", t, 10.0, 1, Tier.BASIC, p) for i, (t, p) in enumerate(
        [(0, "a"), (30, "a"), (50, "b"), (80, "a"), (500, "a"), (510, "a"), (900, "a")])] + [
        TraceJob("own", 901, 10.0, 1, Tier.BASIC, "a", user="carol")]
    users = [j.user for j in assign_users(jobs, users_per_project=4, burst_s=60.0, seed=3)]
    assert users == [j.user for j in assign_users(jobs, users_per_project=4, burst_s=60.0, seed=3)]
    assert users[0] == users[1] == users[3] and users[4] == users[5]  # a's bursts: 0-80 s, 500-510 s
    assert all(u is not None and u.split("/")[0] == j.project for u, j in zip(users[:7], jobs[:7], strict=True))
    assert users[7] == "carol"  # a trace's own user is kept
    assert {u for u in (j.user for j in assign_users(jobs * 50, users_per_project=4, seed=1)) if u != "carol"} <= {
        f"{p}/u{k}" for p in "ab" for k in range(1, 5)}
    with pytest.raises(ValidationError):
        assign_users(jobs, users_per_project=0)


def test_the_simulator_gives_the_policy_each_jobs_user() -> None:
    topo = parse_cluster("1x2").topology
    sim = Simulator(topo, [TraceJob("a", 0.0, 10.0, 1, Tier.BASIC, user="alice"),
                           TraceJob("n", 0.0, 10.0, 1, Tier.BASIC)], make_policy("singularity"),
                    device_caps={"alice": 1})
    sim.run()
    assert {j.id: sim._job_view(j).owner for j in sim.jobs.values()} == {"a": "alice", "n": ""}
    assert sim.view.device_caps == {"alice": 1}


def test_the_simulator_gives_the_policy_each_projects_cap() -> None:
    # Two devices, vision may hold one: its second job starts when its first ends, nlp's at once.
    jobs = [TraceJob("v1", 0.0, 10.0, 1, Tier.BASIC, "vision", user="alice"),
            TraceJob("v2", 0.0, 10.0, 1, Tier.BASIC, "vision", user="bob"),
            TraceJob("n", 1.0, 10.0, 1, Tier.BASIC, "nlp", user="carol")]
    log: list[dict[str, Any]] = []
    sim = Simulator(parse_cluster("1x2").topology, jobs, make_policy("singularity"), project_caps={"vision": 1},
                    log=log.append)
    sim.run()
    assert sim.view.project_caps == {"vision": 1}
    placed = [(r["job"], r["time"]) for r in log if r["type"] == "action" and r["kind"] == "place"]
    assert [j for j, _ in placed] == ["v1", "n", "v2"] and dict(placed)["v2"] >= 10.0


@pytest.mark.parametrize(
    ("row", "reason"),
    [("5,,1", "missing duration"), ("5,-3,1", "negative duration"), ("5,10,0", "num_gpus must be > 0"),
     ("5,10,1.5", "not an integer"), ("x,10,1", "not a number")],
)
def test_bad_rows_are_reported_with_line_numbers(tmp_path: Path, row: str, reason: str) -> None:
    path = write(tmp_path, "t.csv", f"submit_time,duration,num_gpus\n0,1,1\n{row}\n")
    tr = load_trace(path, on_bad_row="skip")
    assert len(tr.jobs) == 1 and tr.bad_rows[0].line == 3 and reason in tr.bad_rows[0].reason
    with pytest.raises(ValidationError) as e:
        load_trace(path, on_bad_row="fail")
    assert e.value.fields["line"] == 3 and "line 3" in e.value.message


def test_philly_loader_reads_xz_and_uses_the_vc_as_project(tmp_path: Path) -> None:
    p = tmp_path / "philly.csv.xz"
    p.write_bytes(lzma.compress(
        b"timestamp,duration,num_gpus,gpu_time,cluster\n2017-10-01 00:00:10,60.0,1,60.0,aa\n"
        b"2017-10-01 00:00:00,30.0,2,60.0,bb\n2017-10-01 00:00:20,-1,1,0,aa\n"))
    tr = load_trace(str(p))
    assert [(j.submit, j.duration, j.gpus, j.project) for j in tr.jobs] == [(0.0, 30.0, 2, "bb"), (10.0, 60.0, 1, "aa")]
    assert tr.bad_rows[0].line == 4


def test_gavel_trace(tmp_path: Path) -> None:
    line = "ResNet-18\tcd x && python3 main.py\t--num_steps\t1\t500\t{t}\t{g}\n"
    path = write(tmp_path, "vc1.trace", line.format(t="0.0", g=2) + line.format(t="7.5", g=1) + "bad\tline\n")
    tr = load_trace(path, gavel_step_s=2.0)
    got = [(j.submit, j.duration, j.gpus, j.project) for j in tr.jobs]
    assert got == [(0.0, 1000.0, 2, "vc1"), (7.5, 1000.0, 1, "vc1")]
    assert tr.bad_rows[0].line == 3


def test_tier_rule_is_seeded_and_close_to_the_mix(tmp_path: Path) -> None:
    path = write(tmp_path, "t.csv", "submit_time,duration,num_gpus\n" + "".join(f"{i},10,1\n" for i in range(5000)))
    jobs = load_trace(path).jobs
    a, b = assign_tiers(jobs, seed=1), assign_tiers(jobs, seed=1)
    assert [j.tier for j in a] == [j.tier for j in b]
    assert [j.tier for j in a] != [j.tier for j in assign_tiers(jobs, seed=2)]
    share = {t: sum(j.tier is t for j in a) / len(a) for t in Tier}
    assert abs(share[Tier.PREMIUM] - 0.2) < 0.02 and abs(share[Tier.STANDARD] - 0.3) < 0.02


def test_load_rescaling_hits_the_target(tmp_path: Path) -> None:
    path = write(tmp_path, "t.csv", "submit_time,duration,num_gpus\n0,100,1\n10,100,2\n100,300,1\n")
    jobs = load_trace(path).jobs
    assert offered_load(jobs, 4) == pytest.approx(600 / (4 * 100))
    scaled = rescale_load(jobs, 4, 0.75)
    assert offered_load(scaled, 4) == pytest.approx(0.75)
    assert [j.submit for j in scaled] == pytest.approx([0.0, 20.0, 200.0])


def test_cluster_specs(tmp_path: Path) -> None:
    c = parse_cluster("4x8")
    assert c.topology.devices == 32 and not c.pinned
    y = write(tmp_path, "c.yaml", "regions:\n- name: w\n  clusters:\n  - {name: a, nodes: 2, devices_per_node: 4}\n"
              "- name: e\n  clusters:\n  - {name: b, nodes: 1, devices_per_node: 8}\n")
    t = parse_cluster(y).topology
    assert t.devices == 16 and t.region_of("b") == "e"
    v = parse_cluster(write(tmp_path, "vc.csv", "vc,node num\nx,2\ny,1\n"))
    assert v.pinned and v.topology.cluster("x").devices == 16
    with pytest.raises(ValidationError):
        parse_cluster("nonsense")


def test_jobs_too_large_or_of_unknown_vcs_are_reported(tmp_path: Path) -> None:
    path = write(tmp_path, "t.csv", "submit_time,duration,num_gpus,tier,project\n0,10,1,basic,x\n1,10,64,basic,x\n"
                 "2,10,1,basic,zz\n3,10,1,basic,y\n")
    vc = write(tmp_path, "vc.csv", "vc,node num\nx,2\ny,1\n")
    p = prepare(path, vc)
    assert len(p.jobs) == 2 and p.excluded_too_large == ["j2"] and p.excluded_unknown_vc == {"zz": 1}
    p2 = prepare(path, "1x8")
    assert p2.excluded_too_large == ["j2"] and len(p2.jobs) == 3


def test_unknown_policy_lists_the_valid_ones() -> None:
    with pytest.raises(ValidationError) as e:
        check_policies(["fifo", "magic"])
    assert "magic" in e.value.message and "singularity" in (e.value.hint or "") and "tiresias" in (e.value.hint or "")
