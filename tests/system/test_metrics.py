"""A real Prometheus server (Debian's `prometheus`, provisioned by `make test`) scrapes a real local cluster's
control plane, with a token of role `metrics`, while a job is preempted, resumed and migrated by its user; PromQL
through Prometheus's HTTP API then finds exactly one preemption and one migration, the job running, and the
devices it holds."""

from __future__ import annotations

import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from tidal.testing import wait_until

pytestmark = pytest.mark.criu

LOOP = "i=0; while true; do i=$((i+1)); echo step $i; sleep 0.1; done"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Prometheus:
    """A Prometheus server on loopback scraping ``target`` (host:port) every second with a bearer token."""

    def __init__(self, root: Path, target: str, token: str) -> None:
        binary = shutil.which("prometheus")
        assert binary, "prometheus is missing: `make prometheus` installs Debian's package"  # no skip: make test has it
        root.mkdir()
        (root / "token").write_text(token)
        (root / "token").chmod(0o600)
        (root / "prometheus.yml").write_text(f"""
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: tidal
    scrape_interval: 1s
    scrape_timeout: 1s
    metrics_path: /metrics
    authorization:
      type: Bearer
      credentials_file: {root / "token"}
    static_configs:
      - targets: ["{target}"]
""")
        self.url = f"http://127.0.0.1:{free_port()}"
        self.log = (root / "prometheus.log").open("wb")
        self.proc = subprocess.Popen(
            [binary, f"--config.file={root / 'prometheus.yml'}", f"--storage.tsdb.path={root / 'data'}",
             f"--web.listen-address={urlsplit(self.url).netloc}", "--log.level=warn"],
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT, cwd=root)
        wait_until(lambda: self._ready(), timeout=60, what="Prometheus to be ready",
                   hint=f"see {root / 'prometheus.log'}")

    def _ready(self) -> bool:
        assert self.proc.poll() is None, f"prometheus exited with {self.proc.returncode}"
        return httpx.get(f"{self.url}/-/ready", timeout=5).status_code == 200

    def query(self, promql: str) -> float | None:
        """The value of an instant query that yields one series, or None when it yields none."""
        r = httpx.get(f"{self.url}/api/v1/query", params={"query": promql}, timeout=10)
        r.raise_for_status()
        body = r.json()
        assert body["status"] == "success", body
        result = body["data"]["result"]
        assert len(result) <= 1, result
        return float(result[0]["value"][1]) if result else None

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


@pytest.fixture
def prometheus_for(tmp_path: Path) -> Iterator[list[Prometheus]]:
    made: list[Prometheus] = []
    yield made
    for p in made:
        p.close()


def test_prometheus_counts_one_preemption_and_one_migration(make_cluster, workdir: Path, tmp_path: Path,
                                                            prometheus_for: list[Prometheus]) -> None:
    c = make_cluster(nodes=2, devices=1)
    with c.api("admin") as admin:
        r = admin.post("/v1/users", json={"name": "prometheus", "role": "metrics"})
        assert r.status_code == 201, r.text
        token = r.json()["token"]
    prom = Prometheus(tmp_path / "prometheus", urlsplit(c.url).netloc, token)
    prometheus_for.append(prom)
    wait_until(lambda: prom.query('up{job="tidal"}') == 1, timeout=30, what="Prometheus to scrape the control plane")

    job = c.cli("submit", "--quiet", "--name", "loop", "--", "sh", "-c", LOOP, cwd=workdir).stdout.strip()
    node1 = c.wait_state(job, "running")["placement"][0]["node"]
    c.cli("preempt", job)
    c.cli("resume", job)
    node2 = c.wait_state(job, "running")["placement"][0]["node"]
    c.cli("migrate", job)
    moved = c.wait_state(job, "running")["placement"][0]["node"]
    assert moved != node2 and node1 in ("node-1", "node-2")

    # A scrape taken once the job runs again: one taken while it was being restored counts the migration
    # already, with no job running.
    wait_until(lambda: prom.query("sum(tidal_migrations_total)") == 1
               and prom.query('sum(tidal_jobs{state="running"})') == 1, timeout=30,
               what="Prometheus to have scraped the migration and the job running again")
    assert prom.query("sum(tidal_preemptions_total)") == 1
    assert prom.query('tidal_preemptions_total{tier="basic",cause="user"}') == 1
    assert prom.query('tidal_migrations_total{tier="basic",cause="user"}') == 1
    assert prom.query("sum(tidal_restarts_total)") in (None, 0)
    assert prom.query('sum(tidal_jobs{state="running"})') == 1
    assert prom.query('sum(tidal_jobs{state="pending"})') == 0
    assert prom.query('tidal_jobs{state="running",tier="basic"}') == 1
    assert prom.query('tidal_devices_used{tier="basic"}') == 1
    assert prom.query("tidal_devices") == 2
    assert prom.query('sum(tidal_checkpoints_total{purpose="hold"})') == 1
    assert prom.query("sum(tidal_migration_seconds_count)") == 1
    # What the agent reports in its heartbeats, per node (the label `job` is Prometheus's own: ours is job_id).
    wait_until(lambda: prom.query(f'count(tidal_job_memory_rss_bytes{{job_id="{job}",node="{moved}"}} > 0)') == 1,
               timeout=30, what="the agent's figures of the job on its node")
    assert (prom.query('sum(tidal_http_request_duration_seconds_count{route="/v1/jobs/{job_id}/migrate"})') or 0) >= 1
    # And of each node: its staging usage, in memory and on disk.
    wait_until(lambda: prom.query("count(tidal_node_staging_bytes)") == 4, timeout=30,
               what="the agents' staging usage of both nodes")

    c.cli("cancel", job)
    wait_until(lambda: prom.query('sum(tidal_jobs_finished_total{state="cancelled"})') == 1, timeout=30,
               what="the cancellation to be scraped")
    assert prom.query('sum(tidal_jobs{state="running"})') == 0
    assert prom.query("sum(tidal_preemptions_total)") == 1 and prom.query("sum(tidal_migrations_total)") == 1
