/* Unit tests for the shared-memory segment helper's prefault
 * (transport/shmseg.c shmseg_prefault): every page of the range becomes
 * resident, nothing in it changes (a peer may already have written there),
 * and the two mappings of one segment (creator and opener, as a shm
 * connector's two ends have) still see each other's writes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "transport/shmseg.h"

#define PAGES 37 /* an odd count: no power of two hides an off-by-one */

static size_t page_size(void) { return (size_t)sysconf(_SC_PAGESIZE); }

/* Pages of [base, base+len) resident in memory. */
static size_t resident(void* base, size_t len) {
  size_t n = (len + page_size() - 1) / page_size(), count = 0;
  unsigned char vec[PAGES];
  assert_true(n <= PAGES);
  assert_int_equal(mincore(base, len, vec), 0);
  for (size_t i = 0; i < n; i++) count += vec[i] & 1;
  return count;
}

static void test_fresh_segment_becomes_resident_and_stays_zero(void** state) {
  (void)state;
  size_t len = PAGES * page_size();
  struct shm_seg s;
  assert_int_equal(shmseg_create(len, "test", &s), ncclSuccess);
  assert_int_equal(resident(s.base, len), 0); /* a fresh memfd holds no pages */
  shmseg_prefault(s.base, len);
  assert_int_equal(resident(s.base, len), PAGES);
  for (size_t i = 0; i < len; i++)
    if (((unsigned char*)s.base)[i] != 0) fail_msg("byte %zu is %d after the prefault", i, ((unsigned char*)s.base)[i]);
  shmseg_free(&s);
}

static void test_contents_kept_and_mappings_shared(void** state) {
  (void)state;
  size_t len = PAGES * page_size();
  struct shm_seg mine, peer;
  assert_int_equal(shmseg_create(len, "test", &mine), ncclSuccess);
  unsigned char* a = mine.base;
  /* Only some pages written before: the prefault must keep them and fault the rest in. */
  for (size_t i = 0; i < len; i += 3 * page_size()) memset(a + i, (int)(i / page_size()) + 1, page_size());
  assert_int_equal(shmseg_open((int32_t)getpid(), mine.fd, len, 0, "test", &peer), ncclSuccess);
  shmseg_prefault(mine.base, len);
  shmseg_prefault(peer.base, len);
  const unsigned char* b = peer.base;
  for (size_t i = 0; i < len; i++) {
    size_t pg = i / page_size();
    int want = pg % 3 == 0 ? (int)pg + 1 : 0;
    if (a[i] != want || b[i] != want) fail_msg("byte %zu: %d / %d, want %d", i, a[i], b[i], want);
  }
  a[len - 1] = 0x5a; /* the last byte of the last page: written through one, read through the other */
  assert_int_equal(b[len - 1], 0x5a);
  shmseg_free(&peer);
  shmseg_free(&mine);
}

/* A length that ends inside a page: that page too, and nothing past it. */
static void test_partial_last_page(void** state) {
  (void)state;
  size_t len = PAGES * page_size();
  struct shm_seg s;
  assert_int_equal(shmseg_create(len, "test", &s), ncclSuccess);
  shmseg_prefault(s.base, 2 * page_size() + 1);
  assert_int_equal(resident(s.base, len), 3);
  shmseg_free(&s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fresh_segment_becomes_resident_and_stays_zero),
      cmocka_unit_test(test_contents_kept_and_mappings_shared),
      cmocka_unit_test(test_partial_last_page),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
