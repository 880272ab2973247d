"""`make demo` runs `tidal demo`: the story must complete and find the outputs identical."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from tidal.testing import wait_until


@pytest.mark.slow
def test_demo_story_end_to_end(tmp_path: Path) -> None:
    """The story, then its cluster left up (--keep-for) with its dashboard reachable at the address it printed;
    interrupted there, the demo still removes everything."""
    tidal = Path(sys.executable).with_name("tidal")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDAL_")}
    env.update(TIDAL_HOME=str(tmp_path / "home"), COLUMNS="300")
    # ^C must reach it even where this test runs with SIGINT ignored (a background job inherits that).
    proc = subprocess.Popen([str(tidal), "demo", "--keep-for", "300"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)  # type: ignore[union-attr]
    reader.start()
    try:
        wait_until(lambda: any("The cluster stays up for 300 s" in ln for ln in lines) or proc.poll() is not None,
                   timeout=300, what="the demo's story to end")
        text = "".join(lines)
        assert proc.poll() is None, text
        for line in ("Premium job", "preempts the basic job", "resumes where there is room",
                     "we migrate the basic job", "Basic job succeeded"):
            assert line in text, text
        assert "Per-step output vs the uninterrupted run: identical" in text
        assert "final parameters: identical" in text
        found = re.search(r"Dashboard: (http://127\.0\.0\.1:\d+)/ui \(log in with the token in (\S+)\)", text)
        assert found, text
        url, token = found.group(1), Path(found.group(2)).read_text().strip()
        page = httpx.get(f"{url}/ui", timeout=10)
        assert page.status_code == 200 and "<title>Tidal</title>" in page.text
        cluster = httpx.get(f"{url}/v1/ui/cluster", headers={"Authorization": f"Bearer {token}"}, timeout=10).json()
        assert [n["name"] for n in cluster["nodes"]] == ["node-1", "node-2"]
    finally:
        proc.send_signal(signal.SIGINT)  # as ^C: the demo stops its cluster and removes its state
        proc.wait(timeout=120)
        reader.join(timeout=10)
    # The demo cleans up after itself: no cluster processes, no state left behind.
    assert not any((tmp_path / "home").glob("demo-cluster-*")), "".join(lines)


@pytest.mark.slow
def test_distributed_demo_story(tmp_path: Path) -> None:
    tidal = Path(sys.executable).with_name("tidal")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDAL_")}
    env.update(TIDAL_HOME=str(tmp_path / "home"), COLUMNS="120")
    out = subprocess.run([str(tidal), "demo", "--distributed"], env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    text = " ".join(out.stdout.split())  # the story wraps at the terminal width
    for line in ("runs on two nodes", "Resized to 2 devices", "Rank 3 alone moved to node-2",
                 "Grown back to 4 devices", "Job succeeded"):
        assert line in text, text
    assert "Every rank's per-step output vs plain torchrun: identical; final parameters: identical" in text
    assert not any((tmp_path / "home").glob("demo-ddp-*"))


@pytest.mark.slow
@pytest.mark.criu
def test_hosts_demo_story(tmp_path: Path) -> None:
    """`tidal demo --hosts`: the story on 3 test hosts, the control plane on PostgreSQL, checkpoints in S3."""
    tidal = Path(sys.executable).with_name("tidal")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDAL_")}
    env.update(TIDAL_HOME=str(tmp_path / "home"), COLUMNS="250")
    out = subprocess.run([str(tidal), "demo", "--hosts"], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    text = " ".join(out.stdout.split())
    assert re.search(r"agents joined on node1 \(198\.18\.\d+\.13\), node2 \(198\.18\.\d+\.14\), node3 "
                     r"\(198\.18\.\d+\.15\)", text), text
    assert re.search(r"preempts the basic job: checkpoint \S+ \(\d+ MiB to s3://tidal/checkpoints", text), text
    moved = re.search(r"we migrate the basic job from (node\d) \(\S+\) to (node\d) \(\S+\) \d+\.\d+s \d+\. Basic job "
                      r"runs on (node\d)", text)
    assert moved and moved.group(1) != moved.group(2) == moved.group(3), text
    assert "Basic job succeeded" in text
    assert "Per-step output vs the uninterrupted run: identical" in text and "final parameters: identical" in text
    # Nothing is left: no hosts (namespaces), no state.
    assert not any((tmp_path / "home").glob("demo-hosts-*"))
    assert "demo-" not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
