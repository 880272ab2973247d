"""The dashboard at /ui in a real browser (Debian's chromium driven by Playwright) against a real local cluster:
a wrong token is refused; the user logs in (an HttpOnly, SameSite=Strict cookie); a premium job makes the
scheduler preempt the user's basic job, which the job's page shows in its timeline, live, and then running on
the other node, without the page being reloaded; the user presses Migrate and sees the placement change;
another user sees neither the job nor who holds its device, an admin sees both; a node whose agent died shows
lost. And ``tidal sim --report`` writes a page that
opens offline with its plots.

With TIDAL_DASHBOARD_SHOTS=DIR the test also saves the screenshots docs/dashboard.md shows into DIR."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.system.browser import chromium

pytestmark = [pytest.mark.criu, pytest.mark.slow]

LOOP = "i=0; while true; do i=$((i+1)); echo step $i; sleep 0.1; done"
SHOTS = os.environ.get("TIDAL_DASHBOARD_SHOTS")


def shot(page: Any, name: str) -> None:
    """The page as docs/dashboard.md shows it: a PNG of at most 256 colours (small enough to commit)."""
    if SHOTS:
        from PIL import Image

        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        image = Image.open(io.BytesIO(page.screenshot(full_page=True))).convert("RGB")
        image.quantize(colors=256).save(Path(SHOTS) / f"dashboard-{name}.png", optimize=True)


def test_dashboard_shows_a_preemption_live_and_migrates(make_cluster, workdir: Path, gate: Path) -> None:
    from playwright.sync_api import expect

    expect.set_options(timeout=20_000)  # a loaded machine: what the page shows may take a few seconds
    c = make_cluster(nodes=2, devices=1)
    with c.api() as api:
        me = api.get("/v1/whoami").json()["name"]
    with c.api("admin") as admin:
        r = admin.post("/v1/users", json={"name": "bob", "role": "user"})
        assert r.status_code == 201, r.text
        bob = r.json()["token"]

    def submit(name: str, tier: str, command: str) -> str:
        return c.cli("submit", "--quiet", "--name", name, "--tier", tier, "--", "sh", "-c", command,
                     cwd=workdir).stdout.strip()

    job = submit("train", "basic", LOOP)
    first = c.wait_state(job, "running")["placement"][0]["node"]
    other = "node-2" if first == "node-1" else "node-1"
    # The other device is taken until the gate opens.
    blocker = submit("eval", "standard", f"while [ ! -e {gate} ]; do sleep 0.05; done")
    c.wait_state(blocker, "running")

    with chromium() as browser:
        ctx = browser.new_context(viewport={"width": 1280, "height": 860})
        page = ctx.new_page()
        errors: list[str] = []  # uncaught errors of the page's script
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(f"{c.url}/ui")
        expect(page.locator("#login")).to_be_visible()
        page.fill("#token", "not-a-token")
        page.click("#login-form button")
        expect(page.locator("#login-error")).to_have_text("Log-in refused: invalid API token: unknown, or revoked")
        assert ctx.cookies() == []
        expect(page.locator("#nav")).to_be_hidden()

        page.fill("#token", c.token("user"))
        page.click("#login-form button")
        expect(page.locator("#who")).to_have_text(f"{me} (user)")
        (cookie,) = ctx.cookies()
        assert (cookie["name"], cookie["httpOnly"], cookie["sameSite"]) == ("tidal_token", True, "Strict")
        expect(page.locator("#live")).to_have_class("live on")  # the event stream is open
        # The cluster: both devices held, each coloured by its job's tier.
        expect(page.locator(f'.node[data-node="{first}"] .dev[data-tier="basic"]')).to_have_attribute("data-job", job)
        expect(page.locator(f'.node[data-node="{other}"] .dev[data-tier="standard"]')).to_have_attribute(
            "data-job", blocker)
        page.evaluate("window.loadedOnce = true")  # gone if the page were ever reloaded

        page.evaluate(f"location.hash = '#/job/{job}'")
        timeline = page.locator("#timeline")
        expect(timeline.locator(f'li[data-kind="running"][data-node="{first}"]')).to_have_count(1)
        expect(page.locator("#placement td.node")).to_have_text([first])
        expect(page.locator("#act-preempt")).to_be_enabled()

        # A premium job arrives: no device is free, the scheduler preempts the basic job.
        premium = submit("urgent", "premium", LOOP)
        expect(timeline.locator('li[data-kind="preempted"]')).to_have_count(1, timeout=60_000)
        c.wait_state(premium, "running")
        gate.touch()  # the standard job ends: the basic job resumes where there is room, the other node
        resumed = timeline.locator(f'li[data-kind="running"][data-node="{other}"]')
        expect(resumed).to_have_count(1, timeout=60_000)
        expect(resumed.locator(".move")).to_have_text(f"{first} → {other}")
        expect(page.locator("#placement td.node")).to_have_text([other])
        kinds = page.locator("#timeline li").evaluate_all("els => els.map(e => e.dataset.kind)")
        assert kinds.index("running") < kinds.index("preempted") < len(kinds) - 1 - kinds[::-1].index("running")
        assert page.evaluate("window.loadedOnce") is True
        expect(page.locator("#log")).to_contain_text("step ")  # the live log tail
        c.wait_state(job, "running")

        # The user moves it back, with the page's button, once the premium job is gone.
        c.cli("cancel", premium)
        c.wait_state(premium, "cancelled")
        expect(page.locator("#act-migrate")).to_be_enabled()
        page.click("#act-migrate")
        expect(page.locator("#placement td.node")).to_have_text([first], timeout=60_000)
        expect(timeline.locator(f'li[data-kind="running"][data-node="{first}"]')).to_have_count(2)
        assert c.wait_state(job, "running")["placement"][0]["node"] == first
        assert page.evaluate("window.loadedOnce") is True
        expect(page.locator("#error")).to_have_text("")
        shot(page, "job")
        page.evaluate("location.hash = '#/cluster'")
        expect(page.locator(f'.node[data-node="{first}"] .dev[data-tier="basic"]')).to_have_count(1)
        expect(page.locator(f'.node[data-node="{other}"] .dev[data-tier="idle"]')).to_have_count(1)
        shot(page, "cluster")
        page.evaluate("location.hash = '#/jobs'")
        expect(page.locator(f'#jobs tr[data-job="{job}"] td').nth(2)).to_have_text("running")
        page.select_option("select[name=state]", "cancelled")
        expect(page.locator("#jobs tbody tr")).to_have_count(1)
        expect(page.locator("#jobs tbody tr")).to_have_attribute("data-job", premium)
        page.select_option("select[name=state]", "")
        expect(page.locator("#jobs tbody tr")).to_have_count(3)
        shot(page, "jobs")
        page.evaluate("location.hash = '#/sla'")
        expect(page.locator('#sla tr[data-tier="basic"] td').nth(3)).not_to_have_text("0")
        expect(page.locator("#preemptions")).to_contain_text("scheduler")
        shot(page, "sla")

        assert errors == []

        # Another user: none of these jobs in the table, the job's page is "no job", its device anonymous.
        ctx2 = browser.new_context(viewport={"width": 1280, "height": 860})
        page2 = ctx2.new_page()
        page2.on("pageerror", lambda exc: errors.append(str(exc)))
        page2.goto(f"{c.url}/ui")
        page2.fill("#token", bob)
        page2.click("#login-form button")
        expect(page2.locator("#who")).to_have_text("bob (user)")
        expect(page2.locator(f'.node[data-node="{first}"] .dev[data-tier="basic"]')).to_have_attribute("data-job", "")
        page2.evaluate("location.hash = '#/jobs'")
        expect(page2.locator(".table p")).to_have_text("0 of 0 jobs (yours)")
        page2.evaluate(f"location.hash = '#/job/{job}'")
        expect(page2.locator("#error")).to_have_text(f"no job {job}")
        # The cookie alone does not make a request that changes anything (CSRF): the header is needed.
        status = page2.evaluate(f"fetch('/v1/jobs/{job}/cancel', {{method: 'POST'}}).then(r => r.status)")
        assert status == 403
        page2.click("#logout")
        expect(page2.locator("#login")).to_be_visible()
        assert ctx2.cookies() == []
        # An admin sees every user's jobs, and who holds each device.
        page2.fill("#token", c.token("admin"))
        page2.click("#login-form button")
        expect(page2.locator("#who")).to_have_text("admin (admin)")
        page2.evaluate("location.hash = '#/jobs'")
        expect(page2.locator(".table p")).to_have_text("3 of 3 jobs (all users')")
        page2.evaluate("location.hash = '#/cluster'")
        expect(page2.locator(f'.node[data-node="{first}"] .dev[data-tier="basic"]')).to_have_attribute("data-job", job)
        # A node whose agent is gone is shown lost once its lease has run out, its devices hatched.
        os.kill(c.state.agents[other].pid, signal.SIGKILL)
        expect(page2.locator(f'.node.lost[data-node="{other}"] .dev.lost')).to_have_count(1)
        expect(page2.locator(".card", has_text="nodes lost").locator("b")).to_have_text("1")
        assert errors == []
    assert c.job(job)["state"] == "running"


def test_sim_report_opens_offline_with_its_plots(tmp_path: Path) -> None:
    report = tmp_path / "report.html"
    subprocess.run([sys.executable, "-m", "tidal.cli.main", "sim", "--trace", "sample:philly-week", "--cluster",
                    "4x4", "--limit", "60", "--policies", "fifo,singularity", "--workers", "1", "--report",
                    str(report)], check=True, capture_output=True, timeout=120)
    with chromium() as browser:
        ctx = browser.new_context(offline=True)
        page = ctx.new_page()
        page.goto(report.as_uri())
        assert page.title() == "Tidal simulation report"
        plots = page.locator("img[data-plot]")
        assert plots.evaluate_all("els => els.map(e => e.dataset.plot)") == [
            "jct_cdf.png", "goodput_allocation.png", "sla_attainment.png"]
        sizes = plots.evaluate_all("els => els.map(e => [e.complete, e.naturalWidth, e.naturalHeight])")
        assert all(done and w > 500 and h > 300 for done, w, h in sizes), sizes
        rows = page.locator("#policies tr td:first-child").all_text_contents()
        assert rows == ["fifo", "singularity"]
