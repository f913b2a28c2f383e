/* Where this process runs: NUMA node and allowed CPUs (hwloc when built with
 * it, sched_getaffinity + sysfs otherwise), and the host identity. Feeds the
 * peer info that init.c exchanges. */
#ifndef COLLIE_TOPO_H
#define COLLIE_TOPO_H

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"

/* The host a rank counts as: NCCL_HOSTID hashed when set, else `machine`
 * (topo_machine_hash); `name` gets the printable form. */
uint64_t topo_host_hash(uint64_t machine, char* name, size_t name_len);
/* The machine this process runs on (hostname + boot id), whatever
 * NCCL_HOSTID says: ranks that share CPUs have the same one. */
uint64_t topo_machine_hash(void);
/* NUMA node (-1 unknown) and CPU list of the calling process. */
void topo_local_placement(int* numa_node, char* cpuset, size_t cpuset_len);
/* Binds the calling thread to the k-th CPU (mod their number) the process may
 * use; returns that CPU, or -1 if binding failed. */
int topo_bind_thread(int k);
/* "hwloc <version>" or "sched_getaffinity" (for the init INFO line). */
const char* topo_backend(void);

#endif
