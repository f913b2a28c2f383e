/* Binary-compatibility smoke test: built only against NVIDIA's nccl.h
 * (-I/usr/local/cuda/include) and linked with libcollie, it checks that a
 * program compiled for NCCL runs on collie unchanged. The parent makes two
 * unique IDs and forks two ranks; each rank builds a communicator with
 * ncclCommInitRank and a second one with ncclCommInitRankConfig, checks the
 * query calls and an error path, and destroys both. No CUDA call is made. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <nccl.h>

#ifdef COLLIE_NCCL_H
#error "abi_program.c must be compiled against NVIDIA's nccl.h, not collie's"
#endif

#define NRANKS 2
#define TIMEOUT_S 60

/* A rank leaves with _exit, never exit: atexit handlers and destructors
 * inherited from the parent (which may own a bootstrap listener thread that
 * does not exist in the child) are not the child's to run. */
static void rank_exit(int code) {
  fflush(NULL);
  _exit(code);
}

/* In a rank: report the failed condition and end the child with status 1. */
#define CHECK(rank, cond, ...)                                                   \
  do {                                                                           \
    if (!(cond)) {                                                               \
      fprintf(stderr, "abi_program: rank %d: %s:%d: check failed: %s: ", (rank), \
              __FILE__, __LINE__, #cond);                                        \
      fprintf(stderr, __VA_ARGS__);                                              \
      fprintf(stderr, "\n");                                                     \
      rank_exit(1);                                                              \
    }                                                                            \
  } while (0)

#define CHECK_NCCL(rank, call)                                                   \
  do {                                                                           \
    ncclResult_t r_ = (call);                                                    \
    CHECK(rank, r_ == ncclSuccess, "%s returned %d (%s); last error: %s", #call,  \
          (int)r_, ncclGetErrorString(r_), ncclGetLastError(NULL));              \
  } while (0)

static void check_comm(int rank, ncclComm_t comm) {
  int count = -1, user_rank = -1;
  CHECK_NCCL(rank, ncclCommCount(comm, &count));
  CHECK(rank, count == NRANKS, "ncclCommCount gave %d, expected %d", count, NRANKS);
  CHECK_NCCL(rank, ncclCommUserRank(comm, &user_rank));
  CHECK(rank, user_rank == rank, "ncclCommUserRank gave %d, expected %d", user_rank, rank);

  ncclResult_t async = ncclInternalError;
  CHECK_NCCL(rank, ncclCommGetAsyncError(comm, &async));
  CHECK(rank, async == ncclSuccess, "async error state %d on a healthy communicator",
        (int)async);
}

static int run_rank(int rank, ncclUniqueId id_plain, ncclUniqueId id_config) {
  int version = 0;
  CHECK_NCCL(rank, ncclGetVersion(&version));
  CHECK(rank, version == 22809, "ncclGetVersion gave %d, expected 22809", version);
  CHECK(rank, version == NCCL_VERSION_CODE, "library %d vs header %d", version,
        NCCL_VERSION_CODE);

  const char* s = ncclGetErrorString(ncclInvalidArgument);
  CHECK(rank, s != NULL && s[0] != '\0', "ncclGetErrorString(ncclInvalidArgument) empty");

  /* First communicator: the plain entry point. */
  ncclComm_t comm = NULL;
  CHECK_NCCL(rank, ncclCommInitRank(&comm, NRANKS, id_plain, rank));
  CHECK(rank, comm != NULL, "ncclCommInitRank returned a NULL communicator");
  check_comm(rank, comm);

  /* An invalid argument must be reported as such, with a message. */
  ncclResult_t r = ncclCommCount(comm, NULL);
  CHECK(rank, r == ncclInvalidArgument, "ncclCommCount(comm, NULL) returned %d, expected %d",
        (int)r, (int)ncclInvalidArgument);
  const char* last = ncclGetLastError(comm);
  CHECK(rank, last != NULL && last[0] != '\0', "ncclGetLastError empty after a failed call");

  /* Second communicator: a config struct laid out by NVIDIA's header. */
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 1;
  config.commName = "abi_program";
  ncclComm_t comm2 = NULL;
  CHECK_NCCL(rank, ncclCommInitRankConfig(&comm2, NRANKS, id_config, rank, &config));
  CHECK(rank, comm2 != NULL, "ncclCommInitRankConfig returned a NULL communicator");
  check_comm(rank, comm2);

  CHECK_NCCL(rank, ncclCommDestroy(comm2));
  CHECK_NCCL(rank, ncclCommDestroy(comm));
  return 0;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(void) {
  /* IDs are plain bytes: made here, they reach the children through fork.
   * The parent stays alive meanwhile, in case the ID refers to it. */
  ncclUniqueId id_plain, id_config;
  ncclResult_t r = ncclGetUniqueId(&id_plain);
  if (r == ncclSuccess) r = ncclGetUniqueId(&id_config);
  if (r != ncclSuccess) {
    fprintf(stderr, "abi_program: ncclGetUniqueId returned %d (%s): %s\n", (int)r,
            ncclGetErrorString(r), ncclGetLastError(NULL));
    return 1;
  }
  fflush(NULL);

  pid_t pids[NRANKS];
  int status_of[NRANKS];
  int done[NRANKS]; /* 0 running, 1 reaped, -1 waitpid failed */
  for (int i = 0; i < NRANKS; i++) {
    pids[i] = -1;
    done[i] = 0;
    status_of[i] = 0;
  }
  for (int rank = 0; rank < NRANKS; rank++) {
    pid_t pid = fork();
    if (pid < 0) {
      perror("abi_program: fork");
      for (int j = 0; j < rank; j++) kill(pids[j], SIGKILL);
      for (int j = 0; j < rank; j++) waitpid(pids[j], NULL, 0);
      return 1;
    }
    if (pid == 0) rank_exit(run_rank(rank, id_plain, id_config));
    pids[rank] = pid;
  }

  /* Reap with a deadline: a hung rank is killed and counts as a failure. */
  int remaining = NRANKS;
  double deadline = now_s() + TIMEOUT_S;
  while (remaining > 0 && now_s() < deadline) {
    for (int i = 0; i < NRANKS; i++) {
      if (done[i]) continue;
      pid_t w = waitpid(pids[i], &status_of[i], WNOHANG);
      if (w == pids[i]) {
        done[i] = 1;
        remaining--;
      } else if (w < 0 && errno != EINTR) {
        fprintf(stderr, "abi_program: waitpid on rank %d failed: %s\n", i, strerror(errno));
        done[i] = -1;
        remaining--;
      }
    }
    if (remaining > 0) {
      struct timespec nap = {0, 20 * 1000 * 1000};
      nanosleep(&nap, NULL);
    }
  }

  int ok = 1;
  for (int i = 0; i < NRANKS; i++) {
    if (done[i] == 0) {
      fprintf(stderr, "abi_program: rank %d still running after %d s, killing it\n", i,
              TIMEOUT_S);
      kill(pids[i], SIGKILL);
      waitpid(pids[i], NULL, 0);
      ok = 0;
    } else if (done[i] < 0) {
      ok = 0;
    } else if (WIFSIGNALED(status_of[i])) {
      fprintf(stderr, "abi_program: rank %d killed by signal %d\n", i, WTERMSIG(status_of[i]));
      ok = 0;
    } else if (!WIFEXITED(status_of[i]) || WEXITSTATUS(status_of[i]) != 0) {
      fprintf(stderr, "abi_program: rank %d exited with status %d\n", i,
              WIFEXITED(status_of[i]) ? WEXITSTATUS(status_of[i]) : -1);
      ok = 0;
    }
  }
  if (!ok) {
    printf("abi_program: FAILED\n");
    return 1;
  }
  printf("abi_program: passed\n");
  return 0;
}
