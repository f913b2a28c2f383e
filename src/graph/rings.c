/* Ring orders: ranks sorted by host (in order of first appearance), then
 * NUMA node, then rank, so a ring crosses each host boundary once and each
 * NUMA boundary as few times as possible. Also the host-local rings and the
 * ring of host leaders used by the hierarchical algorithm. Computed at init
 * from the exchanged peer info; every rank derives the same orders. */
#include <stdlib.h>

#include "../coll/coll.h"

static int host_index(const struct ncclComm* comm, int r) {
  for (int i = 0; i < comm->nranks; i++)
    if (comm->peers[i].host_hash == comm->peers[r].host_hash) return i;
  return r;
}

static int before(const struct ncclComm* comm, const int* host, int a, int b) {
  if (host[a] != host[b]) return host[a] < host[b];
  if (comm->peers[a].numa_node != comm->peers[b].numa_node) return comm->peers[a].numa_node < comm->peers[b].numa_node;
  return a < b;
}

ncclResult_t rings_init(struct ncclComm* comm) {
  int n = comm->nranks;
  comm->ring = malloc(sizeof(int) * (size_t)n);
  comm->ring_pos = malloc(sizeof(int) * (size_t)n);
  comm->local_ring = malloc(sizeof(int) * (size_t)n);
  comm->leader_ring = malloc(sizeof(int) * (size_t)n);
  int* host = malloc(sizeof(int) * (size_t)n);
  if (!comm->ring || !comm->ring_pos || !comm->local_ring || !comm->leader_ring || !host) {
    free(host);
    return err_set(ncclSystemError, "out of memory for ring orders");
  }
  for (int i = 0; i < n; i++) host[i] = host_index(comm, i);
  /* Insertion sort: n is at most a few thousand and this runs once. */
  for (int i = 0; i < n; i++) {
    int r = i, k = i;
    while (k > 0 && before(comm, host, r, comm->ring[k - 1])) {
      comm->ring[k] = comm->ring[k - 1];
      k--;
    }
    comm->ring[k] = r;
  }
  comm->nlocal = comm->nleaders = 0;
  comm->local_pos = comm->leader_pos = -1;
  for (int p = 0; p < n; p++) {
    int r = comm->ring[p];
    comm->ring_pos[r] = p;
    if (host[r] == host[comm->rank]) {
      if (r == comm->rank) comm->local_pos = comm->nlocal;
      comm->local_ring[comm->nlocal++] = r;
    }
    if (p == 0 || host[comm->ring[p - 1]] != host[r]) {
      if (r == comm->rank) comm->leader_pos = comm->nleaders;
      comm->leader_ring[comm->nleaders++] = r;
    }
  }
  free(host);
  return ncclSuccess;
}

void rings_free(struct ncclComm* comm) {
  free(comm->ring);
  free(comm->ring_pos);
  free(comm->local_ring);
  free(comm->leader_ring);
  comm->ring = comm->ring_pos = comm->local_ring = comm->leader_ring = NULL;
}

struct ring_view ring_full(struct ncclComm* comm) {
  return (struct ring_view){comm->nranks, comm->ring, comm->ring_pos[comm->rank], 0};
}
struct ring_view ring_local(struct ncclComm* comm) {
  return (struct ring_view){comm->nlocal, comm->local_ring, comm->local_pos, 0};
}
struct ring_view ring_leaders(struct ncclComm* comm) {
  return (struct ring_view){comm->nleaders, comm->leader_ring, comm->leader_pos, 0};
}
