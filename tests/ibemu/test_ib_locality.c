/* NIC choice by locality over the IB transport (through the emulator): two
 * emulated HCAs get a fake sysfs directory (COLLIE_IBEMU_SYSFS) whose
 * device/local_cpulist says mlx5_0 is near CPU 0 and mlx5_1 near CPU 1. Two
 * ranks, each its own host, bound to CPU 0 and CPU 1: `spread` checks that
 * each rank's QPs are all on the HCA local to its CPU (ibemu_qps_on, the same
 * library instance the transport dlopens); `override` sets
 * NCCL_IB_HCA=mlx5_1 and checks that both ranks use mlx5_1. Needs two CPUs
 * (skipped with 77 otherwise). Uses tests/mp/harness.h. */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../mp/harness.h"
#include "ibemu.h"

static int g_override;

static int rank_main(int rank, int nranks, const ncclUniqueId* ids, int nids, void* arg) {
  (void)nids, (void)arg;
  char h[32];
  snprintf(h, sizeof(h), "lochost%d", rank);
  setenv("NCCL_HOSTID", h, 1);
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(rank, &one);
  MP_CHECK(sched_setaffinity(0, sizeof(one), &one) == 0, "cannot bind rank %d to CPU %d", rank, rank);
  ncclComm_t comm;
  MP_NCCL(ncclCommInitRank(&comm, nranks, ids[0], rank));
  float x[256];
  for (int i = 0; i < 256; i++) x[i] = (float)(rank + i);
  MP_NCCL(ncclAllReduce(x, x, 256, ncclFloat, ncclSum, comm, NULL));
  for (int i = 0; i < 256; i++) MP_CHECK(x[i] == (float)(1 + 2 * i), "element %d is %g", i, (double)x[i]);
  const char* want = g_override ? "mlx5_1" : rank == 0 ? "mlx5_0" : "mlx5_1";
  const char* other = !strcmp(want, "mlx5_0") ? "mlx5_1" : "mlx5_0";
  int on = ibemu_qps_on(want), off = ibemu_qps_on(other);
  MP_CHECK(on > 0 && off == 0, "rank %d bound to CPU %d: %d QPs on %s, %d on %s (want all on %s)", rank, rank, on, want,
           off, other, want);
  MP_NCCL(ncclCommDestroy(comm));
  return 0;
}

static int put(const char* dir, const char* dev, const char* cpus) {
  char p[512];
  snprintf(p, sizeof(p), "%s/%s", dir, dev);
  if (mkdir(p, 0700) != 0) return -1;
  snprintf(p, sizeof(p), "%s/%s/device", dir, dev);
  if (mkdir(p, 0700) != 0) return -1;
  snprintf(p, sizeof(p), "%s/%s/device/local_cpulist", dir, dev);
  FILE* f = fopen(p, "w");
  if (!f) return -1;
  fprintf(f, "%s\n", cpus);
  return fclose(f);
}

static void rm(const char* dir, const char* dev) {
  char p[512];
  snprintf(p, sizeof(p), "%s/%s/device/local_cpulist", dir, dev);
  unlink(p);
  snprintf(p, sizeof(p), "%s/%s/device", dir, dev);
  rmdir(p);
  snprintf(p, sizeof(p), "%s/%s", dir, dev);
  rmdir(p);
}

int main(int argc, char** argv) {
  if (argc != 2 || (strcmp(argv[1], "spread") && strcmp(argv[1], "override"))) {
    fprintf(stderr, "usage: test_ib_locality spread|override\n");
    return 2;
  }
  cpu_set_t all;
  if (sched_getaffinity(0, sizeof(all), &all) != 0 || !CPU_ISSET(0, &all) || !CPU_ISSET(1, &all)) {
    printf("SKIPPED: needs CPUs 0 and 1\n");
    return 77;
  }
  g_override = !strcmp(argv[1], "override");
  char dir[] = "/tmp/collie-ibsysfs-XXXXXX";
  if (!mkdtemp(dir)) { perror("mkdtemp"); return 1; }
  int rc = put(dir, "mlx5_0", "0") || put(dir, "mlx5_1", "1");
  if (rc) perror("fake sysfs");
  setenv("COLLIE_IBEMU_SYSFS", dir, 1);
  if (g_override) setenv("NCCL_IB_HCA", "mlx5_1", 1);
  if (!rc) rc = mp_run(2, rank_main, NULL, 300);
  rm(dir, "mlx5_0");
  rm(dir, "mlx5_1");
  rmdir(dir);
  fprintf(stderr, "%s ib locality %s\n", rc ? "FAILED" : "passed", argv[1]);
  return rc;
}
