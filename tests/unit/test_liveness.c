/* Unit tests for what the keep-alive ring asks before it declares a silent
 * neighbour failed (src/procstat.c, src/bootstrap/socket.c): whether a
 * process of this machine still runs (its /proc entry, its start time, its
 * state) and whether a connection stays within this network stack; and the
 * /proc/<pid>/stat fields other callers read (a thread's state and CPU). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bootstrap/socket.h"
#include "core.h"
#include "procstat.h"

/* A child that sleeps until killed, named so that /proc/<pid>/stat's second
 * field holds blanks and parentheses. */
static pid_t start_child(void) {
  int ready[2];
  assert_int_equal(pipe(ready), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    prctl(PR_SET_NAME, "a) b (c", 0, 0, 0);
    (void)!write(ready[1], "x", 1);
    for (;;) pause();
  }
  char c;
  assert_int_equal(read(ready[0], &c, 1), 1);
  close(ready[0]);
  close(ready[1]);
  return pid;
}

/* Waits (bounded) until the child's state letter is one of `want`. */
static void wait_state(pid_t pid, const char* want) {
  char path[64], buf[512];
  snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
  for (int i = 0; i < 5000; i++) {
    FILE* f = fopen(path, "r");
    assert_non_null(f);
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    char* p = strrchr(buf, ')');
    assert_non_null(p);
    if (strchr(want, p[2])) return;
    usleep(1000);
  }
  fail_msg("process %d never reached a state in \"%s\"", (int)pid, want);
}

static void test_self(void** state) {
  (void)state;
  uint64_t me = proc_start_ticks(0);
  assert_true(me > 0);
  assert_int_equal(proc_start_ticks((int)getpid()), me);
  assert_int_equal(proc_running((int)getpid(), me), 1);
  assert_int_equal(proc_running((int)getpid(), me + 1), 0); /* another process with this pid */
  assert_int_equal(proc_running((int)getpid(), 0), 0);      /* start unknown: no claim */
  assert_int_equal(proc_running(0, me), 0);
  assert_int_equal(proc_running(-5, me), 0);
}

static void test_fields(void** state) {
  (void)state;
  char buf[1024];
  int tid = (int)syscall(SYS_gettid);
  const char* f = procstat_fields((int)getpid(), tid, buf, sizeof(buf));
  assert_non_null(f);
  assert_int_equal(*f, 'R'); /* this thread, reading its own stat */
  const char* cpu = procstat_field(f, 39);
  assert_non_null(cpu);
  int c = atoi(cpu);
  assert_true(c >= 0 && c < CPU_SETSIZE);
  const char* ppid = procstat_field(f, 4);
  assert_non_null(ppid);
  assert_int_equal(atoi(ppid), (int)getppid());
  assert_null(procstat_field(f, 400)); /* past the last field */
  assert_null(procstat_fields(999999999, 0, buf, sizeof(buf))); /* no such process */
  assert_null(procstat_fields((int)getpid(), 999999999, buf, sizeof(buf)));   /* no such thread */
}

static void test_child_states(void** state) {
  (void)state;
  pid_t pid = start_child();
  uint64_t start = proc_start_ticks((int)pid);
  assert_true(start > 0);
  assert_true(start >= proc_start_ticks(0)); /* started after this process */
  assert_int_equal(proc_running((int)pid, start), 1);

  /* Stopped (SIGSTOP: a frozen rank) does not count as running. */
  assert_int_equal(kill(pid, SIGSTOP), 0);
  int st;
  assert_int_equal(waitpid(pid, &st, WUNTRACED), pid);
  assert_true(WIFSTOPPED(st));
  wait_state(pid, "Tt");
  assert_int_equal(proc_running((int)pid, start), 0);

  assert_int_equal(kill(pid, SIGCONT), 0);
  assert_int_equal(waitpid(pid, &st, WCONTINUED), pid);
  wait_state(pid, "RS");
  assert_int_equal(proc_running((int)pid, start), 1);

  /* Dead, not yet reaped (a zombie), then gone. */
  assert_int_equal(kill(pid, SIGKILL), 0);
  wait_state(pid, "ZX");
  assert_int_equal(proc_running((int)pid, start), 0);
  assert_int_equal(waitpid(pid, &st, 0), pid);
  assert_int_equal(proc_running((int)pid, start), 0);
  assert_int_equal(proc_start_ticks((int)pid), 0);
}

static void test_link_local(void** state) {
  (void)state;
  union sock_addr addr;
  assert_int_equal(sock_parse_addr("127.0.0.1:1", "TEST", &addr), ncclSuccess);
  addr.sin.sin_port = 0;
  int lfd = -1, cfd = -1, sfd = -1;
  assert_int_equal(sock_listen(&addr, &lfd), ncclSuccess);
  int64_t deadline = time_ms() + 10000;
  assert_int_equal(sock_connect(&addr, deadline, NULL, &cfd), SOCK_OK);
  union sock_addr peer;
  int st;
  while ((st = sock_accept(lfd, &sfd, &peer)) == SOCK_AGAIN) {
    assert_true(time_ms() < deadline);
    usleep(1000);
  }
  assert_int_equal(st, SOCK_OK);
  assert_int_equal(sock_link_local(cfd), 1);
  assert_int_equal(sock_link_local(sfd), 1);
  /* Not a connected socket, or not an IP one: no claim. */
  assert_int_equal(sock_link_local(lfd), 0);
  int sp[2];
  assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sp), 0);
  assert_int_equal(sock_link_local(sp[0]), 0);
  close(sp[0]);
  close(sp[1]);
  close(cfd);
  close(sfd);
  close(lfd);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_self),
      cmocka_unit_test(test_fields),
      cmocka_unit_test(test_child_states),
      cmocka_unit_test(test_link_local),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
