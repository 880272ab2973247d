"""A real local cluster per test: control plane and agent processes started by `tidal up`'s code, with
real CRIU; the CLI runs as a subprocess, exactly as a user runs it. And test hosts: network namespaces on a
private bridge (`test_net`), for what runs across machines."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.system.cluster import LiveCluster
from tidal.config import Settings
from tidal.control.clusterfile import load
from tidal.control.localcluster import down, up
from tidal.mechanisms.criu.provision import find_criu
from tidal.testing.hostcluster import tail
from tidal.testing.hosts import TestNet
from tidal.testing.hostsweep import sweep


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[pytest.TestReport]:
    """Remember each phase's outcome on the test item: a fixture's teardown shows more when the test failed."""
    report: pytest.TestReport = yield
    setattr(item, f"outcome_{report.when}", report)
    return report


def _failed(request: pytest.FixtureRequest) -> bool:
    return any(getattr(getattr(request.node, f"outcome_{w}", None), "failed", False) for w in ("setup", "call"))


#: The newest jobs whose events a failed test's report shows (a test may have submitted thousands).
DESCRIBED = 20


def _describe(c: LiveCluster) -> None:
    """Print what a failed test's cluster held: its newest jobs with their events, and the tail of each log
    (pytest shows it under "Captured stdout teardown")."""
    try:
        with c.api("admin") as api:
            jobs = api.get("/v1/jobs", params={"all": True, "limit": DESCRIBED}).json()
        for j in jobs:
            print(f"--- job {j['id']}: {j['state']}")
            print(c.cli("events", "--job", j["id"], check=False, timeout=30).stdout)
    except Exception as exc:  # the control plane may be what failed
        print(f"--- jobs: not readable ({exc})")
    for log in sorted((c.home / "logs").glob("*.log")):
        print(f"--- {log.name} (its end)")
        print(tail(log))


@pytest.fixture
def make_cluster(request: pytest.FixtureRequest,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., LiveCluster]]:
    find_criu()  # no skip: `make test` provisions CRIU
    made: list[LiveCluster] = []

    def make(nodes: int = 2, devices: int = 1, lease: float = 3.0, database_url: str | None = None,
             home: Path | None = None, policy: str | None = None, quotas: str | None = None,
             checkpoint_store: str | None = None, regions: tuple[str, ...] = (),
             stores: tuple[str, ...] = ()) -> LiveCluster:
        home = home or tmp_path_factory.mktemp("tidal-home")
        env = {**os.environ, "TIDAL_HOME": str(home)}
        env.pop("TIDAL_URL", None)
        env.pop("TIDAL_TOKEN", None)
        if database_url:
            env["TIDAL_DATABASE_URL"] = database_url
        if checkpoint_store:
            env["TIDAL_CHECKPOINT_STORE"] = checkpoint_store
        settings = Settings(home=home, database_url=database_url, quotas=quotas,
                            **({"checkpoint_store": checkpoint_store} if checkpoint_store else {}))
        st, _ = up(settings, nodes=nodes, devices_per_node=devices, lease_s=lease, regions=regions, stores=stores,
                   **({"policy": policy} if policy else {}))
        c = LiveCluster(home, env, st, settings)
        made.append(c)
        return c

    yield make
    if _failed(request):
        for c in made:
            _describe(c)
    for c in made:
        down(c.settings)
        latest = load(c.home)
        assert latest is None


@pytest.fixture
def test_net(request: pytest.FixtureRequest) -> Iterator[TestNet]:
    """Test hosts h0, h1, h2 (tidal.testing.hosts), removed with everything on them after the test. Other
    hosts: ``@pytest.mark.parametrize("test_net", [5], indirect=True)`` for h0..h4, or a list of names
    (``[["cp", "db", "n1"]]``). Leftovers of killed runs are swept first."""
    sweep()
    param = getattr(request, "param", 3)
    with TestNet(names=param) if isinstance(param, list) else TestNet(n_hosts=param) as net:
        yield net


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    d = tmp_path / "work"
    d.mkdir()
    return d


@pytest.fixture
def gate(tmp_path: Path) -> Path:
    return tmp_path / "gate"
