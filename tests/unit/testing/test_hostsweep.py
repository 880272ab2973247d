"""The names a test net gives: unique per run, within Linux's limits, and naming the process that made them."""

from __future__ import annotations

import pytest

from tidal.errors import ValidationError
from tidal.testing.hosts import TestNet
from tidal.testing.hostsweep import bridge_name, netns_name, new_tag, port_name, run_dir, tag_owner, valid_name


def test_a_tag_names_its_owner_and_differs_between_runs() -> None:
    for pid in (1, 4242, 4_194_304):  # the largest pid Linux allows
        tag = new_tag(pid)
        assert len(tag) == 8 and tag.isalnum() and tag == tag.lower()
        assert tag_owner(tag) == pid
    assert len({new_tag(4242) for _ in range(50)}) > 40


def test_names_fit_linux_limits_and_carry_the_tag() -> None:
    tag = new_tag(4_194_304)
    assert len(bridge_name(tag)) <= 15 and tag in bridge_name(tag)
    assert all(len(port_name(tag, i)) <= 15 and tag in port_name(tag, i) for i in (0, 199))
    assert port_name(tag, 0) != port_name(tag, 1)
    assert netns_name("tidal", tag, "h0") == f"tidal-{tag}-h0"
    assert tag in run_dir(tag).name


@pytest.mark.parametrize("name", ["", "H0", "0h", "h-0", "averyveryverylongname"])
def test_bad_host_names_are_refused(name: str) -> None:
    assert not valid_name(name)
    with pytest.raises(ValidationError):
        TestNet(names=[name])


def test_a_net_has_hosts_with_different_names() -> None:
    assert valid_name("h0") and valid_name("cp")
    with pytest.raises(ValidationError):
        TestNet(names=["a", "a"])
    with pytest.raises(ValidationError):
        TestNet(n_hosts=0)
