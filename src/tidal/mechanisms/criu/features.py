"""Optional CRIU/kernel features, as ``criu check --feature NAME`` reports them.

:meth:`CriuRunner.supports` answers yes/no for the mechanism; this module also keeps CRIU's own words,
so ``tidal doctor`` can show *why* a feature is unavailable (e.g. "Dirty tracking is OFF").
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass

# criu prefixes its messages with "Warn  (criu/cr-check.c:824): " or "Error (criu/cr-check.c:1866): ".
_PREFIX = re.compile(r"^(?:Warn|Error)\s*\([^)]*\):\s*")


@dataclass(frozen=True)
class FeatureProbe:
    feature: str
    supported: bool
    message: str  # CRIU's own last line, without the source-location prefix
    returncode: int


def parse_feature_output(feature: str, returncode: int, text: str) -> FeatureProbe:
    """Interpret the output of ``criu check --feature FEATURE`` (same rule as ``CriuRunner.supports``)."""
    lines = [_PREFIX.sub("", line).strip() for line in text.strip().splitlines() if line.strip()]
    message = lines[-1] if lines else f"no output (exit code {returncode})"
    supported = returncode == 0 and "is supported" in text and "OFF" not in text
    return FeatureProbe(feature, supported, message, returncode)


def probe_feature(argv: tuple[str, ...], feature: str, timeout: float = 20) -> FeatureProbe:
    """Run ``criu check --feature FEATURE`` with the CRIU command prefix ``argv``."""
    try:
        out = subprocess.run([*argv, "check", "--feature", feature], capture_output=True, text=True,
                             timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return FeatureProbe(feature, False, f"could not run criu: {exc}", -1)
    return parse_feature_output(feature, out.returncode, out.stdout + out.stderr)
