/* An MPI program that uses collie the way MPI programs use NCCL: rank 0 makes
 * the unique ID, MPI_Bcast hands it to everyone, ncclCommInitRank builds the
 * communicator. Then a few collectives on host buffers, each checked against
 * the value every rank can compute. Run: mpirun -np 4 ./collie-mpi-allreduce */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nccl.h"

/* An NCCL failure leaves the other ranks inside a collective, so stop the job. */
#define NCCL_OR_ABORT(call)                                                                              \
  do {                                                                                                   \
    ncclResult_t r_ = (call);                                                                            \
    if (r_ != ncclSuccess) {                                                                             \
      fprintf(stderr, "rank %d: %s failed: %s: %s\n", g_rank, #call, ncclGetErrorString(r_),             \
              ncclGetLastError(NULL));                                                                   \
      MPI_Abort(MPI_COMM_WORLD, 1);                                                                      \
    }                                                                                                    \
  } while (0)

static int g_rank;
static int g_failures;

static void check(int ok, const char* what, size_t i, double got, double want) {
  if (ok) return;
  /* One line per failed check is enough to see what went wrong. */
  if (g_failures++ < 10)
    fprintf(stderr, "rank %d: %s: element %zu is %g, expected %g\n", g_rank, what, i, got, want);
}

/* Small integers so every dtype and op is exact: rank r contributes r + i % 7 + 1. */
static double contrib(int r, size_t i) { return (double)(r + (int)(i % 7) + 1); }

static void test_allreduce_float(ncclComm_t comm, int nranks, size_t count) {
  float* buf = malloc(count * sizeof(float));
  if (!buf) MPI_Abort(MPI_COMM_WORLD, 1);
  for (size_t i = 0; i < count; i++) buf[i] = (float)contrib(g_rank, i);
  NCCL_OR_ABORT(ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, comm, NULL));
  for (size_t i = 0; i < count; i++) {
    double want = 0;
    for (int r = 0; r < nranks; r++) want += contrib(r, i);
    check(buf[i] == (float)want, "allreduce float32 sum", i, buf[i], want);
  }
  free(buf);
}

static void test_allreduce_int32_max(ncclComm_t comm, int nranks, size_t count) {
  int32_t* send = malloc(count * sizeof(int32_t));
  int32_t* recv = malloc(count * sizeof(int32_t));
  if (!send || !recv) MPI_Abort(MPI_COMM_WORLD, 1);
  for (size_t i = 0; i < count; i++) send[i] = (int32_t)contrib(g_rank, i) * (g_rank % 2 ? -1 : 1);
  NCCL_OR_ABORT(ncclAllReduce(send, recv, count, ncclInt32, ncclMax, comm, NULL));
  for (size_t i = 0; i < count; i++) {
    int32_t want = INT32_MIN;
    for (int r = 0; r < nranks; r++) {
      int32_t v = (int32_t)contrib(r, i) * (r % 2 ? -1 : 1);
      if (v > want) want = v;
    }
    check(recv[i] == want, "allreduce int32 max", i, recv[i], want);
  }
  free(send);
  free(recv);
}

static void test_allreduce_int64_min(ncclComm_t comm, int nranks, size_t count) {
  int64_t* buf = malloc(count * sizeof(int64_t));
  if (!buf) MPI_Abort(MPI_COMM_WORLD, 1);
  for (size_t i = 0; i < count; i++) buf[i] = (int64_t)contrib(g_rank, i) + ((int64_t)1 << 40);
  NCCL_OR_ABORT(ncclAllReduce(buf, buf, count, ncclInt64, ncclMin, comm, NULL));
  for (size_t i = 0; i < count; i++) {
    int64_t want = INT64_MAX;
    for (int r = 0; r < nranks; r++) {
      int64_t v = (int64_t)contrib(r, i) + ((int64_t)1 << 40);
      if (v < want) want = v;
    }
    check(buf[i] == want, "allreduce int64 min", i, (double)buf[i], (double)want);
  }
  free(buf);
}

static void test_allreduce_double_avg(ncclComm_t comm, int nranks, size_t count) {
  double* buf = malloc(count * sizeof(double));
  if (!buf) MPI_Abort(MPI_COMM_WORLD, 1);
  for (size_t i = 0; i < count; i++) buf[i] = contrib(g_rank, i) * nranks;
  NCCL_OR_ABORT(ncclAllReduce(buf, buf, count, ncclFloat64, ncclAvg, comm, NULL));
  for (size_t i = 0; i < count; i++) {
    double want = 0;
    for (int r = 0; r < nranks; r++) want += contrib(r, i);
    check(buf[i] == want, "allreduce float64 avg", i, buf[i], want);
  }
  free(buf);
}

static void test_allreduce_uint8_prod(ncclComm_t comm, int nranks, size_t count) {
  uint8_t* buf = malloc(count);
  if (!buf) MPI_Abort(MPI_COMM_WORLD, 1);
  for (size_t i = 0; i < count; i++) buf[i] = (uint8_t)(1 + (i + (size_t)g_rank) % 2);
  NCCL_OR_ABORT(ncclAllReduce(buf, buf, count, ncclUint8, ncclProd, comm, NULL));
  for (size_t i = 0; i < count; i++) {
    unsigned want = 1;
    for (int r = 0; r < nranks; r++) want = (want * (1 + (i + (size_t)r) % 2)) & 0xff;
    check(buf[i] == want, "allreduce uint8 prod", i, buf[i], want);
  }
  free(buf);
}

static void test_broadcast(ncclComm_t comm, int nranks, size_t count) {
  int root = nranks - 1;
  double* buf = malloc(count * sizeof(double));
  if (!buf) MPI_Abort(MPI_COMM_WORLD, 1);
  for (size_t i = 0; i < count; i++) buf[i] = g_rank == root ? 0.5 * (double)i : -1.0;
  NCCL_OR_ABORT(ncclBroadcast(buf, buf, count, ncclFloat64, root, comm, NULL));
  for (size_t i = 0; i < count; i++) check(buf[i] == 0.5 * (double)i, "broadcast float64", i, buf[i], 0.5 * (double)i);
  free(buf);
}

static void test_allgather(ncclComm_t comm, int nranks, size_t count) {
  int32_t* send = malloc(count * sizeof(int32_t));
  int32_t* recv = malloc(count * (size_t)nranks * sizeof(int32_t));
  if (!send || !recv) MPI_Abort(MPI_COMM_WORLD, 1);
  for (size_t i = 0; i < count; i++) send[i] = g_rank * 1000 + (int32_t)(i % 1000);
  NCCL_OR_ABORT(ncclAllGather(send, recv, count, ncclInt32, comm, NULL));
  for (int r = 0; r < nranks; r++)
    for (size_t i = 0; i < count; i++) {
      int32_t want = r * 1000 + (int32_t)(i % 1000);
      check(recv[(size_t)r * count + i] == want, "allgather int32", (size_t)r * count + i, recv[(size_t)r * count + i],
            want);
    }
  free(send);
  free(recv);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int nranks;
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);

  ncclUniqueId id;
  if (g_rank == 0) NCCL_OR_ABORT(ncclGetUniqueId(&id));
  MPI_Bcast(&id, (int)sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t comm;
  NCCL_OR_ABORT(ncclCommInitRank(&comm, nranks, id, g_rank));

  /* A count that fits one step, one that is odd, and one spread over many chunks. */
  const size_t counts[] = {1, 1027, 1 << 20};
  for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++) {
    test_allreduce_float(comm, nranks, counts[k]);
    test_allreduce_int32_max(comm, nranks, counts[k]);
    test_allreduce_int64_min(comm, nranks, counts[k]);
    test_allreduce_double_avg(comm, nranks, counts[k]);
    test_allreduce_uint8_prod(comm, nranks, counts[k]);
    test_broadcast(comm, nranks, counts[k]);
    test_allgather(comm, nranks, counts[k]);
  }

  NCCL_OR_ABORT(ncclCommDestroy(comm));

  int total = 0;
  MPI_Allreduce(&g_failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (g_rank == 0) {
    if (total == 0)
      printf("mpi_allreduce: %d ranks: allreduce (float32 sum, int32 max, int64 min, float64 avg, uint8 prod), "
             "broadcast, allgather: OK\n", nranks);
    else
      fprintf(stderr, "mpi_allreduce: %d ranks: FAILED: %d wrong elements (see the lines above)\n", nranks, total);
  }
  MPI_Finalize();
  return total == 0 ? 0 : 1;
}
