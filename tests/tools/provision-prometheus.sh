#!/bin/sh
# Prometheus (Debian's package `prometheus`), which tests/system/test_metrics.py scrapes the control plane with.
# Idempotent: nothing happens where `prometheus` is already on PATH. Non-interactive, as root (CI).
# The package's own service is never started: while it installs, a policy-rc.d refuses every service
# start (deb-systemd-invoke and invoke-rc.d ask it), and afterwards the unit is disabled where systemd runs;
# the test starts its own server on loopback with its own configuration and storage.
set -eu
if command -v prometheus >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "prometheus is missing: install Debian's package 'prometheus' (as root: make prometheus)" >&2
    exit 1
fi
policy=/usr/sbin/policy-rc.d
ours=""
if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' > "$policy"
    chmod 755 "$policy"
    ours=1
fi
cleanup() { if [ -n "$ours" ]; then rm -f "$policy"; fi; }
trap cleanup EXIT
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq </dev/null
apt-get install -y -qq --no-install-recommends -o Dpkg::Options::=--force-confdef \
    -o Dpkg::Options::=--force-confold prometheus </dev/null >/dev/null
if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
    systemctl disable --now prometheus.service >/dev/null 2>&1 || true
fi
command -v prometheus >/dev/null
echo "[prometheus] installed: $(prometheus --version 2>&1 | head -n 1)"
