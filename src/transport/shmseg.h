/* The one shared-memory segment helper: an anonymous memfd (0600, sized,
 * mapped) that peers of the same user open through /proc/<pid>/fd/<n>, so no
 * name ever exists in /dev/shm and a crash leaves nothing behind. Used by the
 * shm connectors (shm.c), the direct mailboxes (coll/direct_shm.c) and the
 * device connectors (device/dev_conn.c). */
#ifndef COLLIE_SHMSEG_H
#define COLLIE_SHMSEG_H

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"

struct shm_seg {
  void* base;  /* the mapping, NULL if none */
  size_t len;
  int fd;      /* creator: the memfd until shmseg_drop_fd; -1 otherwise */
};

/* Creates and maps a zeroed segment of len bytes. `what` names it in error
 * messages. On failure *s holds nothing (base NULL, fd -1). */
ncclResult_t shmseg_create(size_t len, const char* what, struct shm_seg* s);
/* Maps a peer's segment (its pid and memfd number, len bytes). `peer` is the
 * peer's rank, for messages. On failure *s holds nothing. */
ncclResult_t shmseg_open(int32_t pid, int32_t fd, size_t len, int peer, const char* what, struct shm_seg* s);
/* Closes the creator's fd once every peer has mapped the segment. */
void shmseg_drop_fd(struct shm_seg* s);
/* Unmaps and closes; idempotent. */
void shmseg_free(struct shm_seg* s);
/* Maps every page of len bytes from base (part of a shared mapping)
 * writable (MADV_POPULATE_WRITE, Linux 5.14: the guest's page faults in
 * one go) and writes each page once, keeping its contents, so that first
 * uses cost nothing. Populating alone is not enough on the development VM
 * (a guest whose page tables its host shadows, and which hands free memory
 * back to the host): there the first access to a page through each mapping
 * costs a trip to the host, whatever the guest's own tables say.
 * Measured there (bench/first_touch.c: one process, two mappings of a
 * fresh 1 MiB memfd, 4 KiB written through one and read through the other,
 * page after page), us a page on the first pass: 23-25 with nothing done
 * beforehand, 11-14 with both mappings populated, 5-7.5 with one of them
 * also touched, 0.2-0.5 with both touched (0.1-0.3 on later passes).
 * Between two processes the same: 2 ranks, alltoall of 4 KiB a rank
 * through rotating slots (shm.c), calls 51-250 took 7 us each with only the
 * receiver's mapping touched, 1 with both, 27-77 with neither. */
void shmseg_prefault(void* base, size_t len);

#endif
