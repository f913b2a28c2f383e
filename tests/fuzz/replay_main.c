/* Replays a fuzz corpus without libFuzzer: runs LLVMFuzzerTestOneInput on
 * every file named on the command line or found in a directory named there
 * (one level). Linked with each fuzz target for the ctest fuzz.replay_*;
 * fails when nothing was replayed, so a missing corpus is noticed, and when
 * no input of a replayed directory reached the target's accepting path
 * (fuzz_reached; a single file, such as a crash input, need not). */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz_common.h"

static int run_file(const char* path) {
  FILE* f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "replay: cannot open %s\n", path);
    return -1;
  }
  uint8_t* buf = NULL;
  size_t n = 0, cap = 0;
  for (;;) {
    if (n == cap) {
      cap = cap ? cap * 2 : 4096;
      uint8_t* nb = realloc(buf, cap);
      if (!nb) break;
      buf = nb;
    }
    size_t k = fread(buf + n, 1, cap - n, f);
    if (k == 0) break;
    n += k;
  }
  fclose(f);
  /* An exact-size copy, so ASan catches a read one byte past the input. */
  uint8_t* exact = malloc(n ? n : 1);
  if (exact && n) memcpy(exact, buf, n);
  free(buf);
  if (!exact) return -1;
  LLVMFuzzerTestOneInput(exact, n);
  free(exact);
  return 0;
}

static int cmp(const void* a, const void* b) { return strcmp(*(char* const*)a, *(char* const*)b); }

int main(int argc, char** argv) {
  int files = 0, errors = 0, dirs = 0;
  for (int i = 1; i < argc; i++) {
    struct stat st;
    if (stat(argv[i], &st) != 0) {
      fprintf(stderr, "replay: %s does not exist\n", argv[i]);
      errors++;
      continue;
    }
    if (!S_ISDIR(st.st_mode)) {
      errors += run_file(argv[i]) != 0;
      files++;
      continue;
    }
    DIR* dir = opendir(argv[i]);
    if (!dir) {
      errors++;
      continue;
    }
    dirs++;
    char** names = NULL;
    size_t nn = 0;
    struct dirent* e;
    while ((e = readdir(dir)) != NULL) {
      if (e->d_name[0] == '.') continue;
      char** nb = realloc(names, sizeof(*names) * (nn + 1));
      if (!nb) break;
      names = nb;
      size_t len = strlen(argv[i]) + strlen(e->d_name) + 2;
      names[nn] = malloc(len);
      if (!names[nn]) break;
      snprintf(names[nn], len, "%s/%s", argv[i], e->d_name);
      nn++;
    }
    closedir(dir);
    qsort(names, nn, sizeof(*names), cmp);
    for (size_t k = 0; k < nn; k++) {
      errors += run_file(names[k]) != 0;
      files++;
      free(names[k]);
    }
    free(names);
  }
  printf("replayed %d inputs, %d unreadable, %d reached the accepting path\n", files, errors, fuzz_reached);
  return files > 0 && errors == 0 && (dirs == 0 || fuzz_reached > 0) ? 0 : 1;
}
