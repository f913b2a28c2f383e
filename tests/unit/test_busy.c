/* Unit tests for the count of running operations that abort and revoke wait
 * for (failures.h comm_busy_enter/leave, async.c comm_busy_count and
 * comm_wait_idle): the communicator's first calling thread counts with plain
 * stores, every other thread with the locked counter, and a waiter sees both. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "failures.h"

static struct ncclComm* new_comm(void) {
  comm_busy_setup();
  struct ncclComm* c = calloc(1, sizeof(*c));
  assert_non_null(c);
  return c;
}

/* A call on another thread: it enters, records what it was counted as and
 * the count it saw, then leaves once `go` is set. */
struct held {
  struct ncclComm* comm;
  int fast, count_inside;
  int go, entered;
};

static void nap_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static void* holds(void* p) {
  struct held* h = p;
  h->fast = comm_busy_enter(h->comm);
  h->count_inside = comm_busy_count(h->comm);
  __atomic_store_n(&h->entered, 1, __ATOMIC_RELEASE);
  while (!__atomic_load_n(&h->go, __ATOMIC_ACQUIRE)) nap_ms(1);
  comm_busy_leave(h->comm, h->fast);
  return NULL;
}

static void test_owner_and_others(void** state) {
  (void)state;
  struct ncclComm* c = new_comm();
  if (!comm_busy_fast_ok) print_message("membarrier refused here: every thread uses the locked counter\n");
  int f1 = comm_busy_enter(c);
  int f2 = comm_busy_enter(c); /* nested */
  assert_int_equal(f1, comm_busy_fast_ok);
  assert_int_equal(f2, comm_busy_fast_ok);
  assert_int_equal(comm_busy_count(c), 2);
  /* Another thread while the first owns the plain count: the locked one. */
  struct held o = {c, -1, -1, 1, 0};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, holds, &o), 0);
  pthread_join(th, NULL);
  assert_int_equal(o.fast, 0);
  assert_int_equal(o.count_inside, 3);
  assert_int_equal(comm_busy_count(c), 2);
  comm_busy_leave(c, f2);
  assert_int_equal(comm_busy_count(c), 1);
  comm_busy_leave(c, f1);
  assert_int_equal(comm_busy_count(c), 0);
  assert_int_equal(c->busy, 0);
  /* The owner stays the owner after its calls end. */
  struct held o2 = {c, -1, -1, 1, 0};
  assert_int_equal(pthread_create(&th, NULL, holds, &o2), 0);
  pthread_join(th, NULL);
  assert_int_equal(o2.fast, 0);
  assert_int_equal(o2.count_inside, 1);
  free(c);
}

struct waiter {
  struct ncclComm* comm;
  int ms;
  int idle;
  int done;
};

static void* waits_idle(void* p) {
  struct waiter* w = p;
  w->idle = comm_wait_idle(w->comm, w->ms);
  __atomic_store_n(&w->done, 1, __ATOMIC_RELEASE);
  return NULL;
}

/* A waiter neither returns while the owner's call runs, nor misses its end. */
static void test_wait_idle_sees_the_owner(void** state) {
  (void)state;
  struct ncclComm* c = new_comm();
  int fast = comm_busy_enter(c);
  assert_int_equal(comm_wait_idle(c, 30), 0); /* busy all along: not idle */
  struct waiter w = {c, 60000, -1, 0};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, waits_idle, &w), 0);
  nap_ms(50);
  assert_int_equal(__atomic_load_n(&w.done, __ATOMIC_ACQUIRE), 0);
  comm_busy_leave(c, fast);
  pthread_join(th, NULL);
  assert_int_equal(w.idle, 1);
  free(c);
}

/* The same for a call counted by the locked counter (not the owner). */
static void test_wait_idle_sees_other_threads(void** state) {
  (void)state;
  struct ncclComm* c = new_comm();
  comm_busy_leave(c, comm_busy_enter(c)); /* this thread owns the plain count */
  struct held h = {c, -1, -1, 0, 0};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, holds, &h), 0);
  while (!__atomic_load_n(&h.entered, __ATOMIC_ACQUIRE)) nap_ms(1);
  assert_int_equal(h.fast, 0);
  assert_int_equal(h.count_inside, 1);
  assert_int_equal(comm_busy_count(c), 1);
  assert_int_equal(comm_wait_idle(c, 30), 0);
  __atomic_store_n(&h.go, 1, __ATOMIC_RELEASE);
  assert_int_equal(comm_wait_idle(c, 60000), 1);
  pthread_join(th, NULL);
  assert_int_equal(comm_busy_count(c), 0);
  free(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_owner_and_others),
      cmocka_unit_test(test_wait_idle_sees_the_owner),
      cmocka_unit_test(test_wait_idle_sees_other_threads),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
