/* Process placement and host identity; see topo.h. The hwloc topology is
 * loaded once per process with only CPU and NUMA objects kept, which keeps
 * init fast when many ranks start on one host. */
#include "topo.h"

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "../core.h"
#include "bind.h"

#ifdef COLLIE_HAVE_HWLOC
#include <hwloc.h>
#endif

static uint64_t hash_str(uint64_t h, const char* s) {
  for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ULL;
  return h;
}

uint64_t topo_machine_hash(void) {
  char host[256] = "";
  gethostname(host, sizeof(host) - 1);
  /* Two containers can share a hostname; the boot id tells machines apart. */
  char boot[64] = "";
  FILE* f = fopen("/proc/sys/kernel/random/boot_id", "r");
  if (f) {
    if (!fgets(boot, sizeof(boot), f)) boot[0] = '\0';
    fclose(f);
  }
  return hash_str(hash_str(0xcbf29ce484222325ULL, host), boot);
}

uint64_t topo_host_hash(uint64_t machine, char* name, size_t name_len) {
  const char* hostid = param_str(P_NCCL_HOSTID);
  if (hostid) {
    snprintf(name, name_len, "%s", hostid);
    return hash_str(0xcbf29ce484222325ULL, hostid);
  }
  char host[256] = "";
  gethostname(host, sizeof(host) - 1);
  snprintf(name, name_len, "%s", host);
  return machine;
}

#ifdef COLLIE_HAVE_HWLOC
static pthread_once_t topo_once = PTHREAD_ONCE_INIT;
static hwloc_topology_t topo;
static int topo_ok;

static void topo_load(void) {
  if (hwloc_topology_init(&topo) != 0) return;
  hwloc_topology_set_all_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_NONE);
  hwloc_topology_set_type_filter(topo, HWLOC_OBJ_PACKAGE, HWLOC_TYPE_FILTER_KEEP_ALL);
  hwloc_topology_set_type_filter(topo, HWLOC_OBJ_CORE, HWLOC_TYPE_FILTER_KEEP_ALL);
  hwloc_topology_set_type_filter(topo, HWLOC_OBJ_PU, HWLOC_TYPE_FILTER_KEEP_ALL);
  hwloc_topology_set_type_filter(topo, HWLOC_OBJ_NUMANODE, HWLOC_TYPE_FILTER_KEEP_ALL);
  if (hwloc_topology_load(topo) != 0) {
    hwloc_topology_destroy(topo);
    return;
  }
  topo_ok = 1;
}

__attribute__((destructor)) static void topo_fini(void) {
  if (topo_ok) hwloc_topology_destroy(topo);
  topo_ok = 0;
}

const char* topo_backend(void) { return "hwloc " HWLOC_VERSION; }
#else
const char* topo_backend(void) { return "sched_getaffinity"; }
#endif

void topo_local_placement(int* numa_node, char* cpuset, size_t cpuset_len) {
  *numa_node = -1;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) bind_cpulist(&set, cpuset, cpuset_len);
  else snprintf(cpuset, cpuset_len, "?");
  /* One NUMA node (the common case, and every VM here): that is the answer,
   * without loading a hwloc topology, which costs every rank's process 3 to
   * 30 ms (plugins, CPUID per PU under a hypervisor): a second of CPU per
   * thousand ranks at init. */
  if (access("/sys/devices/system/node/node1", F_OK) != 0) {
    if (access("/sys/devices/system/node/node0", F_OK) == 0) *numa_node = 0;
    return;
  }
#ifdef COLLIE_HAVE_HWLOC
  pthread_once(&topo_once, topo_load);
  if (topo_ok) {
    hwloc_bitmap_t cpus = hwloc_bitmap_alloc(), nodes = hwloc_bitmap_alloc();
    if (cpus && nodes && hwloc_get_cpubind(topo, cpus, HWLOC_CPUBIND_PROCESS) == 0) {
      hwloc_cpuset_to_nodeset(topo, cpus, nodes);
      /* One node if the process is confined to one; else where it runs now. */
      if (hwloc_bitmap_weight(nodes) == 1) {
        *numa_node = hwloc_bitmap_first(nodes);
      } else if (hwloc_get_last_cpu_location(topo, cpus, HWLOC_CPUBIND_THREAD) == 0) {
        hwloc_cpuset_to_nodeset(topo, cpus, nodes);
        *numa_node = hwloc_bitmap_first(nodes);
      }
    }
    hwloc_bitmap_free(cpus);
    hwloc_bitmap_free(nodes);
    return;
  }
#endif
  int cpu = sched_getcpu();
  for (int node = 0; cpu >= 0 && node < 1024; node++) {
    char path[128];
    snprintf(path, sizeof(path), "/sys/devices/system/cpu/cpu%d/node%d", cpu, node);
    if (access(path, F_OK) == 0) {
      *numa_node = node;
      break;
    }
  }
}

int topo_bind_thread(int k) {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return -1;
  int n = CPU_COUNT(&set);
  if (n <= 0) return -1;
  int want = k % n, cpu = -1;
  for (int c = 0, seen = 0; c < CPU_SETSIZE; c++) {
    if (!CPU_ISSET(c, &set)) continue;
    if (seen++ == want) {
      cpu = c;
      break;
    }
  }
  if (cpu < 0) return -1;
#ifdef COLLIE_HAVE_HWLOC
  pthread_once(&topo_once, topo_load);
  if (topo_ok) {
    hwloc_bitmap_t b = hwloc_bitmap_alloc();
    int ok = -1;
    if (b) {
      hwloc_bitmap_only(b, (unsigned)cpu);
      ok = hwloc_set_cpubind(topo, b, HWLOC_CPUBIND_THREAD);
      hwloc_bitmap_free(b);
    }
    return ok == 0 ? cpu : -1;
  }
#endif
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  return pthread_setaffinity_np(pthread_self(), sizeof(one), &one) == 0 ? cpu : -1;
}
