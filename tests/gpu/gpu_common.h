/* Shared by the GPU tests: whether a usable CUDA device exists, asked in a
 * forked child so that the test's own process (which forks the ranks) never
 * initialises CUDA (a CUDA context does not survive fork). Without a device
 * the tests print why and exit 77, which ctest reports as skipped. */
#ifndef COLLIE_TEST_GPU_COMMON_H
#define COLLIE_TEST_GPU_COMMON_H

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define GPU_SKIP 77

/* Number of CUDA devices (at least 1), or exits 77 with a message. */
static int gpu_require(const char* test) {
  int pfd[2];
  if (pipe(pfd) != 0) {
    perror("FAIL gpu_require: pipe");
    exit(1);
  }
  pid_t pid = fork();
  if (pid == 0) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    char msg[160];
    int len = snprintf(msg, sizeof(msg), "%d %s", e == cudaSuccess ? n : 0,
                       e == cudaSuccess ? (n ? "ok" : "no device reported") : cudaGetErrorString(e));
    if (write(pfd[1], msg, (size_t)len) < 0) _exit(1);
    _exit(0);
  }
  close(pfd[1]);
  char buf[161] = {0};
  ssize_t got = read(pfd[0], buf, sizeof(buf) - 1);
  close(pfd[0]);
  int st = 0;
  waitpid(pid, &st, 0);
  int n = got > 0 ? atoi(buf) : 0;
  if (n <= 0) {
    const char* why = got > 0 && strchr(buf, ' ') ? strchr(buf, ' ') + 1 : "probe failed";
    printf("SKIPPED: no CUDA device (%s); %s needs a GPU\n", why, test);
    fflush(stdout);
    exit(GPU_SKIP);
  }
  return n;
}

#define CUDACHECK(call)                                                                                    \
  do {                                                                                                     \
    cudaError_t e_ = (call);                                                                               \
    if (e_ != cudaSuccess) {                                                                               \
      fprintf(stderr, "FAIL %s:%d: %s -> %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_));        \
      return 1;                                                                                            \
    }                                                                                                      \
  } while (0)

#endif
