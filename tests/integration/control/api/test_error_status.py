"""Each error class has one HTTP status, and the API answers an error with that status and the error's
``to_dict()`` as the JSON body."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

import tidal
from tidal.control.api.app import Context, create_app
from tidal.control.store.db import Database
from tidal.errors import TidalError

# Not importable as modules of the package: scripts run in a rank, and Alembic's migration scripts.
_NOT_MODULES = ("tidal.mechanisms.criu.rankinit", "tidal.mechanisms.interpose.rankside",
                "tidal.mechanisms.interpose.site", "tidal.control.store.migrations")


def _subclasses(cls: type[TidalError]) -> Iterator[type[TidalError]]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def error_classes() -> list[type[TidalError]]:
    """TidalError and every subclass of it, wherever in the package it is defined."""
    for m in pkgutil.walk_packages(tidal.__path__, "tidal."):
        if not m.name.startswith(_NOT_MODULES) and not m.name.endswith("__main__"):
            importlib.import_module(m.name)
    return sorted({TidalError, *_subclasses(TidalError)}, key=lambda c: (c.__module__, c.__qualname__))


ERRORS = error_classes()


def test_the_errors_are_found() -> None:
    names = {c.__name__ for c in ERRORS}
    assert {"ValidationError", "CheckpointCorrupt", "LeaseLost", "CutTimeout"} <= names


@pytest.mark.parametrize("cls", ERRORS, ids=lambda c: c.__name__)
def test_each_error_has_one_status(cls: type[TidalError]) -> None:
    assert isinstance(cls.status_code, int) and 400 <= cls.status_code <= 599
    if "status_code" not in vars(cls):  # inherited: its error bases must agree on it
        inherited = {b.status_code for b in cls.__bases__ if issubclass(b, TidalError)}
        assert inherited == {cls.status_code}, (cls, inherited)


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    tmp: Path = tmp_path_factory.mktemp("errors")
    db = Database(f"sqlite:///{tmp / 'tidal.db'}")
    db.migrate()
    app = create_app(Context(db=db, home=tmp))
    raised: dict[str, TidalError] = {}
    app.state.raised = raised

    def fail(name: str) -> None:
        raise raised[name]

    app.add_api_route("/test/fail/{name}", fail, methods=["POST"])
    with TestClient(app) as c:
        yield c
    db.close()


@pytest.mark.parametrize("cls", ERRORS, ids=lambda c: c.__name__)
def test_the_api_answers_an_error_with_its_status_and_body(client: TestClient, cls: type[TidalError]) -> None:
    exc = cls(f"{cls.__name__} went wrong: \udcff", hint="do this instead", field="what", limit=7)
    client.app.state.raised[cls.__qualname__] = exc  # type: ignore[attr-defined]
    r = client.post(f"/test/fail/{cls.__qualname__}")
    assert r.status_code == cls.status_code
    body = exc.to_dict()
    assert body["error"] == cls.__name__
    # A lone surrogate has no UTF-8 form: it is shown escaped.
    assert r.json() == {**body, "message": body["message"].replace("\udcff", "\\udcff")}
