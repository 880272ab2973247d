"""The environment a submitted job gets: what it needs to run as it would in the submitter's shell, and
nothing else of the submitter's.

A job's environment is stored with the job and handed to every node that runs it, so the CLI does not
send the caller's whole environment: it would carry Tidal's own credentials (``TIDAL_TOKEN``) and
whatever cloud keys the caller has exported. It sends

1. the caller's variables named in ``PASSED`` or beginning with one of ``PASSED_PREFIXES`` (how to find
   programs and libraries, locale, threading of numerical libraries), then
2. job.yaml's ``env`` (a mapping, or a list like ``--env``'s values), then
3. each ``--env NAME`` (the caller's value) or ``--env NAME=VALUE``,

later ones winning. ``CUDA_VISIBLE_DEVICES`` is not passed: a rank's devices are the ones Tidal gives
it, not the ones of the submitter's shell. ``TIDAL_*`` variables are never sent and cannot be given.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tidal.core.spec import validate_env
from tidal.errors import ValidationError

PASSED = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TERM", "TMPDIR",
    "PYTHONPATH", "PYTHONHASHSEED", "VIRTUAL_ENV",
})
PASSED_PREFIXES = ("LC_", "CONDA_", "OMP_", "MKL_")


def passed(environ: Mapping[str, str]) -> dict[str, str]:
    """The caller's variables a job gets without asking."""
    return {k: v for k, v in environ.items() if k in PASSED or k.startswith(PASSED_PREFIXES)}


def parse(items: list[str], environ: Mapping[str, str], what: str = "--env") -> dict[str, str]:
    """``NAME=VALUE`` as given, ``NAME`` with the caller's value."""
    out: dict[str, str] = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq:
            if name not in environ:
                raise ValidationError(f"{what} {name}: {name} is not set in your environment", field="env",
                                      variable=name, hint=f"give its value: {what} {name}=VALUE")
            value = environ[name]
        out[name] = value
    return out


def from_file(value: Any, environ: Mapping[str, str]) -> dict[str, str]:
    """job.yaml's ``env``: a mapping of names to strings or numbers, or a list of NAME / NAME=VALUE."""
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return parse(value, environ, what="env:")
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if isinstance(v, bool) or not isinstance(v, str | int | float):
                raise ValidationError(f"env: {k}: give the value as a string", field="env", variable=str(k),
                                      hint=f"{k}: \"{v}\"")
            out[str(k)] = str(v)
        return out
    raise ValidationError("env in a job file is a mapping of NAME: VALUE, or a list of NAME or NAME=VALUE",
                          field="env", hint="e.g. `env: {LR: \"0.1\"}` or `env: [HOME, LR=0.1]`")


def job_env(environ: Mapping[str, str], file_env: Any = None, options: list[str] | None = None) -> dict[str, str]:
    """The environment to submit, checked as the control plane will check it."""
    env = passed(environ)
    if file_env is not None:
        env |= from_file(file_env, environ)
    env |= parse(options or [], environ)
    validate_env(env)
    return env
