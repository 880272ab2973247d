"""Starting a daemon of the throw-away Slurm cluster: a port taken before the daemon bound it is retried on a
fresh one; any other failure ends with the daemon's own log."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tidal.errors import TidalError
from tidal.testing.slurm import PORT_TRIES, SlurmCluster

IN_USE = "error: Error binding slurm stream socket: Address already in use"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[SlurmCluster]:
    c = SlurmCluster.__new__(SlurmCluster)  # no daemons of its own: only the start of one is tried here
    c.root = tmp_path
    (tmp_path / "log").mkdir()
    c.procs = []
    yield c
    for p in c.procs:
        p.kill()
        p.wait()


def daemon(tmp_path: Path, failures: int, why: str = IN_USE) -> list[str]:
    """A daemon that fails ``failures`` times with ``why`` (and exit code 1), then comes up."""
    script = tmp_path / "daemon.sh"
    script.write_text(f"""n=$(cat {tmp_path}/starts 2>/dev/null || echo 0); echo $((n + 1)) > {tmp_path}/starts
if [ "$n" -lt {failures} ]; then echo "{why}"; exit 1; fi
touch {tmp_path}/up; exec sleep 60
""")
    return ["sh", str(script)]


def start(cluster: SlurmCluster, argv: list[str], ports: list[int], timeout: float = 10) -> None:
    cluster._start_daemon(argv, "fake", lambda: (cluster.root / "up").exists(), timeout=timeout,
                          new_port=lambda: ports.append(len(ports)))


def test_a_daemon_whose_port_was_taken_starts_again_on_a_new_one(cluster: SlurmCluster, tmp_path: Path) -> None:
    ports: list[int] = []
    start(cluster, daemon(tmp_path, failures=1), ports)
    assert ports == [0]
    assert len(cluster.procs) == 1 and cluster.procs[0].poll() is None  # the exited start is not kept


def test_a_port_taken_at_every_try_fails_with_the_log(cluster: SlurmCluster, tmp_path: Path) -> None:
    ports: list[int] = []
    with pytest.raises(TidalError) as e:
        start(cluster, daemon(tmp_path, failures=PORT_TRIES), ports)
    assert str(e.value) == f"fake exited with code 1 while starting; the end of its log:\n{IN_USE}\n"
    assert len(ports) == PORT_TRIES - 1


def test_another_exit_is_not_retried_and_shows_this_starts_log(cluster: SlurmCluster, tmp_path: Path) -> None:
    (tmp_path / "log" / "fake.out").write_text(f"{IN_USE}\n")  # an earlier start's lines are not this one's
    ports: list[int] = []
    with pytest.raises(TidalError) as e:
        start(cluster, daemon(tmp_path, failures=1, why="fatal: Unable to read slurmdbd.conf"), ports)
    assert str(e.value) == ("fake exited with code 1 while starting; the end of its log:\n"
                            "fatal: Unable to read slurmdbd.conf\n")
    assert ports == []


def test_a_daemon_that_never_answers_fails_with_its_log(cluster: SlurmCluster, tmp_path: Path) -> None:
    script = tmp_path / "silent.sh"
    script.write_text("echo listening on nothing; exec sleep 60\n")
    with pytest.raises(TidalError) as e:
        start(cluster, ["sh", str(script)], [], timeout=0.5)
    assert str(e.value).startswith("timed out after ")
    assert "waiting for fake to answer" in str(e.value)
    assert str(e.value).endswith("; the end of its log:\nlistening on nothing\n")
