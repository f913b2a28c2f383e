/* Unit test of the placement planner (src/graph/bind.c: bind_plan,
 * bind_cpulist, bind_cpulist_parse, bind_spread_target) on made-up machines -- two NUMA nodes of
 * 8 cores with 2 hardware threads each, unequal nodes, one node -- since the
 * machines the suite runs on rarely have several nodes. Prints each failed
 * check; exits 1 if any failed. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph/bind.h"

static int failures;

#define CHECK(cond, ...)                             \
  do {                                               \
    if (!(cond)) {                                   \
      printf("not ok: %s:%d: ", __FILE__, __LINE__); \
      printf(__VA_ARGS__);                           \
      printf("\n");                                  \
      failures++;                                    \
    }                                                \
  } while (0)

/* nodes[i] cores on node i, `smt` threads per core. CPU numbering as Linux
 * does on most x86 machines: the first thread of every core first, then the
 * second threads (core c's threads are c, c + ncores, ...). */
static void make_topo(struct bind_topo* t, const int* nodes, int nnodes, int smt) {
  int ncores = 0;
  for (int i = 0; i < nnodes; i++) ncores += nodes[i];
  memset(t, 0, sizeof(*t));
  t->cores = calloc((size_t)ncores, sizeof(*t->cores));
  t->pus = calloc((size_t)(ncores * smt), sizeof(*t->pus));
  t->nnodes = nnodes;
  for (int i = 0, c = 0; i < nnodes; i++) {
    for (int k = 0; k < nodes[i]; k++, c++) {
      struct bind_unit* u = &t->cores[t->ncores++];
      u->node = i;
      CPU_ZERO(&u->cpus);
      for (int s = 0; s < smt; s++) {
        CPU_SET(c + s * ncores, &u->cpus);
        struct bind_unit* p = &t->pus[t->npus++];
        p->node = i;
        CPU_ZERO(&p->cpus);
        CPU_SET(c + s * ncores, &p->cpus);
      }
    }
  }
}

static const char* list(const cpu_set_t* s) {
  static char buf[4][256];
  static int k;
  k = (k + 1) % 4;
  bind_cpulist(s, buf[k], sizeof(buf[k]));
  return buf[k];
}

/* The node (or -1 if several) whose cores hold every CPU of s. */
static int node_of(const struct bind_topo* t, const cpu_set_t* s) {
  int node = -2;
  for (int i = 0; i < t->ncores; i++) {
    cpu_set_t x;
    CPU_AND(&x, &t->cores[i].cpus, s);
    if (CPU_COUNT(&x) == 0) continue;
    if (node == -2) node = t->cores[i].node;
    else if (node != t->cores[i].node) return -1;
  }
  return node;
}

/* Every rank of n gets a plan; the sets are disjoint, of equal size, and
 * (when `one_node`) each inside one NUMA node. */
static void check_disjoint(const struct bind_topo* t, enum bind_mode m, int n, int want_cpus, int one_node) {
  cpu_set_t seen, s;
  char why[128];
  CPU_ZERO(&seen);
  for (int r = 0; r < n; r++) {
    int node;
    int rc = bind_plan(t, m, r, n, &s, &node, why, sizeof(why));
    CHECK(rc == 0, "%s n=%d rank %d: not placed: %s", bind_mode_name(m), n, r, why);
    if (rc != 0) return;
    cpu_set_t x;
    CPU_AND(&x, &seen, &s);
    CHECK(CPU_COUNT(&x) == 0, "%s n=%d rank %d: %s overlaps %s", bind_mode_name(m), n, r, list(&s), list(&seen));
    CHECK(want_cpus == 0 || CPU_COUNT(&s) == want_cpus, "%s n=%d rank %d: %s has %d CPUs, want %d", bind_mode_name(m),
          n, r, list(&s), CPU_COUNT(&s), want_cpus);
    CHECK(!one_node || node_of(t, &s) == node, "%s n=%d rank %d: %s not inside node %d", bind_mode_name(m), n, r,
          list(&s), node);
    CPU_OR(&seen, &seen, &s);
  }
}

static void expect(const struct bind_topo* t, enum bind_mode m, int r, int n, const char* want) {
  cpu_set_t s;
  int node;
  char why[128];
  int rc = bind_plan(t, m, r, n, &s, &node, why, sizeof(why));
  CHECK(rc == 0 && strcmp(list(&s), want) == 0, "%s rank %d of %d: got %s (rc %d %s), want %s", bind_mode_name(m), r, n,
        rc == 0 ? list(&s) : "-", rc, rc == 0 ? "" : why, want);
}

static void expect_refused(const struct bind_topo* t, enum bind_mode m, int n) {
  cpu_set_t s;
  int node;
  char why[128] = "";
  int rc = bind_plan(t, m, 0, n, &s, &node, why, sizeof(why));
  CHECK(rc == 1 && why[0] != '\0', "%s with %d ranks: rc %d, want 1 with a reason", bind_mode_name(m), n, rc);
}

/* bind_move_off_cpu (COLLIE_UNPAIR's move): on a real CPU of this machine,
 * the thread ends up on another CPU and its mask is the one it had. */
static void check_move_off(void) {
  cpu_set_t all, one, now;
  if (sched_getaffinity(0, sizeof(all), &all) != 0 || CPU_COUNT(&all) < 2) {
    printf("# bind_move_off_cpu: skipped (this process may run on fewer than 2 CPUs)\n");
    return;
  }
  int first = -1;
  for (int c = 0; c < CPU_SETSIZE && first < 0; c++)
    if (CPU_ISSET(c, &all)) first = c;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  CHECK(sched_setaffinity(0, sizeof(one), &one) == 0 && sched_getcpu() == first, "pin to CPU %d", first);
  CHECK(sched_setaffinity(0, sizeof(all), &all) == 0, "unpin");
  int at = sched_getcpu();
  CHECK(bind_move_off_cpu(at) == 1, "not moved off CPU %d", at);
  CHECK(sched_getcpu() != at, "still on CPU %d", at);
  CHECK(sched_getaffinity(0, sizeof(now), &now) == 0 && CPU_EQUAL(&now, &all), "mask changed: %s", list(&now));
  /* Nowhere else to go: no move, mask untouched. */
  CHECK(sched_setaffinity(0, sizeof(one), &one) == 0, "pin again");
  CHECK(bind_move_off_cpu(first) == 0, "moved although pinned to CPU %d", first);
  CHECK(sched_getaffinity(0, sizeof(now), &now) == 0 && CPU_EQUAL(&now, &one), "pinned mask changed: %s", list(&now));
  /* A CPU the thread does not run on and may not use: nothing happens. */
  CHECK(bind_move_off_cpu(CPU_SETSIZE) == 0 && bind_move_off_cpu(-1) == 0, "invalid CPU accepted");
  CHECK(sched_setaffinity(0, sizeof(all), &all) == 0, "restore");
}

/* bind_spread_target (COLLIE_SPREAD's choice) on made-up tables. */
static void expect_spread_at(const char* table, int me, int pos, const char* mask, int want) {
  int32_t cpu_of[16];
  int n = 0;
  for (const char* p = table; *p && n < 16; p++) cpu_of[n++] = *p == '?' ? -1 : *p - '0';
  cpu_set_t m;
  CHECK(bind_cpulist_parse(mask, &m) == 0, "mask %s", mask);
  int got = bind_spread_target(cpu_of, n, me, pos, &m);
  CHECK(got == want, "ranks on CPUs %s, rank %d (ring place %d), mask %s: target %d, want %d", table, me, pos, mask,
        got, want);
}
static void expect_spread(const char* table, int me, const char* mask, int want) {
  expect_spread_at(table, me, -1, mask, want);
}

static void check_spread(void) {
  /* The table: rank i's CPU is the i-th digit. 8 ranks, 5 on CPU 0 and 3
   * on CPU 1: the highest of the 5 moves to CPU 1, nobody else. */
  expect_spread("00110100", 7, "0-1", 1);
  expect_spread("00110100", 6, "0-1", -1);
  expect_spread("00110100", 5, "0-1", -1);
  /* 4 and 4, 2 and 2, 2 and 1: balanced enough. */
  expect_spread("00001111", 3, "0-1", -1);
  expect_spread("00001111", 7, "0-1", -1);
  expect_spread("0011", 3, "0-1", -1);
  expect_spread("001", 1, "0-1", -1);
  /* Every rank on one CPU; 3 and 1; 3 and 0. */
  expect_spread("00000000", 7, "0-1", 1);
  expect_spread("00000000", 3, "0-1", -1);
  expect_spread("0001", 2, "0-1", 1);
  expect_spread("0001", 3, "0-1", -1);
  expect_spread("000", 2, "0-1", 1);
  /* The least crowded CPU of the mask, the lowest of equals. */
  expect_spread("000000", 5, "0-2", 1);
  expect_spread("000011", 3, "0-2", 2);
  expect_spread("000022", 3, "0-2", 1);
  /* CPUs outside the mask are never targets; a rank outside it stays. */
  expect_spread("0000", 3, "0,2", 2);
  expect_spread("0000", 3, "0", -1);
  expect_spread("5555", 3, "0-1", -1);
  /* A rank that has not run a call yet: nobody decides. One rank: nothing. */
  expect_spread("000?", 2, "0-1", -1);
  expect_spread("0", 0, "0-1", -1);
  /* Two ranks a CPU: the ring place decides (place mod CPUs, counted in
   * the mask), so ring neighbours sit on different CPUs. 4 ranks 2 and 2
   * but neighbours together (0 1 | 2 3): ranks 1 and 2 go across, 0 and 3
   * stay; already alternating: nobody moves. */
  expect_spread_at("0011", 0, 0, "0-1", -1);
  expect_spread_at("0011", 1, 1, "0-1", 1);
  expect_spread_at("0011", 2, 2, "0-1", 0);
  expect_spread_at("0011", 3, 3, "0-1", -1);
  expect_spread_at("0101", 1, 1, "0-1", -1);
  expect_spread_at("0101", 2, 2, "0-1", -1);
  /* The place, not the rank number; the mask's CPUs in order. */
  expect_spread_at("0011", 3, 1, "0-1", -1);
  expect_spread_at("0011", 0, 3, "0-1", 1);
  expect_spread_at("2255", 1, 1, "2,5", 5);
  expect_spread_at("2255", 2, 0, "2,5", 2);
  /* 6 ranks on 3 CPUs; a rank whose CPU is not known yet: nobody decides. */
  expect_spread_at("000111", 2, 2, "0-2", 2);
  expect_spread_at("000111", 3, 3, "0-2", 0);
  expect_spread_at("000111", 4, 4, "0-2", -1);
  expect_spread_at("00?1", 1, 1, "0-1", -1);
  /* Not two a CPU (3 or 8 ranks on 2): the count rule, whatever the place. */
  expect_spread_at("001", 1, 1, "0-1", -1);
  expect_spread_at("00001111", 3, 3, "0-1", -1);
  expect_spread_at("00110100", 7, 7, "0-1", 1);
}

/* bind_move_to_cpu: the thread ends up on that CPU with the mask it had;
 * a CPU outside the mask moves nothing. bind_runnable_tasks counts at least
 * the caller. */
static void check_move_to(void) {
  cpu_set_t all, now;
  CHECK(bind_runnable_tasks() >= 1, "runnable tasks %d", bind_runnable_tasks());
  if (sched_getaffinity(0, sizeof(all), &all) != 0 || CPU_COUNT(&all) < 2) {
    printf("# bind_move_to_cpu: skipped (this process may run on fewer than 2 CPUs)\n");
    return;
  }
  for (int c = 0; c < CPU_SETSIZE; c++) {
    if (!CPU_ISSET(c, &all)) continue;
    CHECK(bind_move_to_cpu(c) == 1 && sched_getcpu() == c, "not moved to CPU %d", c);
    CHECK(sched_getaffinity(0, sizeof(now), &now) == 0 && CPU_EQUAL(&now, &all), "mask changed: %s", list(&now));
  }
  int outside = -1;
  for (int c = 0; c < CPU_SETSIZE && outside < 0; c++)
    if (!CPU_ISSET(c, &all)) outside = c;
  if (outside >= 0) CHECK(bind_move_to_cpu(outside) == 0, "moved to CPU %d outside the mask", outside);
  CHECK(bind_move_to_cpu(-1) == 0 && bind_move_to_cpu(CPU_SETSIZE) == 0, "invalid CPU accepted");
  CHECK(sched_getaffinity(0, sizeof(now), &now) == 0 && CPU_EQUAL(&now, &all), "mask changed: %s", list(&now));
}

int main(void) {
  struct bind_topo t;

  /* Two nodes of 8 cores, 2 threads each: CPUs 0-7,16-23 on node 0. */
  static const int two[] = {8, 8};
  make_topo(&t, two, 2, 2);
  expect(&t, BIND_SHARE, 0, 2, "0-7,16-23");
  expect(&t, BIND_SHARE, 1, 2, "8-15,24-31");
  /* 3 ranks: shares of 4 cores that each fit in a node beat 5 across both. */
  expect(&t, BIND_SHARE, 0, 3, "0-3,16-19");
  expect(&t, BIND_SHARE, 1, 3, "4-7,20-23");
  expect(&t, BIND_SHARE, 2, 3, "8-11,24-27");
  expect(&t, BIND_CORE, 0, 2, "0,16");
  expect(&t, BIND_CORE, 1, 2, "8,24");
  expect(&t, BIND_HWTHREAD, 1, 2, "8");
  expect(&t, BIND_NUMA, 0, 3, "0-7,16-23");
  expect(&t, BIND_NUMA, 2, 3, "8-15,24-31");
  for (int n = 1; n <= 16; n++) {
    int s = 16 / n;
    while (s > 1 && (8 / s) * 2 < n) s--;
    check_disjoint(&t, BIND_SHARE, n, 2 * s, 1);
    check_disjoint(&t, BIND_CORE, n, 2, 1);
  }
  check_disjoint(&t, BIND_HWTHREAD, 32, 1, 1);
  expect_refused(&t, BIND_SHARE, 17);
  expect_refused(&t, BIND_CORE, 17);
  expect_refused(&t, BIND_HWTHREAD, 33);
  /* NUMA binding never refuses: more ranks than cores share the nodes. */
  expect(&t, BIND_NUMA, 33, 40, "8-15,24-31");
  bind_topo_free(&t);

  /* Unequal nodes (4 and 12 cores, no SMT). */
  static const int uneven[] = {4, 12};
  make_topo(&t, uneven, 2, 1);
  for (int n = 1; n <= 16; n++) check_disjoint(&t, BIND_SHARE, n, 0, 1);
  expect_refused(&t, BIND_CORE, 17);
  bind_topo_free(&t);

  /* One node of 2 cores: this suite's usual machine. */
  static const int small[] = {2};
  make_topo(&t, small, 1, 1);
  expect(&t, BIND_SHARE, 0, 1, "0-1");
  expect(&t, BIND_SHARE, 1, 2, "1");
  expect_refused(&t, BIND_SHARE, 3);
  expect_refused(&t, BIND_NONE, 1);
  bind_topo_free(&t);

  /* CPU lists both ways. */
  cpu_set_t s;
  CHECK(bind_cpulist_parse("0-3,8,10-11\n", &s) == 0 && strcmp(list(&s), "0-3,8,10-11") == 0, "parse 0-3,8,10-11");
  static const char* const bad[] = {"", "3-1", "1,", "a", "1-", "-1", "1,,2", "99999"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
    CHECK(bind_cpulist_parse(bad[i], &s) != 0, "'%s' accepted", bad[i]);
  enum bind_mode m;
  CHECK(bind_mode_parse("numa", &m) == 0 && m == BIND_NUMA, "numa");
  CHECK(bind_mode_parse("socket", &m) != 0, "socket accepted");

  check_move_off();
  check_spread();
  check_move_to();

  printf("%s: %d failure(s)\n", failures ? "FAIL" : "PASS", failures);
  return failures ? 1 : 0;
}
