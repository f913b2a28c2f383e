/* Unit tests for the rule that picks the tuner's row or single copy for a
 * large broadcast or allgather by measured rates (coll/adapt.c adapt_pick):
 * every rank applies it to the same summed rates and call number, so it must
 * be a pure function; it tries both paths first, then takes single copy
 * only where it measured clearly faster, and tries the other path now and
 * then. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "coll/coll.h"

/* The first three calls measure: the tuner's row, single copy, the tuner's row again. */
static void test_first_calls_try_both(void** state) {
  (void)state;
  int trial = 0;
  assert_int_equal(adapt_pick(0, 0, 0, &trial), 0);
  assert_true(trial);
  assert_int_equal(adapt_pick(1, 5, 0, &trial), 1);
  assert_true(trial);
  assert_int_equal(adapt_pick(2, 5, 9, &trial), 0);
  assert_true(trial);
}

/* Single copy wins only by a clear margin; ties and small leads keep the tuner's row. */
static void test_margin(void** state) {
  (void)state;
  int trial = 0;
  assert_int_equal(adapt_pick(3, 10, 10, &trial), 0);
  assert_false(trial);
  assert_int_equal(adapt_pick(3, 10, 12, &trial), 0);
  assert_int_equal(adapt_pick(3, 10, 14, &trial), 1);
  assert_false(trial);
  assert_int_equal(adapt_pick(5, 2, 7, &trial), 1); /* a slow stretch: 3.5x */
  assert_int_equal(adapt_pick(5, 7, 2, &trial), 0);
}

/* On single copy the tuner's row is tried every ADAPT_EXPLORE calls; on the
 * tuner's row single copy is tried four times as seldom; nothing else is a trial. */
static void test_trials(void** state) {
  (void)state;
  int on_cma = 0, on_plan = 0, trial = 0;
  for (uint32_t c = 3; c < 3 + 64 * ADAPT_EXPLORE; c++) {
    int use = adapt_pick(c, 2, 7, &trial);
    assert_int_equal(use, trial ? 0 : 1);
    on_cma += trial;
    use = adapt_pick(c, 7, 2, &trial);
    assert_int_equal(use, trial ? 1 : 0);
    on_plan += trial;
  }
  assert_int_equal(on_cma, 64);
  assert_int_equal(on_plan, 16);
  assert_int_equal(adapt_pick(ADAPT_EXPLORE, 2, 7, &trial), 0);
  assert_true(trial);
  assert_int_equal(adapt_pick(4 * ADAPT_EXPLORE, 7, 2, &trial), 1);
  assert_true(trial);
  assert_int_equal(adapt_pick(ADAPT_EXPLORE, 7, 2, &trial), 0);
  assert_false(trial);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_first_calls_try_both),
      cmocka_unit_test(test_margin),
      cmocka_unit_test(test_trials),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
