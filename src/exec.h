/* The executor's interface: a queued call (task) and the functions that run
 * a communicator's task list. The API front (enqueue.c) builds tasks; the
 * nonblocking worker (async.c) and the device path (device/dev_exec.c) hand
 * lists to exec.c, which plans each call (graph/tuning.c) and runs it. */
#ifndef COLLIE_EXEC_H
#define COLLIE_EXEC_H

#include "coll/coll.h"

struct task {
  struct task* next;
  struct coll_args a;
};

/* Runs one communicator's tasks in order (consecutive sends/receives as one
 * batch); the list stays the caller's. */
ncclResult_t exec_run_tasks(struct task* t);
/* Runs one call outside any list (the API front's common case); `a` may be
 * changed (resolved operator). */
ncclResult_t exec_run_one(struct coll_args* a);
/* Frees a task list. */
void exec_free_tasks(struct task* t);

#endif
