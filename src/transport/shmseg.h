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

#endif
