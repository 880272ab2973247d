"""Unit tests of `tidal doctor`: the check functions with injected inputs, exit code and --json shape."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from tests.unit.mechanisms.criu import mountinfo as mi
from tidal.cli import doctor
from tidal.control import checks as control
from tidal.mechanisms import checks as machine
from tidal.mechanisms.checks import Check
from tidal.mechanisms.criu.cgroups import detect, v1_bound
from tidal.mechanisms.criu.features import parse_feature_output


def test_parse_version() -> None:
    assert machine.parse_version("6.18.44-fc-v657") == (6, 18, 44)
    assert machine.parse_version("5.4.0-150-generic") == (5, 4, 0)
    assert machine.parse_version("v4.19") == (4, 19)
    assert machine.parse_version("weird") is None


@pytest.mark.parametrize(("release", "status"), [("6.18.44-fc-v657", "ok"), ("5.0.0", "ok"),
                                                 ("4.19.0-26-amd64", "missing"), ("garbage", "missing")])
def test_kernel(release: str, status: str) -> None:
    c = machine.check_kernel(release, "Linux")
    assert c.required and c.status == status
    assert release in c.detail
    assert bool(c.fix) == (status != "ok")


def test_kernel_not_linux() -> None:
    c = machine.check_kernel("23.1.0", "Darwin")
    assert c.failed and "Linux" in c.fix


def test_root() -> None:
    assert machine.check_root(0).status == "ok"
    c = machine.check_root(1000)
    assert c.failed and "root" in c.fix


def _cgroup_rows(mountinfo: str, features: frozenset[str] = frozenset({"cgroup.freeze", "cgroup.kill"}),
                 controllers: frozenset[str] = frozenset({"cpu", "cpuset", "memory"}),
                 filesystems: str = mi.FILESYSTEMS) -> dict[str, Check]:
    rows = machine.check_cgroups(detect(mountinfo, filesystems), features=lambda _: features,
                                 controllers=lambda _: controllers, bound=frozenset)
    assert [r.name for r in rows] == ["cgroups", "cgroup freezer", "cgroup cpu", "cgroup cpuset"]
    return {r.name: r for r in rows}


def test_cgroups_v1_host() -> None:
    rows = _cgroup_rows(mi.HYBRID)
    assert rows["cgroups"].status == "ok" and rows["cgroups"].detail.startswith("v1 (hybrid)")
    assert "/sys/fs/cgroup/unified is not used" in rows["cgroups"].detail
    assert rows["cgroup freezer"].status == "ok" and rows["cgroup freezer"].detail == "v1 at /sys/fs/cgroup/freezer"
    assert rows["cgroup cpu"].detail == "v1 at /sys/fs/cgroup/cpu"
    legacy = _cgroup_rows(mi.V1_ONLY)
    assert legacy["cgroups"].detail == "v1 (v1)" and legacy["cgroup cpu"].detail == "v1 at /sys/fs/cgroup/cpu,cpuacct"


def test_cgroups_v1_without_cpuset() -> None:
    text = "\n".join(line for line in mi.V1_ONLY.splitlines() if "cpuset" not in line)
    cpuset = _cgroup_rows(text)["cgroup cpuset"]
    assert cpuset.status == "warn" and not cpuset.failed and "mount -t cgroup -o cpuset" in cpuset.fix


def test_cgroups_v2_only_host_passes() -> None:
    """A v2-only host needs nothing mounted by hand: the freezer is cgroup2's own."""
    rows = _cgroup_rows(mi.V2_ONLY)
    assert not any(r.failed for r in rows.values())
    assert rows["cgroups"].detail == "v2 at /sys/fs/cgroup (v2)"
    assert rows["cgroup freezer"].status == "ok"
    assert rows["cgroup freezer"].detail == "v2 cgroup.freeze at /sys/fs/cgroup; cgroup.kill"
    assert rows["cgroup cpu"].status == "ok" and "cpu.max" in rows["cgroup cpu"].detail
    assert rows["cgroup cpuset"].status == "ok" and "cpuset.cpus" in rows["cgroup cpuset"].detail
    old = _cgroup_rows(mi.V2_ONLY, features=frozenset({"cgroup.freeze"}))["cgroup freezer"]
    assert old.status == "ok" and "killed by pid" in old.detail


def test_cgroups_v2_without_a_freezer_or_controllers() -> None:
    rows = _cgroup_rows(mi.HYBRID_NO_V1_FREEZER, features=frozenset(), controllers=frozenset())
    assert rows["cgroups"].status == "ok" and rows["cgroups"].detail.startswith("v2 at /sys/fs/cgroup/unified")
    assert "v1 holds cpu, cpuacct" in rows["cgroups"].detail
    freezer = rows["cgroup freezer"]
    assert freezer.failed and "5.2" in freezer.fix
    cpu = rows["cgroup cpu"]
    assert cpu.status == "warn" and not cpu.failed and "bound to a cgroup v1 hierarchy" in cpu.detail


def test_cgroups_v2_not_root() -> None:
    def denied(_: Path) -> frozenset[str]:
        raise PermissionError(13, "Permission denied")

    rows = machine.check_cgroups(detect(mi.V2_ONLY, mi.FILESYSTEMS), features=denied,
                                 controllers=lambda _: frozenset(), bound=frozenset)
    freezer = next(r for r in rows if r.name == "cgroup freezer")
    assert freezer.failed and "root" in freezer.fix


def test_cgroups_v2_view_of_a_hybrid_machine() -> None:
    """cgroup2 alone in this mount namespace, while the machine's v1 hierarchies still hold cpu and cpuset
    (what /proc/cgroups says): the rows say why there is no quota."""
    rows = machine.check_cgroups(detect(mi.V2_ONLY, mi.FILESYSTEMS), features=lambda _: frozenset({"cgroup.freeze"}),
                                 controllers=lambda _: frozenset({"hugetlb"}),
                                 bound=lambda: v1_bound(PROC_CGROUPS))
    cpu = next(r for r in rows if r.name == "cgroup cpu")
    assert cpu.status == "warn" and "bound to a cgroup v1 hierarchy" in cpu.detail


PROC_CGROUPS = """\
#subsys_name\thierarchy\tnum_cgroups\tenabled
cpuset\t3\t1\t1
cpu\t1\t472\t1
freezer\t6\t1485\t1
hugetlb\t0\t2\t1
"""


def test_v1_bound_controllers() -> None:
    assert v1_bound(PROC_CGROUPS) == {"cpuset", "cpu", "freezer"}
    assert v1_bound("#subsys_name\thierarchy\tnum_cgroups\tenabled\ncpu\t0\t1\t1\n") == frozenset()


def test_cgroups_none_mounted() -> None:
    rows = _cgroup_rows(mi.NONE)
    assert rows["cgroups"].failed and rows["cgroups"].fix == "mount -t cgroup2 none /sys/fs/cgroup"
    assert rows["cgroup freezer"].failed
    assert rows["cgroup cpu"].status == "warn"
    old = _cgroup_rows(mi.NONE, filesystems=mi.FILESYSTEMS_NO_V2)["cgroups"]
    assert "mount -t cgroup -o freezer" in old.fix


def test_python() -> None:
    assert machine.check_python((3, 11, 7)).status == "ok"
    assert machine.check_python((3, 10, 2)).failed


def test_torch_not_imported_and_optional() -> None:
    missing = machine.check_torch(find_spec=lambda _: None)
    assert missing.status == "warn" and not missing.required and "pip install" in missing.fix
    present = machine.check_torch(find_spec=lambda _: object(), version=lambda _: "2.13.0+cpu")
    assert present.status == "ok" and present.detail == "2.13.0+cpu"


def test_postgres() -> None:
    assert control.check_postgres("", found="/usr/lib/postgresql/16/bin").status == "ok"
    optional = control.check_postgres("", found=None)
    assert optional.status == "warn" and not optional.required
    needed = control.check_postgres("postgresql+psycopg://x@y/z", found=None)
    assert needed.failed and "install PostgreSQL" in needed.fix


def test_find_postgres_under_usr_lib(tmp_path: Path) -> None:
    base = tmp_path
    d = base / "16" / "bin"
    d.mkdir(parents=True)
    (d / "postgres").touch()
    (d / "initdb").touch()
    assert control.find_postgres(lambda _: None, str(base / "*" / "bin")) == str(d)
    assert control.find_postgres(lambda n: f"/opt/pg/bin/{n}") == "/opt/pg/bin"
    assert control.find_postgres(lambda _: None, str(base / "nothing" / "*")) is None


def test_home(tmp_path: Path) -> None:
    home = tmp_path / "a" / "b"
    c = control.check_home(home)
    assert c.status == "ok" and str(home) in c.detail and "to be created" in c.detail


def test_staging(tmp_path: Path) -> None:
    gone = machine.check_staging(tmp_path / "none", euid=0)
    assert gone.status == "warn" and "staged on the node's disk" in gone.detail and gone.fix
    fresh = machine.check_staging(tmp_path, euid=0)
    assert fresh.status == "ok" and fresh.detail == (
        f"{tmp_path}/tidal: a tmpfs with large pages is mounted there at the first checkpoint")
    user = machine.check_staging(tmp_path, euid=1000)
    assert user.status == "warn" and "only by root" in user.detail and user.fix == "run Tidal as root"
    (tmp_path / "tidal" / "node-1-abc").mkdir(parents=True)
    busy = machine.check_staging(tmp_path, euid=0)
    assert busy.status == "warn" and "holds files" in busy.detail and "tidal down" in busy.fix


def test_feature_output_parsing() -> None:
    off = parse_feature_output(
        "mem_dirty_track", 1,
        "Warn  (criu/cr-check.c:824): Dirty tracking is OFF. Memory snapshot will not work.\n")
    assert not off.supported and off.message == "Dirty tracking is OFF. Memory snapshot will not work."
    on = parse_feature_output("pidfd_store", 0, "pidfd_store is supported\n")
    assert on.supported
    unknown = parse_feature_output("nope", 1, "Error (criu/cr-check.c:1866): Unknown feature nope\n")
    assert not unknown.supported and unknown.message == "Unknown feature nope"


def test_criu_rows_without_criu() -> None:
    assert machine.check_criu_check(None).failed
    feat = machine.check_criu_feature(None, ("mem_dirty_track",), "criu: mem_dirty_track", "x")
    assert feat.status == "warn" and not feat.required


def test_bad_tidal_criu_is_missing_with_a_fix(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TIDAL_CRIU", str(tmp_path / "no-such-criu"))
    row, criu = machine.locate_criu()
    assert criu is None and row.failed and "TIDAL_CRIU" in row.fix


def test_a_crashing_check_is_reported() -> None:
    def boom() -> Check:
        raise RuntimeError("kaput")

    (c,) = machine.safe(machine.Planned("thing", True, boom))
    assert c.failed and "kaput" in c.detail


def test_exit_code() -> None:
    ok = Check("a", "ok", "")
    warn = Check("b", "warn", "", "do x")
    assert doctor.exit_code([ok, warn]) == 0
    assert doctor.exit_code([ok, Check("c", "missing", "", "do y", required=False)]) == 0
    assert doctor.exit_code([ok, warn, Check("d", "missing", "", "do z", required=True)]) == 1


def _app() -> typer.Typer:
    app = typer.Typer()
    doctor.register(app)
    return app


@pytest.mark.parametrize("failing", [False, True])
def test_cli_json_and_exit_code(monkeypatch: pytest.MonkeyPatch, failing: bool) -> None:
    checks = [Check("kernel", "ok", "Linux 6.1", required=True),
              Check("torch", "warn", "absent", "pip install")]
    if failing:
        checks.append(Check("criu", "missing", "none", "make criu", required=True))
    monkeypatch.setattr(doctor, "run_checks", lambda: checks)
    result = CliRunner().invoke(_app(), ["doctor", "--json"])
    assert result.exit_code == (1 if failing else 0), result.output
    data = json.loads(result.output)
    assert data["ok"] is (not failing)
    assert data["checks"][0] == {"name": "kernel", "status": "ok", "detail": "Linux 6.1", "fix": "",
                                 "required": True}
    assert [c["name"] for c in data["checks"]] == [c.name for c in checks]


def test_cli_table(monkeypatch: pytest.MonkeyPatch) -> None:
    checks = [Check("criu", "missing", "nothing found", "make criu", required=True)]
    monkeypatch.setattr(doctor, "run_checks", lambda: checks)
    result = CliRunner().invoke(_app(), ["doctor"])
    assert result.exit_code == 1
    assert "MISSING" in result.output and "make criu" in result.output and "1 required" in result.output
