"""The sample traces shipped with the package: named ``sample:NAME``, present, and packaged."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

import pytest

from tidal.errors import ValidationError
from tidal.sim import samples

ROOT = Path(__file__).resolve().parents[3]


def test_a_sample_name_resolves_to_its_file_and_a_path_stays_as_given() -> None:
    path = Path(samples.resolve("sample:philly-week"))
    assert path.name == "philly-week.csv.xz" and path.is_file()
    assert Path(samples.resolve("sample:philly-vc")).read_text().startswith("vc,node num\n6214e9,64\n")
    assert samples.resolve("traces/philly.csv") == "traces/philly.csv"


def test_an_unknown_sample_names_the_ones_there_are() -> None:
    with pytest.raises(ValidationError, match="no sample trace 'philly'") as err:
        samples.resolve("sample:philly")
    assert err.value.hint is not None and "sample:philly-week (" in err.value.hint and "sample:philly-vc (" in \
        err.value.hint


def test_every_sample_file_is_package_data() -> None:
    """A `pip install` carries them: each file of the samples matches a package-data pattern."""
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["tidal"]
    here = Path(samples.__file__).parent
    files = [p.relative_to(here.parents[2]).as_posix() for p in here.iterdir() if p.suffix != ".py" and p.is_file()]
    assert sorted(files) == ["tidal/sim/samples/README.md", "tidal/sim/samples/philly-week.csv.xz",
                             "tidal/sim/samples/philly_vc.csv"]
    for f in files:
        inner = f.removeprefix("tidal/")
        assert any(fnmatch.fnmatch(inner, g) for g in globs), f"{f} is not package data"
