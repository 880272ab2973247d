"""`tidal server --store`: one store for every region, or one per region with a default for the others."""

from __future__ import annotations

import pytest

from tidal.control.regionstores import RegionStores, parse_stores
from tidal.errors import ValidationError


def test_one_url_is_every_regions() -> None:
    stores = parse_stores(["s3://bucket/ck"])
    assert stores == RegionStores("s3://bucket/ck", {})
    assert stores.for_region("west") == stores.for_region("east") == "s3://bucket/ck"
    assert stores.shared("west", "east")
    assert stores.describe() == "every region: s3://bucket/ck"


def test_a_store_per_region_and_a_default() -> None:
    stores = parse_stores(["west=s3://w/ck", "east=/srv/east", "s3://rest/ck?x=1"])
    assert stores.regions == {"west": "s3://w/ck", "east": "/srv/east"}
    assert stores.default == "s3://rest/ck?x=1"  # '=' in a URL's query is not a region
    assert stores.for_region("north") == "s3://rest/ck?x=1"
    assert not stores.shared("west", "east") and stores.shared("north", "south")
    assert stores.describe() == "east: /srv/east; west: s3://w/ck; other regions: s3://rest/ck?x=1"


def test_without_a_default_other_regions_use_their_agents_own() -> None:
    stores = parse_stores(["west=s3://w/ck"])
    assert stores.for_region("east") is None
    assert parse_stores([]).describe() == "each agent's own setting (TIDAL_CHECKPOINT_STORE)"


@pytest.mark.parametrize(("values", "message"), [
    (["west=s3://a", "west=s3://b"], "--store: region west is given twice"),
    (["s3://a", "s3://b"], "--store: two default stores (s3://a and s3://b)"),
    (["west="], "--store west=: no URL after west="),
    ([" "], "--store: empty value"),
])
def test_bad_values_are_refused(values: list[str], message: str) -> None:
    with pytest.raises(ValidationError) as e:
        parse_stores(values)
    assert e.value.message == message
