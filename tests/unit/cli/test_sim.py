"""``tidal sim`` through typer's test runner, on a tiny trace."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from tidal.cli import sim

TRACE = "submit_time,duration,num_gpus,tier,project\n0,100,1,premium,a\n0,200,2,basic,b\n10,50,1,standard,a\n"


def app() -> typer.Typer:
    a = typer.Typer()
    sim.register(a)

    @a.callback()
    def _root() -> None:  # keep `sim` a subcommand
        pass

    return a


def test_sim_writes_the_json_of_the_issue(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text(TRACE)
    out = tmp_path / "r.json"
    r = CliRunner().invoke(app(), ["sim", "--trace", str(trace), "--cluster", "1x2", "--workers", "1",
                                   "--policies", "fifo,singularity", "--json", str(out), "--plots", str(tmp_path)])
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    for name in ("fifo", "singularity"):
        p = doc["policies"][name]
        for k in ("avg_jct_s", "p99_jct_s", "avg_queue_s", "goodput", "allocation", "lost_device_hours",
                  "preemptions", "migrations", "resizes"):
            assert k in p
        assert set(p["sla"]) == {"premium", "standard", "basic"}
        assert {"attainment", "met_fraction", "avg_queue_s"} <= set(p["sla"]["premium"])
    # FIFO: the premium job runs 0-100; the 2-device job waits for it (100-300) and blocks the last (300-350).
    assert doc["policies"]["fifo"]["avg_jct_s"] == (100 + 300 + 340) / 3
    assert (tmp_path / "jct_cdf.png").exists() and (tmp_path / "sla_attainment.png").exists()


def test_unknown_policy_and_bad_rows(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text(TRACE + "20,-5,1,basic,a\n")
    r = CliRunner().invoke(app(), ["sim", "--trace", str(trace), "--cluster", "1x2", "--policies", "fifo,nope"])
    assert r.exit_code != 0 and "nope" in str(r.exception) and "tiresias" in (r.exception.hint or "")  # type: ignore[union-attr]
    r = CliRunner().invoke(app(), ["sim", "--trace", str(trace), "--cluster", "1x2", "--policies", "fifo",
                                   "--on-bad-row", "fail"])
    assert r.exit_code != 0 and "line 5" in str(r.exception)
    r = CliRunner().invoke(app(), ["sim", "--trace", str(trace), "--cluster", "1x2", "--policies", "fifo",
                                   "--workers", "1"])
    assert r.exit_code == 0 and "line 5" in r.output


def test_a_job_larger_than_the_cluster_is_reported(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text(TRACE + "20,10,64,basic,a\n")
    r = CliRunner().invoke(app(), ["sim", "--trace", str(trace), "--cluster", "1x2", "--policies", "fifo",
                                   "--workers", "1"])
    assert r.exit_code == 0 and "1 jobs larger than their cluster" in r.output


def test_event_log_uses_the_shared_record_format(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text(TRACE)
    r = CliRunner().invoke(app(), ["sim", "--trace", str(trace), "--cluster", "1x2", "--policies", "singularity",
                                   "--workers", "1", "--event-log", str(tmp_path / "log")])
    assert r.exit_code == 0, r.output
    recs = [json.loads(x) for x in (tmp_path / "log" / "singularity.jsonl").read_text().splitlines()]
    events = [x for x in recs if x["type"] == "event"]
    actions = [x for x in recs if x["type"] == "action"]
    assert [e["kind"] for e in events].count("job_submitted") == 3 and events[0]["id"] == "e1"
    assert all(a["cause"] in {e["id"] for e in events} for a in actions)  # every action names its cause


def test_sim_report_is_one_html_file_with_tables_and_embedded_plots(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text(TRACE)
    out = tmp_path / "report.html"
    r = CliRunner().invoke(app(), ["sim", "--trace", str(trace), "--cluster", "1x2", "--workers", "1",
                                   "--policies", "fifo,singularity", "--report", str(out)])
    assert r.exit_code == 0, r.output
    assert f"wrote {out}" in r.output
    text = out.read_text()
    assert text.startswith("<!doctype html>") and "<title>Tidal simulation report</title>" in text
    assert [line.split("'")[0] for line in text.split("data-plot='")[1:]] == [
        "jct_cdf.png", "goodput_allocation.png", "sla_attainment.png"]
    assert text.count("src='data:image/png;base64,iVBORw0KGgo") == 3  # PNGs, inline: nothing beside the file
    assert "<tr><td>fifo</td>" in text and "<tr><td>singularity</td>" in text
    assert "http://" not in text and "https://" not in text  # it loads nothing: it opens offline
    assert sorted(tmp_path.iterdir()) == sorted([trace, out])


def test_gpu_memory_and_the_copy_rate_reach_the_cost_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--gpu-mem-gb``, ``--d2h-gbps`` and ``--h2d-gbps`` make the cost model the runs use, and are written with
    the input."""
    from tidal.sim import experiment
    from tidal.sim.cost import CostModel

    used: list[CostModel | None] = []
    real = experiment.run_policies

    def run_policies(p: Any, names: Any, *, cost: CostModel | None = None, **kw: Any) -> Any:
        used.append(cost)
        return real(p, names, cost=cost, **kw)

    monkeypatch.setattr(experiment, "run_policies", run_policies)
    trace = tmp_path / "t.csv"
    trace.write_text(TRACE)
    out = tmp_path / "r.json"
    r = CliRunner().invoke(app(), ["sim", "--trace", str(trace), "--cluster", "1x2", "--workers", "1", "--policies",
                                   "fifo", "--json", str(out), "--gpu-mem-gb", "16", "--d2h-gbps", "12.5",
                                   "--h2d-gbps", "25"])
    assert r.exit_code == 0, r.output
    (cost,) = used
    assert cost is not None and (cost.gpu_mem_per_rank_gb, cost.d2h_gbps, cost.h2d_gbps) == (16.0, 12.5, 25.0)
    doc = json.loads(out.read_text())
    assert (doc["input"]["gpu_mem_gb"], doc["input"]["d2h_gbps"], doc["input"]["h2d_gbps"]) == (16.0, 12.5, 25.0)
    r = CliRunner().invoke(app(), ["sim", "--trace", str(trace), "--cluster", "1x2", "--policies", "fifo",
                                   "--d2h-gbps", "0"])
    assert r.exit_code != 0 and str(r.exception) == "--d2h-gbps must be above 0, not 0.0 (a copy rate in GB/s, e.g. " \
                                                    "--d2h-gbps 20)"
    r = CliRunner().invoke(app(), ["sim", "--trace", str(trace), "--cluster", "1x2", "--policies", "fifo",
                                   "--h2d-gbps", "-1"])
    assert r.exit_code != 0 and str(r.exception) == "--h2d-gbps must be above 0, not -1.0 (a copy rate in GB/s, e.g. " \
                                                    "--h2d-gbps 20)"
