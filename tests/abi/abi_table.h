/* Shared by the ABI tests: a table of named facts (sizes, offsets, constant
 * values, type signatures) that one translation unit records against
 * collie's nccl.h and another against NVIDIA's, and the comparison the test
 * mains run over the two tables. Used by layout_*.c, signature_*.cpp and the
 * two test mains; includes no nccl.h itself. */
#ifndef COLLIE_TESTS_ABI_TABLE_H
#define COLLIE_TESTS_ABI_TABLE_H

#include <stdio.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One fact. Numeric facts use value; string facts (NCCL_SUFFIX, type
 * signatures) use str and leave value 0. */
struct abi_entry {
  const char* name;
  long long value;
  const char* str;
};

#define ABI_MAX_ENTRIES 1024

/* Each fills out[0..max) and returns the count, or -1 if max is too small. */
int abi_layout_ours(struct abi_entry* out, int max);
int abi_layout_nvidia(struct abi_entry* out, int max);
int abi_signature_ours(struct abi_entry* out, int max);
int abi_signature_nvidia(struct abi_entry* out, int max);

/* Compares two tables entry by entry; prints each difference and returns how
 * many there were (a length mismatch counts as one more). */
static inline int abi_compare(const struct abi_entry* ours, int n_ours,
                              const struct abi_entry* nv, int n_nv) {
  int bad = 0;
  int n = n_ours < n_nv ? n_ours : n_nv;
  for (int i = 0; i < n; i++) {
    const struct abi_entry* a = &ours[i];
    const struct abi_entry* b = &nv[i];
    if (strcmp(a->name, b->name) != 0) {
      /* Both tables come from one list, so this means a build mix-up. */
      printf("MISMATCH entry %d: names differ (collie '%s', nvidia '%s')\n", i, a->name, b->name);
      bad++;
      continue;
    }
    int same_str = (a->str == NULL && b->str == NULL) ||
                   (a->str != NULL && b->str != NULL && strcmp(a->str, b->str) == 0);
    if (a->value != b->value || !same_str) {
      if (a->str != NULL || b->str != NULL)
        printf("MISMATCH %s: collie \"%s\", nvidia \"%s\"\n", a->name, a->str ? a->str : "(null)",
               b->str ? b->str : "(null)");
      else
        printf("MISMATCH %s: collie %lld (0x%llx), nvidia %lld (0x%llx)\n", a->name, a->value,
               (unsigned long long)a->value, b->value, (unsigned long long)b->value);
      bad++;
    }
  }
  if (n_ours != n_nv) {
    printf("MISMATCH table length: collie %d entries, nvidia %d\n", n_ours, n_nv);
    bad++;
  }
  return bad;
}

#ifdef __cplusplus
}
#endif

#endif
