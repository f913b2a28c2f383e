/* Reading /proc/<pid>/stat: one parser for the callers that ask about a
 * process or thread of this machine (health.c: is a silent neighbour still
 * running; shmseg.c: has a peer exited; graph/bind.c: which CPU a thread
 * last ran on, is it runnable). */
#ifndef COLLIE_PROCSTAT_H
#define COLLIE_PROCSTAT_H

#include <stddef.h>
#include <stdint.h>

/* /proc/<pid>/stat (tid 0) or /proc/<pid>/task/<tid>/stat read into buf;
 * pid 0 is this process. Returns a pointer to field 3 (the state letter),
 * counted from the command name's last ')' (the name may hold blanks and
 * parentheses), or NULL when the file cannot be read. */
const char* procstat_fields(int pid, int tid, char* buf, size_t n);
/* Field k (k >= 3, as proc(5) numbers them) of what procstat_fields
 * returned, or NULL past the last one. */
const char* procstat_field(const char* fields, int k);
/* The start time of process `pid` (0: this one) in clock ticks after boot
 * (field 22); 0 when unknown. */
uint64_t proc_start_ticks(int pid);
/* 1 when process `pid` of this pid namespace exists, started at `start`
 * ticks (so it is not another process that got the pid) and is neither
 * stopped, traced nor dead: it runs or waits to run. 0 otherwise, and for
 * start 0. */
int proc_running(int pid, uint64_t start);

#endif
