/* Environment-variable table and accessors; see param.h. The table itself is
 * params.def, shared with the docs generator (tools/collie_info.c). */
#include "param.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "debug.h"

const struct param_def param_table[P_COUNT] = {
#define PARAM(id, def, module, doc) {#id, def, module, doc},
#include "params.def"
#undef PARAM
};

const char* param_str(enum param_id id) {
  const char* v = getenv(param_table[id].name);
  if (v && *v) return v;
  return param_table[id].def;
}

int param_parse_int(const char* s, int64_t* out) {
  if (!s) return -1;
  while (*s == ' ' || *s == '\t') s++;
  if (!*s) return -1;
  errno = 0;
  char* end;
  long long v = strtoll(s, &end, 10);
  if (errno || end == s) return -1;
  while (*end == ' ' || *end == '\t' || *end == '\n') end++;
  if (*end) return -1;
  *out = v;
  return 0;
}

int64_t param_int(enum param_id id, int64_t lo, int64_t hi) {
  const struct param_def* p = &param_table[id];
  int64_t def = 0;
  if (p->def) param_parse_int(p->def, &def);
  if (def < lo) def = lo;
  if (def > hi) def = hi;
  const char* v = getenv(p->name);
  if (!v || !*v) return def;
  int64_t x;
  if (param_parse_int(v, &x) != 0 || x < lo || x > hi) {
    WARN("%s=\"%s\" is not an integer in [%lld, %lld]; using %lld", p->name, v, (long long)lo,
         (long long)hi, (long long)def);
    return def;
  }
  INFO(LOG_ENV, "%s set by environment to %lld", p->name, (long long)x);
  return x;
}

void param_write_markdown(FILE* f) {
  fprintf(f,
          "# Environment variables\n\n"
          "Generated from `src/params.def` by `collie-info --env-markdown`; do not edit by hand\n"
          "(the test suite checks that this file matches the table).\n\n");
  const char* modules[P_COUNT];
  int nmod = 0;
  for (int i = 0; i < P_COUNT; i++) {
    int seen = 0;
    for (int j = 0; j < nmod; j++)
      if (strcmp(modules[j], param_table[i].module) == 0) seen = 1;
    if (!seen) modules[nmod++] = param_table[i].module;
  }
  for (int m = 0; m < nmod; m++) {
    fprintf(f, "## %s\n\n| variable | default | meaning |\n|---|---|---|\n", modules[m]);
    for (int i = 0; i < P_COUNT; i++) {
      const struct param_def* p = &param_table[i];
      if (strcmp(p->module, modules[m]) != 0) continue;
      fprintf(f, "| `%s` | %s%s%s | %s |\n", p->name, p->def ? "`" : "", p->def ? p->def : "(unset)",
              p->def ? "`" : "", p->doc);
    }
    fprintf(f, "\n");
  }
}
