/* Unit tests for the rule that picks the tuner's row or single copy for a
 * large broadcast or allgather by measured rates (coll/adapt.c adapt_pick,
 * and adapt_pick3 where the FIFO's slot stores are weighed beside them):
 * every rank applies it to the same summed rates and call number, so it must
 * be a pure function; it tries both paths first, then takes single copy
 * only where it measured clearly faster, and tries the other path now and
 * then. adapt_window says how many calls a pick covers;
 * adapt_load_verdict whether a rank waited for a CPU. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "coll/coll.h"
#include "graph/bind.h"

/* The first three calls measure: the tuner's row, single copy, the tuner's row again. */
static void test_first_calls_try_both(void** state) {
  (void)state;
  int trial = 0;
  assert_int_equal(adapt_pick(0, 0, 0, 0, &trial), 0);
  assert_true(trial);
  assert_int_equal(adapt_pick(1, 5, 0, 0, &trial), 1);
  assert_true(trial);
  assert_int_equal(adapt_pick(2, 5, 9, 0, &trial), 0);
  assert_true(trial);
}

/* Single copy wins only by a clear margin; ties and small leads keep the tuner's row. */
static void test_margin(void** state) {
  (void)state;
  int trial = 0;
  assert_int_equal(adapt_pick(3, 10, 10, 0, &trial), 0);
  assert_false(trial);
  assert_int_equal(adapt_pick(3, 10, 12, 0, &trial), 0);
  assert_int_equal(adapt_pick(3, 10, 14, 0, &trial), 1);
  assert_false(trial);
  assert_int_equal(adapt_pick(5, 2, 7, 0, &trial), 1); /* a slow stretch: 3.5x */
  assert_int_equal(adapt_pick(5, 7, 2, 0, &trial), 0);
  /* The slots' stores: the narrow margin, still no flip on a tie or a 5% lead. */
  assert_int_equal(adapt_pick(3, 10, 10, 1, &trial), 0);
  assert_int_equal(adapt_pick(3, 10, 10.5, 1, &trial), 0);
  assert_int_equal(adapt_pick(3, 10, 12, 1, &trial), 1);
  assert_false(trial);
  assert_int_equal(adapt_pick(3, 12, 10, 1, &trial), 0);
}

/* Over 64 * ADAPT_EXPLORE calls after the first tries, with the alternative
 * ahead and then the tuner's row ahead: how many calls were trials, and
 * that every other call ran the better path. */
static void count_trials(int slots, int* on_alt, int* on_plan) {
  int trial = 0;
  *on_alt = *on_plan = 0;
  for (uint32_t c = 3; c < 3 + 64 * ADAPT_EXPLORE; c++) {
    int use = adapt_pick(c, 2, 7, slots, &trial);
    assert_int_equal(use, trial ? 0 : 1);
    *on_alt += trial;
    use = adapt_pick(c, 7, 2, slots, &trial);
    assert_int_equal(use, trial ? 1 : 0);
    *on_plan += trial;
  }
}

/* On single copy the tuner's row is tried every ADAPT_EXPLORE calls; on the
 * tuner's row single copy every ADAPT_EXPLORE_ALT; the slots' other way every
 * ADAPT_EXPLORE from either; nothing else is a trial. */
static void test_trials(void** state) {
  (void)state;
  int on_alt = 0, on_plan = 0, trial = 0;
  count_trials(0, &on_alt, &on_plan);
  assert_int_equal(on_alt, 64);
  assert_int_equal(on_plan, 64 * ADAPT_EXPLORE / ADAPT_EXPLORE_ALT);
  assert_int_equal(adapt_pick(ADAPT_EXPLORE, 2, 7, 0, &trial), 0);
  assert_true(trial);
  assert_int_equal(adapt_pick(ADAPT_EXPLORE_ALT, 7, 2, 0, &trial), 1);
  assert_true(trial);
  assert_int_equal(adapt_pick(ADAPT_EXPLORE, 7, 2, 0, &trial), 0);
  assert_false(trial);
  assert_int_equal(adapt_pick(4 * ADAPT_EXPLORE, 7, 2, 0, &trial), 0);
  assert_false(trial);
  count_trials(1, &on_alt, &on_plan);
  assert_int_equal(on_alt, 64);
  assert_int_equal(on_plan, 64);
}

/* Three paths (adapt_pick3: plain slot stores, single copy, non-temporal
 * slot stores): the first four calls try plain, single copy, non-temporal,
 * plain; the FIFO's store kind and single copy each need the margin; trials
 * of single copy and of the FIFO's other store kind come at their periods,
 * never both in one call. */
static void test_three_paths(void** state) {
  (void)state;
  int trial = 0;
  double r[3] = {0, 0, 0};
  static const int first[4] = {0, 1, 2, 0};
  for (uint32_t c = 0; c < 4; c++) {
    assert_int_equal(adapt_pick3(c, r, 0, &trial), first[c]);
    assert_true(trial);
  }
  double plain[3] = {10, 10, 10.5}, nt[3] = {10, 10, 14}, cma[3] = {10, 19, 14}, cma_nt[3] = {10, 17, 14};
  assert_int_equal(adapt_pick3(5, plain, 0, &trial), 0); /* non-temporal 1.05x: not enough */
  assert_false(trial);
  assert_int_equal(adapt_pick3(5, nt, 0, &trial), 2);
  assert_false(trial);
  assert_int_equal(adapt_pick3(5, cma, 0, &trial), 1); /* 1.36x the better FIFO kind */
  assert_false(trial);
  assert_int_equal(adapt_pick3(5, cma_nt, 0, &trial), 2); /* 1.7x plain, 1.2x non-temporal: the FIFO */
  assert_false(trial);
  /* A reduction's three ways (plain, non-temporal, read ahead): path [1]
   * with the slots' narrow margin against the better of the other two. */
  double ahead[3] = {10, 11, 12}, nt_red[3] = {10, 13.5, 12};
  assert_int_equal(adapt_pick3(5, ahead, 1, &trial), 2);
  assert_int_equal(adapt_pick3(5, nt_red, 1, &trial), 1);
  assert_int_equal(adapt_pick3(5, nt_red, 0, &trial), 2);
  int on[3][3] = {{0}};
  const double* cases[3] = {plain, nt, cma};
  for (int k = 0; k < 3; k++)
    for (uint32_t c = 4; c < 4 + 4 * ADAPT_EXPLORE_ALT; c++) {
      int use = adapt_pick3(c, cases[k], 0, &trial);
      if (trial) on[k][use]++;
      else assert_int_equal(use, k == 0 ? 0 : k == 1 ? 2 : 1);
    }
  /* On plain stores: single copy every ADAPT_EXPLORE_ALT calls, non-temporal stores every ADAPT_EXPLORE. */
  assert_int_equal(on[0][1], 4);
  assert_int_equal(on[0][2], 4 * ADAPT_EXPLORE_ALT / ADAPT_EXPLORE);
  assert_int_equal(on[0][0], 0);
  /* On non-temporal stores: single copy every ADAPT_EXPLORE_ALT, plain every ADAPT_EXPLORE. */
  assert_int_equal(on[1][1], 4);
  assert_int_equal(on[1][0], 4 * ADAPT_EXPLORE_ALT / ADAPT_EXPLORE);
  /* On single copy: the better FIFO kind every ADAPT_EXPLORE calls. */
  assert_int_equal(on[2][2], 4 * ADAPT_EXPLORE_ALT / ADAPT_EXPLORE);
  assert_int_equal(on[2][0] + on[2][1], 0);
}

/* One look never changes the state (a task that wanted a CPU for a moment);
 * two in a row that agree do, either way. */
/* Below 256 KiB a rank, windows of ADAPT_WINDOW calls from the first pick;
 * from there a call for each first pick that tries a path, then about 8
 * MiB a rank's worth: 16 calls at most, 1 at least. */
static void test_window(void** state) {
  (void)state;
  const size_t K = 1024, M = K * K;
  assert_int_equal(adapt_window(32 * K, 0, 3), ADAPT_WINDOW);
  assert_int_equal(adapt_window(128 * K, 7, 3), ADAPT_WINDOW);
  for (uint32_t c = 0; c < 4; c++) assert_int_equal(adapt_window(256 * K, c, 4), 1);
  assert_int_equal(adapt_window(256 * K, 2, 3), 1);
  assert_int_equal(adapt_window(256 * K, 3, 3), 16);
  assert_int_equal(adapt_window(512 * K, 4, 4), 16);
  assert_int_equal(adapt_window(M + 12, 3, 3), 7);
  assert_int_equal(adapt_window(2 * M, 3, 3), 4);
  assert_int_equal(adapt_window(8 * M, 9, 3), 1);
  assert_int_equal(adapt_window(256 * M, 1000, 3), 1);
}

static void test_look_confirmed(void** state) {
  (void)state;
  /* Looks in turn and the state after each: one look never changes it. */
  static const int look[] = {1, 0, 1, 1, 0, 1, 0, 0}, want[] = {0, 0, 0, 1, 1, 1, 1, 0};
  int last = 0, busy = 0;
  for (size_t i = 0; i < sizeof(look) / sizeof(look[0]); i++) {
    busy = look_confirmed(busy, &last, look[i]);
    assert_int_equal(busy, want[i]);
    assert_int_equal(last, look[i]);
  }
}

/* A rank waits for a CPU where it spent more than ADAPT_LOAD_PERCENT of
 * its runnable time waiting; a look with too little runnable time keeps the
 * last verdict for up to a second, then says no. */
static void test_load_verdict(void** state) {
  (void)state;
  const int64_t ms = 1000000;
  assert_int_equal(adapt_load_verdict(97 * ms / 2, 3 * ms / 2, 50 * ms, 0), 0); /* alone: 3% */
  assert_int_equal(adapt_load_verdict(97 * ms / 2, 3 * ms / 2, 50 * ms, 1), 0);
  assert_int_equal(adapt_load_verdict(20 * ms, 20 * ms, 50 * ms, 0), 1); /* beside a busy process: 50% */
  assert_int_equal(adapt_load_verdict(85 * ms, 15 * ms, 100 * ms, 0), 0); /* 15%: not more */
  assert_int_equal(adapt_load_verdict(84 * ms, 16 * ms, 100 * ms, 0), 1);
  assert_int_equal(adapt_load_verdict(ms / 2, ms, 60 * ms, 1), 1); /* 1.5 ms runnable: too little to say */
  assert_int_equal(adapt_load_verdict(ms / 2, ms, 60 * ms, 0), 0);
  assert_int_equal(adapt_load_verdict(0, 0, 2000 * ms, 1), 0); /* asleep for 2 s */
}

/* The thread's own schedstat reads, and its time on a CPU grows while it spins.
 * The kernel adds a running thread's time at a tick or a switch: a test
 * process that started a moment ago may have had neither and read 0 (seen
 * once in a fresh-clone run), so the thread spins before each read. */
static void spin_ms(int ms) {
  volatile uint64_t x = 0;
  int64_t until = time_ns() + (int64_t)ms * 1000000;
  while (time_ns() < until) x++;
}

static void test_schedstat(void** state) {
  (void)state;
  int64_t run0, wait0, run1, wait1;
  spin_ms(20);
  if (bind_thread_schedstat(&run0, &wait0) != 0) skip(); /* a kernel without schedstats */
  assert_true(run0 > 0 && wait0 >= 0);
  spin_ms(20);
  assert_int_equal(bind_thread_schedstat(&run1, &wait1), 0);
  assert_true(run1 > run0);
  assert_true(wait1 >= wait0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_first_calls_try_both),
      cmocka_unit_test(test_margin),
      cmocka_unit_test(test_trials),
      cmocka_unit_test(test_three_paths),
      cmocka_unit_test(test_window),
      cmocka_unit_test(test_look_confirmed),
      cmocka_unit_test(test_load_verdict),
      cmocka_unit_test(test_schedstat),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
