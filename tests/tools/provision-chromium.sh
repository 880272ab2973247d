#!/bin/sh
# Chromium (Debian's package `chromium`), the real browser tests/system/test_dashboard.py drives through
# Playwright (which never downloads a browser of its own: the tests launch /usr/bin/chromium).
# Idempotent: nothing happens where /usr/bin/chromium exists. Non-interactive, as root (CI).
set -eu
if [ -x /usr/bin/chromium ]; then
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "chromium is missing: install Debian's package 'chromium' (as root: make chromium)" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
if ! apt-cache show chromium >/dev/null 2>&1; then
    apt-get update -qq </dev/null
fi
apt-get install -y -qq --no-install-recommends -o Dpkg::Options::=--force-confdef \
    -o Dpkg::Options::=--force-confold chromium fonts-dejavu-core </dev/null >/dev/null \
    || { apt-get update -qq </dev/null && apt-get install -y -qq --no-install-recommends \
         -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold chromium fonts-dejavu-core \
         </dev/null >/dev/null; }
test -x /usr/bin/chromium
echo "[chromium] installed: $(/usr/bin/chromium --version 2>/dev/null | head -n 1)"
