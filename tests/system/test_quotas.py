"""Admission against per-project quotas in the live control plane (``TIDAL_QUOTAS``): a guaranteed job
over its project's quota is admitted as basic, and the user is told why."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.criu


def test_a_job_over_its_projects_quota_is_admitted_as_basic(make_cluster, workdir: Path) -> None:
    c = make_cluster(nodes=2, devices=1, quotas="vision=0.5")  # vision: 1 of the 2 devices guaranteed
    with c.api() as api:
        me = api.get("/v1/whoami").json()["name"]
    for project in ("vision", "speech"):  # the admin's (`tidal up` made both tokens): the user may submit there
        c.cli("project", "add", project, "--member", me)
    first = c.cli("submit", "-q", "--tier", "standard", "--project", "vision", "--", "sleep", "600",
                  cwd=workdir).stdout.strip()
    p = c.cli("submit", "--tier", "premium", "--project", "vision", "--", "echo", "done", cwd=workdir)
    assert ("admitted as basic: project 'vision' has 1 of its 1 guaranteed devices admitted; 1 more would "
            "exceed its quota") in " ".join(p.stdout.split())
    second = p.stdout.split()[2]
    assert c.show(second)["tier"] == "basic" and c.show(first)["tier"] == "standard"
    assert c.cli("wait", second, check=False).returncode == 0  # it runs on the other device
    assert c.cli("logs", second).stdout == "done\n"
    # another project has no quota: not limited
    other = c.cli("submit", "-q", "--tier", "premium", "--project", "speech", "--", "true", cwd=workdir)
    assert c.show(other.stdout.strip())["tier"] == "premium"
    c.cli("cancel", first)
