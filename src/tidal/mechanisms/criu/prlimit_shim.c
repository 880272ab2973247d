/* Lets CRIU read the resource limits of a task of another account where root lacks CAP_SYS_RESOURCE.
 *
 * prlimit(2) on another process needs the caller's uid and gid to match the target's, or
 * CAP_SYS_RESOURCE. Some container runtimes and VMs drop that capability from root, and CRIU's dump then
 * fails with "Can't get rlimit 0: Operation not permitted" for every job not run as root. The same
 * values are in /proc/PID/limits, which root reads without it: this preload answers a read-only
 * prlimit64 that the kernel refused with EPERM from there. Setting limits is never emulated. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

/* struct rlimit64, written out: glibc's own prototypes of these functions would clash with ours. */
struct limit {
	unsigned long long cur, max;
};
#define UNLIMITED (~0ULL)

static int parse_limit(const char *s, unsigned long long *out)
{
	char *end;
	while (*s == ' ')
		s++;
	if (strncmp(s, "unlimited", 9) == 0) {
		*out = UNLIMITED;
		return 0;
	}
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno || end == s)
		return -1;
	*out = v;
	return 0;
}

/* /proc/PID/limits: a header, then one line per resource in resource order, the soft limit at column
 * 26 and the hard one at column 47 (the kernel prints "%-25s %-20s %-20s"). */
static int limits_from_proc(pid_t pid, int resource, struct limit *old)
{
	char path[64], line[256];
	int n = -1, ok = -1;
	snprintf(path, sizeof(path), "/proc/%d/limits", (int)pid);
	FILE *f = fopen(path, "re");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f)) {
		if (n++ != resource)
			continue;
		if (strlen(line) > 47 && parse_limit(line + 26, &old->cur) == 0 &&
		    parse_limit(line + 47, &old->max) == 0)
			ok = 0;
		break;
	}
	fclose(f);
	return ok;
}

static long (*real_syscall)(long, ...);

static long raw(long nr, long a, long b, long c, long d, long e, long f)
{
	if (!real_syscall)
		real_syscall = (long (*)(long, ...))dlsym(RTLD_NEXT, "syscall");
	return real_syscall(nr, a, b, c, d, e, f);
}

static long get_limit(pid_t pid, int resource, const struct limit *new_limit, struct limit *old_limit)
{
	long ret = raw(SYS_prlimit64, pid, resource, (long)new_limit, (long)old_limit, 0, 0);
	if (ret == 0 || errno != EPERM || new_limit != NULL || old_limit == NULL || pid <= 0)
		return ret;
	if (limits_from_proc(pid, resource, old_limit) != 0) {
		errno = EPERM;
		return -1;
	}
	return 0;
}

/* CRIU reads a task's limits with syscall(__NR_prlimit64, ...); the libc wrappers are covered too. */
long syscall(long nr, ...)
{
	va_list ap;
	long a[6];
	va_start(ap, nr);
	for (int i = 0; i < 6; i++)
		a[i] = va_arg(ap, long);
	va_end(ap);
	if (nr == SYS_prlimit64)
		return get_limit((pid_t)a[0], (int)a[1], (const struct limit *)a[2], (struct limit *)a[3]);
	return raw(nr, a[0], a[1], a[2], a[3], a[4], a[5]);
}

int prlimit64(pid_t pid, int resource, const struct limit *new_limit, struct limit *old_limit)
{
	return (int)get_limit(pid, resource, new_limit, old_limit);
}

int prlimit(pid_t pid, int resource, const struct limit *new_limit, struct limit *old_limit)
	__attribute__((alias("prlimit64")));
