/* collie-info: prints the library version, build features, the table of
 * environment variables (as text, or as docs/ENV.md with --env-markdown) and
 * the tuner's table and choices (--tuning, graph/tuning.c and graph/calib.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll/coll.h"
#include "collie.h"
#include "device/device.h"
#include "graph/topo.h"
#include "param.h"

static void usage(FILE* f) {
  fprintf(f, "usage: collie-info [--env | --env-markdown | --version | --tuning [--nranks N] [--factor 2|4]]\n");
}

int main(int argc, char** argv) {
  if (argc > 1 && strcmp(argv[1], "--env-markdown") == 0) {
    param_write_markdown(stdout);
    return 0;
  }
  if (argc > 1 && strcmp(argv[1], "--version") == 0) {
    printf("collie %d.%d.%d (NCCL API %d.%d.%d)\n", COLLIE_VERSION_MAJOR, COLLIE_VERSION_MINOR, COLLIE_VERSION_PATCH,
           NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
    return 0;
  }
  if (argc > 1 && strcmp(argv[1], "--tuning") == 0) {
    int nranks = 2, factor = 4;
    for (int i = 2; i < argc; i += 2) {
      int is_n = strcmp(argv[i], "--nranks") == 0, is_f = strcmp(argv[i], "--factor") == 0;
      if ((!is_n && !is_f) || i + 1 >= argc) {
        usage(stderr);
        return 2;
      }
      char* end;
      long v = strtol(argv[i + 1], &end, 10);
      if (is_n && (*end || v < 1 || v > 1 << 20)) {
        fprintf(stderr, "collie-info: --nranks wants a number from 1 to %d\n", 1 << 20);
        return 2;
      }
      if (is_f && (*end || (v != 2 && v != 4))) {
        fprintf(stderr, "collie-info: --factor wants 2 or 4 (the step between the sizes printed)\n");
        return 2;
      }
      if (is_n) nranks = (int)v;
      else factor = (int)v;
    }
    if (tuning_report(stdout, nranks, factor) != ncclSuccess) {
      fprintf(stderr, "collie-info: %s\n", ncclGetLastError(NULL));
      return 1;
    }
    return 0;
  }
  if (argc > 1 && strcmp(argv[1], "--env") == 0) {
    for (int i = 0; i < P_COUNT; i++) {
      const char* v = param_str((enum param_id)i);
      printf("%-36s %-20s %s\n", param_table[i].name, v ? v : "(unset)", param_table[i].doc);
    }
    return 0;
  }
  if (argc > 1) {
    usage(stderr);
    return 2;
  }
  int numa;
  char cpus[128], host[64];
  topo_local_placement(&numa, cpus, sizeof(cpus));
  topo_host_hash(topo_machine_hash(), host, sizeof(host));
  printf("collie %d.%d.%d, NCCL API %d.%d.%d\n", COLLIE_VERSION_MAJOR, COLLIE_VERSION_MINOR, COLLIE_VERSION_PATCH,
         NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
  printf("topology: %s; host %s, NUMA node %d, cpus %s\n", topo_backend(), host, numa, cpus);
  printf("devices:  %s, %d CUDA device(s)\n", device_runtime(), device_count());
  printf("environment: collie-info --env (docs/ENV.md)\n");
  return 0;
}
