#!/bin/sh
# Slurm (Debian's slurmctld, slurmd, slurm-client, slurmdbd) with munge, and MariaDB (Debian's mariadb-server)
# for Slurm's accounting database, which tests/system/test_slurm.py runs a temporary cluster with.
# Idempotent: nothing happens where slurmctld, slurmd, sbatch, munged, slurmdbd, sacctmgr and mariadbd are on
# PATH. Non-interactive, as root (CI). The packages' own services are never started: while they install, a
# policy-rc.d refuses every service start (deb-systemd-invoke and invoke-rc.d ask it), and afterwards the
# units are disabled where systemd runs; the test fixture writes its own slurm.conf, slurmdbd.conf, munge key
# and database directory in a temporary directory and starts its own daemons.
# Slurm itself is required (exit 1 where it cannot be installed); where only the accounting packages cannot
# be installed, this says so and succeeds: the tests that need accounting are then skipped, saying why.
set -eu
have() { command -v "$1" >/dev/null 2>&1; }
PATH="$PATH:/usr/sbin:/sbin"
core() { have slurmctld && have slurmd && have sbatch && have munged; }
accounting() { have slurmdbd && have sacctmgr && have sacct && have mariadbd && have mariadb-install-db; }
if core && accounting; then
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "slurm is missing: install Debian's packages 'slurmctld slurmd slurm-client slurmdbd munge mariadb-server'" \
         "(as root: make slurm)" >&2
    core
    exit 0
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
install() {
    apt-get install -y -qq --no-install-recommends -o Dpkg::Options::=--force-confdef \
        -o Dpkg::Options::=--force-confold "$@" </dev/null >/dev/null
}
apt-get update -qq </dev/null
if ! core; then
    install slurmctld slurmd slurm-client munge
fi
if ! accounting; then
    install slurmdbd mariadb-server ||
        echo "[slurm] slurmdbd or mariadb-server could not be installed: the accounting (QOS, sacct) tests will be skipped" >&2
fi
if [ -d /run/systemd/system ] && have systemctl; then
    systemctl disable --now slurmctld.service slurmd.service slurmdbd.service munge.service mariadb.service \
        >/dev/null 2>&1 || true
fi
core
echo "[slurm] installed: $(slurmctld -V 2>&1 | head -n 1), $(munged -V 2>&1 | head -n 1)"
if accounting; then
    echo "[slurm] accounting: slurmdbd $(sacctmgr -V 2>&1 | head -n 1), $(mariadbd --version 2>&1 | head -n 1)"
fi
