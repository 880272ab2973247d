"""The drain rule's defaults are the settings' (TIDAL_DRAIN_*), and its spans read as `tidal nodes` shows them."""

from __future__ import annotations

import pytest

from tidal.config import Settings
from tidal.control.drains import DrainRule, span


def test_the_rules_defaults_are_the_settings() -> None:
    s = Settings()
    assert DrainRule(s.drain_lease_losses, s.drain_window, s.drain_healthy_for) == DrainRule()


def test_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIDAL_DRAIN_LEASE_LOSSES", "5")
    monkeypatch.setenv("TIDAL_DRAIN_WINDOW", "120")
    monkeypatch.setenv("TIDAL_DRAIN_HEALTHY_FOR", "30")
    s = Settings()
    assert (s.drain_lease_losses, s.drain_window, s.drain_healthy_for) == (5, 120.0, 30.0)


@pytest.mark.parametrize("seconds, text", [(600.0, "10 min"), (3600.0, "1 h"), (5400.0, "90 min"), (45.0, "45 s"),
                                           (90.5, "90.5 s"), (7200.0, "2 h")])
def test_span(seconds: float, text: str) -> None:
    assert span(seconds) == text
