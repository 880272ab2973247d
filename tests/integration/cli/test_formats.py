"""`-o table|wide|json|yaml` of every listing and show command, through the real `tidal` against a real API:
JSON is the API's objects under the documented field names, raw; tables are in human units, plain full rows
when piped, colour only on a terminal and never with NO_COLOR."""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
from datetime import datetime
from typing import Any

import httpx
import pytest
import yaml

from tests.integration.cli.conftest import Served
from tidal.cli.listings import LISTINGS
from tidal.control import linkrates, tokens
from tidal.testing.control import FakeAgent, checkpoint_result

AGO = r"\d+s ago"


def api(s: Served, path: str, token: str | None = None) -> Any:
    r = httpx.get(s.url + path, headers={"Authorization": f"Bearer {token or s.plane.user}"}, timeout=30)
    r.raise_for_status()
    return r.json()


def clock(t: float) -> str:
    return datetime.fromtimestamp(t).strftime("%H:%M:%S")


@pytest.fixture
def job(served_plane: Served) -> str:
    """A running job of 2 ranks on node-1 with one committed checkpoint of 4 GiB (1.5 GiB of it new)."""
    p = served_plane.plane
    a = FakeAgent(p, "node-1", "A", devices=2)
    a.register()
    jid = p.submit(name="train", ranks=2)
    p.rec.once()
    (act,) = a.actions()
    assert a.result(act, ranks=[{"rank": 0, "pid": 11}, {"rank": 1, "pid": 12}])
    assert p.http.post(f"/v1/jobs/{jid}/preempt", headers=p.as_user()).status_code == 200
    (act,) = a.actions()
    assert a.result(act, **checkpoint_result(act["payload"]["checkpoint_id"], size=4 * 2**30, stored=3 * 2**29))
    assert p.http.post(f"/v1/jobs/{jid}/resume", headers=p.as_user()).status_code == 200
    p.rec.once()
    (act,) = a.actions()
    assert a.result(act, ranks=[{"rank": 0, "pid": 21}, {"rank": 1, "pid": 22}])
    assert p.job(jid)["state"] == "running"
    return jid


def test_ls(served_plane: Served, job: str) -> None:
    lines = served_plane.cli("ls").stdout.splitlines()
    assert lines[0] == "ID        NAME   TIER   RANKS  STATE    NODES   RESTARTS  SUBMITTED  REASON"
    assert re.fullmatch(rf"{job}  train  basic  2      running  node-1  0         {AGO} +-", lines[1]), lines[1]
    assert len(lines) == 2
    wide = served_plane.cli("ls", "-o", "wide").stdout.splitlines()
    assert wide[0] == ("ID        NAME   OWNER  TIER   RANKS  STATE    NODES   RESTARTS  EXIT  SUBMITTED  "
                       "SUBMITTED AT  REASON")
    submitted = api(served_plane, "/v1/jobs")[0]["submitted_at"]
    assert re.fullmatch(rf"{job}  train  alice  basic  2      running  node-1  0         -     {AGO} +"
                        + clock(submitted) + " +-", wide[1]), wide[1]
    as_json = json.loads(served_plane.cli("ls", "-o", "json").stdout)
    assert as_json == api(served_plane, "/v1/jobs")
    assert list(as_json[0]) == list(LISTINGS["ls"].fields)
    assert yaml.safe_load(served_plane.cli("ls", "-o", "yaml").stdout) == as_json


def test_show(served_plane: Served, job: str) -> None:
    detail = api(served_plane, f"/v1/jobs/{job}")
    for args in (("-o", "json"), ("--json",)):
        assert json.loads(served_plane.cli("show", job, *args).stdout) == detail
    assert yaml.safe_load(served_plane.cli("show", job, "-o", "yaml").stdout) == detail
    assert list(detail) == list(LISTINGS["show"].fields)
    assert list(detail["placement"][0]) == list(LISTINGS["show: placement"].fields)
    out = served_plane.cli("show", job).stdout
    lines = out.splitlines()
    assert lines[:9] == [
        f"{job} train  basic  running",
        "command: train",
        f"workdir: {served_plane.plane.workdir}",
        "ranks: 2 on 2 device(s), allowed 1..2",
        "",
        "RANK  NODE    DEVICE  PID",
        "0     node-1  0       21",
        "1     node-1  1       22",
        "",
    ]
    ck = detail["checkpoints"][0]["id"]
    assert lines[9] == "CHECKPOINT" + " " * (len(ck) - 8) + "CREATED  SIZE     STORED   STATE"
    assert re.fullmatch(rf"{ck}  {AGO} +4\.0 GiB  1\.5 GiB  committed", lines[10]), lines[10]
    events = [ln.split() for ln in lines[12:]]
    assert events[0] == ["TIME", "KIND", "NODE", "CAUSE", "DETAIL"]
    assert [e[1] for e in events[1:]] == [e["kind"] for e in detail["events"]]
    assert events[1][0] == clock(detail["events"][0]["time"])


def test_checkpoints_nodes_events(served_plane: Served, job: str) -> None:
    rows = api(served_plane, f"/v1/jobs/{job}/checkpoints")
    assert json.loads(served_plane.cli("checkpoints", job, "-o", "json").stdout) == rows
    assert list(rows[0]) == list(LISTINGS["checkpoints"].fields)
    wide = served_plane.cli("checkpoints", job, "-o", "wide").stdout.splitlines()
    ck = rows[0]["id"]
    assert wide[0] == ("CHECKPOINT" + " " * (len(ck) - 8)
                       + "CREATED  CREATED AT  SIZE     STORED   PARTS  REGIONS  STATE")
    assert re.fullmatch(rf"{ck}  {AGO} +{clock(rows[0]['created_at'])}    4\.0 GiB  1\.5 GiB  1      -        "
                        "committed", wide[1]), wide[1]

    nodes = api(served_plane, "/v1/nodes")
    assert yaml.safe_load(served_plane.cli("nodes", "-o", "yaml").stdout) == [
        {**nodes[0], "lease_left_s": pytest.approx(nodes[0]["lease_left_s"], abs=5)}]
    assert list(nodes[0]) == list(LISTINGS["nodes"].fields)
    table = served_plane.cli("nodes", "-o", "wide").stdout.splitlines()
    assert table[0] == "NODE    ADDRESS  REGION/CLUSTER  DEVICES  FREE  CPUS  UP   LEASE LEFT  DRAINED"
    assert re.fullmatch(r"node-1  -        local/local     2        0     2     yes  \d\d\.\d s      -", table[1]), \
        table[1]

    evs = api(served_plane, "/v1/events")
    assert json.loads(served_plane.cli("events", "-o", "json").stdout) == evs
    assert list(evs[0]) == list(LISTINGS["events"].fields)
    lines = served_plane.cli("events").stdout.splitlines()
    assert lines[0].split() == ["TIME", "JOB", "KIND", "NODE", "CAUSE", "DETAIL"]
    # Every row whole, however long its detail: nothing wrapped, nothing cut off.
    assert len(lines) == len(evs) + 1
    for line, e in zip(lines[1:], evs, strict=True):
        assert line.startswith(clock(e["time"])) and line.endswith(e["detail"]), (line, e)


def test_token_ls(served_plane: Served) -> None:
    with served_plane.plane.db.tx() as s:
        admin = tokens.create_user(s, "root", "admin")
    r = httpx.post(served_plane.url + "/v1/tokens", json={"node": "gpu-01", "ttl": 86400},
                   headers={"Authorization": f"Bearer {admin}"}, timeout=30)
    assert r.status_code == 201, r.text
    rows = api(served_plane, "/v1/tokens", admin)
    env = {"TIDAL_TOKEN": admin}
    assert json.loads(served_plane.cli("token", "ls", "-o", "json", env=env).stdout) == rows
    assert list(rows[0]) == list(LISTINGS["token ls"].fields)
    lines = served_plane.cli("token", "ls", env=env).stdout.splitlines()
    assert lines[0] == "ID               KIND     NODE          STATE   CREATED  EXPIRES     USED"
    assert re.fullmatch(rf"{r.json()['id']}  join     gpu-01        active  {AGO} +in 23h 59m  -", lines[1]), lines
    assert re.fullmatch(rf"cluster          cluster  \(every node\)  active  {AGO} +-           -", lines[2]), lines


def test_a_bad_format_is_refused(served_plane: Served) -> None:
    p = served_plane.cli("ls", "-o", "xml", check=False)
    assert p.returncode == 2
    assert "Invalid value for '-o' / '--output'" in p.stderr
    assert "'xml' is not one of 'table', 'wide', 'json', 'yaml'." in p.stderr


def _on_a_terminal(s: Served, *args: str, env: dict[str, str] | None = None) -> str:
    """The command's output with a terminal (a pseudo-terminal 200 columns wide) as its stdout."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "tidal.cli.main", *args], stdout=follower, stderr=follower,
                            env={**s.env, "TERM": "xterm-256color", "COLUMNS": "200", **(env or {})})
    os.close(follower)
    out = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal closed with the command
            break
        if not chunk:
            break
        out += chunk
    os.close(leader)
    assert proc.wait(30) == 0, out
    return out.decode()


def test_colour_on_a_terminal_only(served_plane: Served, job: str) -> None:
    green = "\x1b[32m"
    coloured = _on_a_terminal(served_plane, "ls")
    assert green + "running" in coloured
    plain = _on_a_terminal(served_plane, "ls", env={"NO_COLOR": "1"})
    assert "running" in plain and not re.search(r"\x1b\[(3\d|9\d|38;)", plain)
    assert "\x1b" not in served_plane.cli("ls").stdout  # piped


def test_nodes_with_gpu_devices(served_plane: Served) -> None:
    """A GPU node (as a scripted agent registers one: no GPU here) beside a CPU node: the nodes' table is as
    before, and a second table lists each GPU device with its model, memory and jobs."""
    p = served_plane.plane
    gpus = [{"index": i, "uuid": f"GPU-{i}aaaaaaa-0000-0000-0000-000000000000", "model": "NVIDIA H100 80GB HBM3",
             "memory_bytes": 85520809984} for i in range(2)]
    a = FakeAgent(p, "gpu-1", "A", devices=2, gpus=gpus)
    assert a.register() == 200
    jid = p.submit(name="train", ranks=1)
    p.rec.once()
    (act,) = a.actions()
    assert a.result(act, ranks=[{"rank": 0, "pid": 11}])
    assert FakeAgent(p, "cpu-1", "B", devices=1).register() == 200

    nodes = api(served_plane, "/v1/nodes")
    assert json.loads(served_plane.cli("nodes", "-o", "json").stdout)[0]["gpus"] == nodes[0]["gpus"] is None
    gpu_node = nodes[1]
    assert list(gpu_node["gpus"][0]) == list(LISTINGS["nodes: gpus"].fields)
    assert gpu_node["gpus"][0]["jobs"] == [jid] and gpu_node["gpus"][1]["jobs"] == []
    table = served_plane.cli("nodes").stdout.splitlines()
    assert table[0] == "NODE   ADDRESS  REGION/CLUSTER  DEVICES  FREE  UP   LEASE LEFT  DRAINED"
    assert table[1].startswith("cpu-1  -        local/local     1        1     yes  ")
    assert table[2].startswith("gpu-1  -        local/local     2        1     yes  ")
    assert table[3:] == [
        "",
        "GPU devices",
        "NODE   DEVICE  MODEL                  MEMORY    JOBS",
        f"gpu-1  0       NVIDIA H100 80GB HBM3  79.6 GiB  {jid}",
        "gpu-1  1       NVIDIA H100 80GB HBM3  79.6 GiB  -",
    ]
    wide = served_plane.cli("nodes", "-o", "wide").stdout.splitlines()
    assert wide[5] == "NODE   DEVICE  GPU  MODEL                  MEMORY    JOBS" + " " * (len(jid) - 4) + "  UUID"
    assert wide[6] == (f"gpu-1  0       0    NVIDIA H100 80GB HBM3  79.6 GiB  {jid}  "
                       "GPU-0aaaaaaa-0000-0000-0000-000000000000")


def test_nodes_wide_lists_the_links_measured_between_regions(served_plane: Served) -> None:
    """Under the nodes, with -o wide only: each link between regions whose rate copies have measured (GB/s, the
    median of the last copies); -o json stays the nodes' list (the links are GET /v1/links's)."""
    p = served_plane.plane
    assert FakeAgent(p, "w1", "W", region="west", cluster="west-a").register() == 200
    assert FakeAgent(p, "e1", "E", region="east", cluster="east-a").register() == 200
    assert served_plane.cli("nodes", "-o", "wide").stdout.splitlines()[3:] == []  # nothing measured yet
    with p.db.tx() as s:
        linkrates.note(s, "west", "east", 2_000_000_000, 4.0)
        linkrates.note(s, "west", "east", 1_000_000_000, 0.5)
        linkrates.note(s, "east", "west", 300_000_000, 1.5)
    links = api(served_plane, "/v1/links")
    assert [list(x) for x in links] == [list(LISTINGS["nodes: links"].fields)] * 2
    assert [(x["from"], x["to"], x["gbps"], x["copies"], x["samples"]) for x in links] == [
        ("east", "west", 0.2, 1, 1), ("west", "east", 1.25, 2, 2)]
    wide = served_plane.cli("nodes", "-o", "wide").stdout.splitlines()
    assert wide[3:6] == ["", "Links between regions (measured)", "FROM  TO    GB/S  COPIES  MEASURED"]
    assert re.fullmatch(rf"east  west  0\.2   1       {AGO}", wide[6]), wide[6]
    assert re.fullmatch(rf"west  east  1\.25  2       {AGO}", wide[7]), wide[7]
    assert len(served_plane.cli("nodes").stdout.splitlines()) == 3
    assert [n["name"] for n in json.loads(served_plane.cli("nodes", "-o", "json").stdout)] == ["e1", "w1"]
