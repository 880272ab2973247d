#!/bin/sh
# Slurm (Debian's slurmctld, slurmd, slurm-client) and munge, which tests/system/test_slurm.py runs a
# temporary cluster with. Idempotent: nothing happens where slurmctld, slurmd, sbatch and munged are on PATH.
# Non-interactive, as root (CI). The packages' own services are never started: while they install, a
# policy-rc.d refuses every service start (deb-systemd-invoke and invoke-rc.d ask it), and afterwards the
# units are disabled where systemd runs; the test fixture writes its own slurm.conf and munge key in a
# temporary directory and starts its own daemons.
set -eu
have() { command -v "$1" >/dev/null 2>&1; }
PATH="$PATH:/usr/sbin:/sbin"
if have slurmctld && have slurmd && have sbatch && have munged; then
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "slurm is missing: install Debian's packages 'slurmctld slurmd slurm-client munge' (as root: make slurm)" >&2
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
    -o Dpkg::Options::=--force-confold slurmctld slurmd slurm-client munge </dev/null >/dev/null
if [ -d /run/systemd/system ] && have systemctl; then
    systemctl disable --now slurmctld.service slurmd.service munge.service >/dev/null 2>&1 || true
fi
have slurmctld && have slurmd && have sbatch && have munged
echo "[slurm] installed: $(slurmctld -V 2>&1 | head -n 1), $(munged -V 2>&1 | head -n 1)"
