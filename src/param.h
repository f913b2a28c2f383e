/* Environment variables: one table (params.def) gives every variable's name,
 * default and meaning; accessors here read the environment at call time so a
 * process can change it between communicators. Implemented in param.c. */
#ifndef COLLIE_PARAM_H
#define COLLIE_PARAM_H

#include <stdint.h>
#include <stdio.h>

enum param_id {
#define PARAM(id, def, module, doc) P_##id,
#include "params.def"
#undef PARAM
  P_COUNT
};

struct param_def {
  const char* name;
  const char* def;
  const char* module;
  const char* doc;
};

extern const struct param_def param_table[P_COUNT];

/* The variable's value, or its default when unset or empty (NULL if none). */
const char* param_str(enum param_id id);
/* Integer value; an unparsable or out-of-range value logs a WARN and yields
 * the default (clamped to [lo, hi]). */
int64_t param_int(enum param_id id, int64_t lo, int64_t hi);

/* Strict integer parse of a whole string (decimal, optional sign, surrounding
 * spaces allowed). Returns 0 on success, -1 otherwise. For tests too. */
int param_parse_int(const char* s, int64_t* out);

/* Writes docs/ENV.md's contents. */
void param_write_markdown(FILE* f);

#endif
