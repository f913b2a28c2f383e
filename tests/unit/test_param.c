/* Unit tests for the environment-variable table (src/param.c, params.def)
 * and the NCCL_DEBUG / NCCL_DEBUG_SUBSYS parsers (src/debug.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "debug.h"
#include "param.h"

/* ---- param_parse_int --------------------------------------------------------- */

static void test_parse_int_accepts(void** state) {
  (void)state;
  struct { const char* s; int64_t v; } ok[] = {
      {"42", 42},          {" -7 ", -7},       {"0", 0},   {"+5", 5},  {"\t12\t", 12},
      {"-0", 0},           {"120\n", 120},     {"007", 7},
      {"9223372036854775807", INT64_MAX},      {"-9223372036854775808", INT64_MIN},
  };
  for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
    int64_t v = -12345;
    if (param_parse_int(ok[i].s, &v) != 0) fail_msg("\"%s\" rejected", ok[i].s);
    if (v != ok[i].v) fail_msg("\"%s\" -> %lld, want %lld", ok[i].s, (long long)v, (long long)ok[i].v);
  }
}

static void test_parse_int_rejects(void** state) {
  (void)state;
  static const char* bad[] = {
      "", " ", "\t", "4x", "1e3", "99999999999999999999", "-99999999999999999999",
      "9223372036854775808", "0x10", "1.5", "- 3", "abc", "3 4", "--1", "+",
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    int64_t v = 777;
    if (param_parse_int(bad[i], &v) == 0) fail_msg("\"%s\" accepted as %lld", bad[i], (long long)v);
    assert_int_equal(v, 777); /* untouched on failure */
  }
  int64_t v = 777;
  assert_int_equal(param_parse_int(NULL, &v), -1);
  assert_int_equal(v, 777);
}

/* ---- param_int / param_str --------------------------------------------------- */

#define TIMEOUT_VAR "COLLIE_BOOTSTRAP_TIMEOUT"

static int unset_timeout(void** state) {
  (void)state;
  unsetenv(TIMEOUT_VAR);
  return 0;
}

static void test_param_int_default(void** state) {
  (void)state;
  assert_string_equal(param_table[P_COLLIE_BOOTSTRAP_TIMEOUT].name, TIMEOUT_VAR);
  assert_string_equal(param_table[P_COLLIE_BOOTSTRAP_TIMEOUT].def, "120");
  unsetenv(TIMEOUT_VAR);
  assert_int_equal(param_int(P_COLLIE_BOOTSTRAP_TIMEOUT, 1, 86400), 120);
  setenv(TIMEOUT_VAR, "", 1);
  assert_int_equal(param_int(P_COLLIE_BOOTSTRAP_TIMEOUT, 1, 86400), 120);
}

static void test_param_int_from_env(void** state) {
  (void)state;
  setenv(TIMEOUT_VAR, "30", 1);
  assert_int_equal(param_int(P_COLLIE_BOOTSTRAP_TIMEOUT, 1, 86400), 30);
  setenv(TIMEOUT_VAR, " 45 ", 1);
  assert_int_equal(param_int(P_COLLIE_BOOTSTRAP_TIMEOUT, 1, 86400), 45);
  /* Bounds are inclusive. */
  setenv(TIMEOUT_VAR, "1", 1);
  assert_int_equal(param_int(P_COLLIE_BOOTSTRAP_TIMEOUT, 1, 86400), 1);
  setenv(TIMEOUT_VAR, "86400", 1);
  assert_int_equal(param_int(P_COLLIE_BOOTSTRAP_TIMEOUT, 1, 86400), 86400);
  /* Read at call time: a change is seen immediately. */
  setenv(TIMEOUT_VAR, "7", 1);
  assert_int_equal(param_int(P_COLLIE_BOOTSTRAP_TIMEOUT, 1, 86400), 7);
}

static void test_param_int_falls_back(void** state) {
  (void)state;
  static const char* bad[] = {"abc", "12x", "1e3", "0", "-5", "86401", "99999999999999999999", " "};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    setenv(TIMEOUT_VAR, bad[i], 1);
    int64_t v = param_int(P_COLLIE_BOOTSTRAP_TIMEOUT, 1, 86400);
    if (v != 120) fail_msg("%s=\"%s\" -> %lld, want default 120", TIMEOUT_VAR, bad[i], (long long)v);
  }
}

static void test_param_int_default_clamped(void** state) {
  (void)state;
  unsetenv(TIMEOUT_VAR);
  assert_int_equal(param_int(P_COLLIE_BOOTSTRAP_TIMEOUT, 1, 100), 100);
  assert_int_equal(param_int(P_COLLIE_BOOTSTRAP_TIMEOUT, 200, 300), 200);
  /* An out-of-range value falls back to the clamped default, not the raw one. */
  setenv(TIMEOUT_VAR, "500", 1);
  assert_int_equal(param_int(P_COLLIE_BOOTSTRAP_TIMEOUT, 1, 100), 100);
  setenv(TIMEOUT_VAR, "junk", 1);
  assert_int_equal(param_int(P_COLLIE_BOOTSTRAP_TIMEOUT, 200, 300), 200);
  /* A NULL default counts as 0, clamped. */
  unsetenv("COLLIE_RANK");
  assert_null(param_table[P_COLLIE_RANK].def);
  assert_int_equal(param_int(P_COLLIE_RANK, -1, 1000), 0);
  assert_int_equal(param_int(P_COLLIE_RANK, 3, 1000), 3);
}

static void test_param_str(void** state) {
  (void)state;
  unsetenv(TIMEOUT_VAR);
  assert_string_equal(param_str(P_COLLIE_BOOTSTRAP_TIMEOUT), "120");
  setenv(TIMEOUT_VAR, "", 1);
  assert_string_equal(param_str(P_COLLIE_BOOTSTRAP_TIMEOUT), "120");
  setenv(TIMEOUT_VAR, "abc", 1);
  assert_string_equal(param_str(P_COLLIE_BOOTSTRAP_TIMEOUT), "abc");

  /* No default: NULL when unset or empty. */
  const char* saved = getenv("NCCL_SOCKET_IFNAME");
  char* copy = saved ? strdup(saved) : NULL;
  unsetenv("NCCL_SOCKET_IFNAME");
  assert_null(param_str(P_NCCL_SOCKET_IFNAME));
  setenv("NCCL_SOCKET_IFNAME", "", 1);
  assert_null(param_str(P_NCCL_SOCKET_IFNAME));
  setenv("NCCL_SOCKET_IFNAME", "=eth0", 1);
  assert_string_equal(param_str(P_NCCL_SOCKET_IFNAME), "=eth0");
  if (copy) setenv("NCCL_SOCKET_IFNAME", copy, 1);
  else unsetenv("NCCL_SOCKET_IFNAME");
  free(copy);
}

/* ---- the table --------------------------------------------------------------- */

static void test_table(void** state) {
  (void)state;
  assert_true(P_COUNT > 0);
  assert_int_equal(sizeof(param_table) / sizeof(param_table[0]), P_COUNT);
  for (int i = 0; i < P_COUNT; i++) {
    const struct param_def* p = &param_table[i];
    if (!p->name) fail_msg("entry %d has no name", i);
    assert_true(strlen(p->name) > 0);
    if (!p->doc || !*p->doc) fail_msg("%s has no doc", p->name);
    if (!p->module || !*p->module) fail_msg("%s has no module", p->name);
    if (p->def) {
      /* Defaults are never "", which param_str would treat as unset. */
      if (!*p->def) fail_msg("%s has an empty default", p->name);
    }
    for (int j = 0; j < i; j++)
      if (strcmp(param_table[j].name, p->name) == 0) fail_msg("%s listed twice", p->name);
  }
  /* The enum and the names agree. */
  assert_string_equal(param_table[P_NCCL_DEBUG].name, "NCCL_DEBUG");
  assert_string_equal(param_table[P_NCCL_SOCKET_IFNAME].name, "NCCL_SOCKET_IFNAME");
  assert_string_equal(param_table[P_COLLIE_BOOTSTRAP_TIMEOUT].name, "COLLIE_BOOTSTRAP_TIMEOUT");
}

static void test_markdown_lists_every_variable(void** state) {
  (void)state;
  FILE* f = tmpfile();
  assert_non_null(f);
  param_write_markdown(f);
  long size = ftell(f);
  assert_true(size > 0);
  rewind(f);
  char* text = malloc((size_t)size + 1);
  assert_non_null(text);
  assert_int_equal(fread(text, 1, (size_t)size, f), (size_t)size);
  text[size] = '\0';
  fclose(f);
  assert_non_null(strstr(text, "# Environment variables"));
  for (int i = 0; i < P_COUNT; i++) {
    char needle[128];
    snprintf(needle, sizeof(needle), "| `%s` |", param_table[i].name);
    if (!strstr(text, needle)) fail_msg("%s missing from the markdown", param_table[i].name);
    /* Listed exactly once. */
    const char* first = strstr(text, needle);
    if (strstr(first + 1, needle)) fail_msg("%s listed twice in the markdown", param_table[i].name);
    if (param_table[i].def) {
      snprintf(needle, sizeof(needle), "| `%s` | `%s` |", param_table[i].name, param_table[i].def);
      if (!strstr(text, needle)) fail_msg("%s: default not shown", param_table[i].name);
    }
  }
  free(text);
}

/* ---- logging parsers ------------------------------------------------------- */

static void test_log_parse_level(void** state) {
  (void)state;
  struct { const char* s; int v; } cases[] = {
      {"NONE", LOG_NONE},   {"VERSION", LOG_VERSION}, {"WARN", LOG_WARN},   {"INFO", LOG_INFO},
      {"ABORT", LOG_ABORT}, {"TRACE", LOG_TRACE},     {"none", LOG_NONE},   {"Version", LOG_VERSION},
      {"warn", LOG_WARN},   {"iNfO", LOG_INFO},       {"abort", LOG_ABORT}, {"trace", LOG_TRACE},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) assert_int_equal(log_parse_level(cases[i].s), cases[i].v);
  static const char* junk[] = {"", "WARNING", "INF", "3", "DEBUG", "TRACEX", "xyz"};
  for (size_t i = 0; i < sizeof(junk) / sizeof(junk[0]); i++)
    if (log_parse_level(junk[i]) != -1) fail_msg("\"%s\" parsed as a level", junk[i]);
  assert_int_equal(log_parse_level(NULL), -1);
}

static void test_log_parse_subsys(void** state) {
  (void)state;
  assert_true(log_parse_subsys("INIT") == (uint64_t)LOG_INIT);
  assert_true(log_parse_subsys("init") == (uint64_t)LOG_INIT);
  assert_true(log_parse_subsys("INIT,NET") == ((uint64_t)LOG_INIT | LOG_NET));
  assert_true(log_parse_subsys("INIT, NET") == ((uint64_t)LOG_INIT | LOG_NET));
  assert_true(log_parse_subsys("INIT,  NET,   BOOTSTRAP") == ((uint64_t)LOG_INIT | LOG_NET | LOG_BOOTSTRAP));
  assert_true(log_parse_subsys("^INIT") == ~(uint64_t)LOG_INIT);
  assert_true(log_parse_subsys("^INIT,NET") == ~((uint64_t)LOG_INIT | LOG_NET));
  assert_true(log_parse_subsys("ALL") == ~(uint64_t)0);
  assert_true(log_parse_subsys("all") == ~(uint64_t)0);
  assert_true(log_parse_subsys("^ALL") == 0);
  /* Unknown names are ignored, known ones around them still count. */
  assert_true(log_parse_subsys("FOO") == 0);
  assert_true(log_parse_subsys("FOO,NET,BAR") == (uint64_t)LOG_NET);
  assert_true(log_parse_subsys("^FOO") == ~(uint64_t)0);
  assert_true(log_parse_subsys("") == 0);
  assert_true(log_parse_subsys(",,INIT,,") == (uint64_t)LOG_INIT);
  assert_true(log_parse_subsys(NULL) == 0);
  /* Every documented name maps to its bit. */
  struct { const char* s; uint64_t bit; } names[] = {
      {"INIT", LOG_INIT},   {"COLL", LOG_COLL},     {"P2P", LOG_P2P},         {"SHM", LOG_SHM},
      {"NET", LOG_NET},     {"GRAPH", LOG_GRAPH},   {"TUNING", LOG_TUNING},   {"ENV", LOG_ENV},
      {"ALLOC", LOG_ALLOC}, {"CALL", LOG_CALL},     {"PROXY", LOG_PROXY},     {"NVLS", LOG_NVLS},
      {"BOOTSTRAP", LOG_BOOTSTRAP}, {"REG", LOG_REG}, {"PROFILE", LOG_PROFILE}, {"RAS", LOG_RAS},
  };
  uint64_t all = 0;
  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
    assert_true(log_parse_subsys(names[i].s) == names[i].bit);
    assert_true((all & names[i].bit) == 0); /* distinct bits */
    all |= names[i].bit;
  }
  /* The default from params.def parses to exactly its three bits. */
  assert_true(log_parse_subsys(param_table[P_NCCL_DEBUG_SUBSYS].def) ==
              ((uint64_t)LOG_INIT | LOG_BOOTSTRAP | LOG_ENV));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_parse_int_accepts),
      cmocka_unit_test(test_parse_int_rejects),
      cmocka_unit_test_teardown(test_param_int_default, unset_timeout),
      cmocka_unit_test_teardown(test_param_int_from_env, unset_timeout),
      cmocka_unit_test_teardown(test_param_int_falls_back, unset_timeout),
      cmocka_unit_test_teardown(test_param_int_default_clamped, unset_timeout),
      cmocka_unit_test_teardown(test_param_str, unset_timeout),
      cmocka_unit_test(test_table),
      cmocka_unit_test(test_markdown_lists_every_variable),
      cmocka_unit_test(test_log_parse_level),
      cmocka_unit_test(test_log_parse_subsys),
  };
  return cmocka_run_group_tests_name("param", tests, NULL, NULL);
}
