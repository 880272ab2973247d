"""``/proc/self/mountinfo`` texts of the cgroup layouts Tidal meets (the lines that matter, and a few that
do not), for the detection's unit tests and `tidal doctor`'s."""

# CentOS 7 / an old Debian with systemd's "legacy" layout: v1 controllers only, cpu and cpuacct co-mounted.
V1_ONLY = """\
22 1 253:0 / / rw,relatime shared:1 - ext4 /dev/vda1 rw
18 22 0:17 / /sys rw,nosuid,nodev,noexec,relatime shared:6 - sysfs sysfs rw
24 18 0:20 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
25 24 0:21 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime shared:10 - cgroup cgroup rw,xattr,\
release_agent=/usr/lib/systemd/systemd-cgroups-agent,name=systemd
28 24 0:24 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:13 - cgroup cgroup rw,cpu,cpuacct
29 24 0:25 / /sys/fs/cgroup/freezer rw,nosuid,nodev,noexec,relatime shared:14 - cgroup cgroup rw,freezer
30 24 0:26 / /sys/fs/cgroup/cpuset rw,nosuid,nodev,noexec,relatime shared:15 - cgroup cgroup rw,cpuset,\
clone_children
31 24 0:27 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:16 - cgroup cgroup rw,memory
"""

# This development machine: v1 controllers, and a cgroup2 hierarchy without controllers at .../unified.
HYBRID = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
36 31 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
38 31 0:35 / /sys/fs/cgroup/blkio rw,relatime - cgroup cgroup rw,blkio
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""

# Ubuntu 22.04 and later, RHEL 9, Kubernetes nodes, the lent GPU machine: cgroup2 only.
V2_ONLY = """\
22 1 253:0 / / rw,relatime shared:1 - ext4 /dev/vda1 rw
24 22 0:22 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
35 24 0:30 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate,\
memory_recursiveprot
"""

# Hybrid without a v1 freezer: cpu on v1, the rest to cgroup2 (Tidal freezes through cgroup2 there).
HYBRID_NO_V1_FREEZER = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw,nsdelegate
"""

# A cgroup2 group bind-mounted elsewhere (a container runtime's view) besides the hierarchy's root, at a
# path with a space (written as \\040).
V2_WITH_BIND = """\
50 24 0:30 /kubepods/pod1 /var/lib/my\\040pods/cg rw,relatime shared:9 - cgroup2 cgroup2 rw
35 24 0:30 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate
"""

NONE = """\
22 1 253:0 / / rw,relatime shared:1 - ext4 /dev/vda1 rw
24 22 0:22 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
"""

FILESYSTEMS = "nodev\tsysfs\nnodev\ttmpfs\nnodev\tcgroup\nnodev\tcgroup2\n\text4\n"
FILESYSTEMS_NO_V2 = "nodev\tsysfs\nnodev\ttmpfs\nnodev\tcgroup\n\text4\n"
