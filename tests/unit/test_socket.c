/* Unit tests for the bootstrap socket helpers (src/bootstrap/socket.c):
 * NCCL_SOCKET_IFNAME matching, address parsing and printing, loopback
 * detection, and a real listen/connect/send/recv exchange on 127.0.0.1. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bootstrap/socket.h"
#include "core.h"

/* ---- NCCL_SOCKET_IFNAME ------------------------------------------------------ */

static void test_ifname_empty_spec_matches_all(void** state) {
  (void)state;
  assert_int_equal(sock_ifname_match(NULL, "eth0"), 1);
  assert_int_equal(sock_ifname_match("", "eth0"), 1);
  assert_int_equal(sock_ifname_match(NULL, "lo"), 1);
  assert_int_equal(sock_ifname_match("", ""), 1);
}

static void test_ifname_prefix(void** state) {
  (void)state;
  assert_int_equal(sock_ifname_match("eth", "eth0"), 1);
  assert_int_equal(sock_ifname_match("eth", "eth10"), 1);
  assert_int_equal(sock_ifname_match("eth", "eth"), 1);
  assert_int_equal(sock_ifname_match("eth", "veth0"), 0);
  assert_int_equal(sock_ifname_match("eth", "et"), 0);
  assert_int_equal(sock_ifname_match("eth", "ib0"), 0);
  assert_int_equal(sock_ifname_match("eth0", "eth0"), 1);
  assert_int_equal(sock_ifname_match("eth0", "eth01"), 1); /* prefix, not exact */
}

static void test_ifname_list(void** state) {
  (void)state;
  assert_int_equal(sock_ifname_match("ib,eth", "ib0"), 1);
  assert_int_equal(sock_ifname_match("ib,eth", "eth3"), 1);
  assert_int_equal(sock_ifname_match("ib,eth", "lo"), 0);
  assert_int_equal(sock_ifname_match("ib,eth", "veth1"), 0);
  assert_int_equal(sock_ifname_match("ib,eth", "enp3s0"), 0);
}

static void test_ifname_exclude(void** state) {
  (void)state;
  assert_int_equal(sock_ifname_match("^docker,lo", "docker0"), 0);
  assert_int_equal(sock_ifname_match("^docker,lo", "lo"), 0);
  assert_int_equal(sock_ifname_match("^docker,lo", "eth0"), 1);
  assert_int_equal(sock_ifname_match("^docker,lo", "ib0"), 1);
  assert_int_equal(sock_ifname_match("^docker", "dock"), 1);
}

static void test_ifname_exact(void** state) {
  (void)state;
  assert_int_equal(sock_ifname_match("=eth0", "eth0"), 1);
  assert_int_equal(sock_ifname_match("=eth0", "eth01"), 0);
  assert_int_equal(sock_ifname_match("=eth0", "eth"), 0);
  assert_int_equal(sock_ifname_match("=eth0", "veth0"), 0);
  assert_int_equal(sock_ifname_match("=eth0,ib1", "ib1"), 1);
  assert_int_equal(sock_ifname_match("=eth0,ib1", "ib10"), 0);
}

static void test_ifname_exclude_exact(void** state) {
  (void)state;
  assert_int_equal(sock_ifname_match("^=eth0", "eth0"), 0);
  assert_int_equal(sock_ifname_match("^=eth0", "eth01"), 1);
  assert_int_equal(sock_ifname_match("^=eth0", "eth1"), 1);
  assert_int_equal(sock_ifname_match("^=eth0", "lo"), 1);
  assert_int_equal(sock_ifname_match("^=docker0,lo", "lo"), 0);
  assert_int_equal(sock_ifname_match("^=docker0,lo", "lo0"), 1);
}

static void test_ifname_empty_entries(void** state) {
  (void)state;
  /* Empty entries match nothing (an empty prefix must not match everything). */
  assert_int_equal(sock_ifname_match("eth,,ib", "eth0"), 1);
  assert_int_equal(sock_ifname_match("eth,,ib", "ib0"), 1);
  assert_int_equal(sock_ifname_match("eth,,ib", "lo"), 0);
  assert_int_equal(sock_ifname_match(",eth", "lo"), 0);
  assert_int_equal(sock_ifname_match("eth,", "lo"), 0);
  assert_int_equal(sock_ifname_match(",", "lo"), 0);
  assert_int_equal(sock_ifname_match("^,,", "lo"), 1);
  assert_int_equal(sock_ifname_match("=,eth0,", "eth0"), 1);
}

/* ---- address parsing and printing -------------------------------------------- */

static void test_parse_ipv4(void** state) {
  (void)state;
  union sock_addr a;
  char buf[SOCK_ADDR_STRLEN];
  assert_int_equal(sock_parse_addr("127.0.0.1:1234", "TEST", &a), ncclSuccess);
  assert_int_equal(a.sa.sa_family, AF_INET);
  assert_int_equal(ntohs(a.sin.sin_port), 1234);
  assert_int_equal(ntohl(a.sin.sin_addr.s_addr), 0x7f000001u);
  assert_string_equal(sock_addr_str(&a, buf, sizeof(buf)), "127.0.0.1:1234");
  assert_int_equal(sock_addr_len(&a), sizeof(struct sockaddr_in));
  assert_int_equal(sock_addr_valid(&a), 1);

  assert_int_equal(sock_parse_addr("10.1.2.3:65535", "TEST", &a), ncclSuccess);
  assert_string_equal(sock_addr_str(&a, buf, sizeof(buf)), "10.1.2.3:65535");
  assert_int_equal(sock_parse_addr("10.1.2.3:1", "TEST", &a), ncclSuccess);
  assert_int_equal(ntohs(a.sin.sin_port), 1);
}

static void test_parse_ipv6(void** state) {
  (void)state;
  union sock_addr a;
  char buf[SOCK_ADDR_STRLEN];
  assert_int_equal(sock_parse_addr("[::1]:80", "TEST", &a), ncclSuccess);
  assert_int_equal(a.sa.sa_family, AF_INET6);
  assert_int_equal(ntohs(a.sin6.sin6_port), 80);
  assert_true(IN6_IS_ADDR_LOOPBACK(&a.sin6.sin6_addr));
  assert_string_equal(sock_addr_str(&a, buf, sizeof(buf)), "[::1]:80");
  assert_int_equal(sock_addr_len(&a), sizeof(struct sockaddr_in6));
  assert_int_equal(sock_addr_valid(&a), 1);

  assert_int_equal(sock_parse_addr("[2001:db8::42]:5000", "TEST", &a), ncclSuccess);
  assert_string_equal(sock_addr_str(&a, buf, sizeof(buf)), "[2001:db8::42]:5000");
}

static void test_parse_hostname(void** state) {
  (void)state;
  union sock_addr a;
  char buf[SOCK_ADDR_STRLEN];
  unsetenv("NCCL_SOCKET_FAMILY");
  assert_int_equal(sock_parse_addr("localhost:99", "TEST", &a), ncclSuccess);
  assert_true(a.sa.sa_family == AF_INET || a.sa.sa_family == AF_INET6);
  if (a.sa.sa_family == AF_INET) assert_int_equal(ntohs(a.sin.sin_port), 99);
  else assert_int_equal(ntohs(a.sin6.sin6_port), 99);
  assert_int_equal(sock_addr_is_loopback(&a), 1);
  const char* s = sock_addr_str(&a, buf, sizeof(buf));
  size_t len = strlen(s);
  assert_true(len > 3 && strcmp(s + len - 3, ":99") == 0);

  /* NCCL_SOCKET_FAMILY steers name resolution. */
  setenv("NCCL_SOCKET_FAMILY", "AF_INET", 1);
  assert_int_equal(sock_parse_addr("localhost:99", "TEST", &a), ncclSuccess);
  assert_int_equal(a.sa.sa_family, AF_INET);
  assert_string_equal(sock_addr_str(&a, buf, sizeof(buf)), "127.0.0.1:99");
  unsetenv("NCCL_SOCKET_FAMILY");
}

static void test_parse_errors(void** state) {
  (void)state;
  static const char* bad[] = {
      "",                /* empty */
      "1.2.3.4",         /* no port */
      "1.2.3.4:0",       /* port 0 */
      "1.2.3.4:65536",   /* port too large */
      "1.2.3.4:-1",      /* negative port */
      "1.2.3.4:12x",     /* trailing junk */
      "1.2.3.4:",        /* empty port */
      ":80",             /* empty host */
      "::1:80",          /* IPv6 without brackets */
      "[::1]80",         /* no colon after ] */
      "[::1]:",          /* empty port */
      "[::1",            /* no closing bracket */
      "[::1]:99999999999999999999", /* overflow */
  };
  union sock_addr a;
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    memset(&a, 0xaa, sizeof(a));
    ncclResult_t rc = sock_parse_addr(bad[i], "TEST", &a);
    if (rc != ncclInvalidArgument) fail_msg("\"%s\": got %d, want ncclInvalidArgument", bad[i], (int)rc);
    /* A failed parse leaves no half-filled address behind. */
    assert_int_equal(sock_addr_valid(&a), 0);
  }
  assert_int_equal(sock_parse_addr(NULL, "TEST", &a), ncclInvalidArgument);
}

static void test_parse_error_message_names_variable(void** state) {
  (void)state;
  union sock_addr a;
  assert_int_equal(sock_parse_addr("1.2.3.4:0", "NCCL_COMM_ID", &a), ncclInvalidArgument);
  const char* msg = err_last_thread();
  assert_non_null(msg);
  assert_non_null(strstr(msg, "NCCL_COMM_ID"));
}

static void test_addr_str_unset_and_truncation(void** state) {
  (void)state;
  union sock_addr a;
  char buf[SOCK_ADDR_STRLEN];
  memset(&a, 0, sizeof(a));
  const char* s = sock_addr_str(&a, buf, sizeof(buf));
  assert_non_null(s);
  assert_true(strlen(s) > 0);
  assert_int_equal(sock_addr_valid(&a), 0);
  /* Longest IPv6 text still fits SOCK_ADDR_STRLEN. */
  assert_int_equal(sock_parse_addr("[ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255]:65535", "TEST", &a),
                   ncclSuccess);
  s = sock_addr_str(&a, buf, sizeof(buf));
  assert_true(strlen(s) < sizeof(buf));
  assert_non_null(strstr(s, "]:65535"));
  char small[8];
  memset(small, 'x', sizeof(small));
  sock_addr_str(&a, small, sizeof(small));
  assert_int_equal(small[7], '\0');
}

static void test_loopback(void** state) {
  (void)state;
  union sock_addr a;
  struct { const char* s; int lo; } cases[] = {
      {"127.0.0.1:1", 1},      {"127.255.3.4:1", 1},        {"[::1]:1", 1},
      {"[::ffff:127.0.0.1]:1", 1}, {"[::ffff:127.9.9.9]:1", 1}, {"10.0.0.1:1", 0},
      {"128.0.0.1:1", 0},      {"[2001:db8::1]:1", 0},      {"[::ffff:10.0.0.1]:1", 0},
      {"[::2]:1", 0},          {"0.0.0.0:1", 0},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    assert_int_equal(sock_parse_addr(cases[i].s, "TEST", &a), ncclSuccess);
    if (sock_addr_is_loopback(&a) != cases[i].lo)
      fail_msg("%s: loopback=%d, want %d", cases[i].s, sock_addr_is_loopback(&a), cases[i].lo);
  }
  memset(&a, 0, sizeof(a));
  assert_int_equal(sock_addr_is_loopback(&a), 0);
}

static void test_status_strings(void** state) {
  (void)state;
  for (int st = SOCK_OK; st <= SOCK_AGAIN; st++) {
    assert_non_null(sock_status_str(st));
    assert_true(strlen(sock_status_str(st)) > 0);
  }
  assert_non_null(sock_status_str(-1));
}

/* ---- a real connection on 127.0.0.1 ----------------------------------------- */

#define XFER_BYTES (1u << 20)

struct conn_pair {
  int lfd, cfd, sfd; /* listener, client side, server (accepted) side */
  union sock_addr addr;
};

static void open_pair(struct conn_pair* p) {
  memset(p, 0, sizeof(*p));
  p->lfd = p->cfd = p->sfd = -1;
  assert_int_equal(sock_parse_addr("127.0.0.1:1", "TEST", &p->addr), ncclSuccess);
  p->addr.sin.sin_port = 0;
  assert_int_equal(sock_listen(&p->addr, &p->lfd), ncclSuccess);
  assert_true(p->lfd >= 0);
  assert_int_equal(p->addr.sa.sa_family, AF_INET);
  assert_int_not_equal(ntohs(p->addr.sin.sin_port), 0); /* the chosen port is written back */
  assert_int_equal(sock_addr_valid(&p->addr), 1);

  int64_t deadline = time_ms() + 10000;
  assert_int_equal(sock_connect(&p->addr, deadline, NULL, &p->cfd), SOCK_OK);
  union sock_addr peer;
  int st;
  while ((st = sock_accept(p->lfd, &p->sfd, &peer)) == SOCK_AGAIN) {
    assert_true(time_ms() < deadline);
    usleep(1000);
  }
  assert_int_equal(st, SOCK_OK);
  assert_true(p->sfd >= 0);
  assert_int_equal(peer.sa.sa_family, AF_INET);
  assert_int_equal(sock_addr_is_loopback(&peer), 1);
}

static void close_pair(struct conn_pair* p) {
  if (p->cfd >= 0) close(p->cfd);
  if (p->sfd >= 0) close(p->sfd);
  if (p->lfd >= 0) close(p->lfd);
}

struct sender_arg {
  int fd;
  const uint8_t* buf;
  size_t n;
  int st;
};

static void* sender_main(void* v) {
  struct sender_arg* a = v;
  a->st = sock_send_all(a->fd, a->buf, a->n, time_ms() + 10000, NULL);
  return NULL;
}

static void test_send_recv_round_trip(void** state) {
  (void)state;
  struct conn_pair p;
  open_pair(&p);

  uint8_t* out = malloc(XFER_BYTES);
  uint8_t* in = malloc(XFER_BYTES);
  assert_non_null(out);
  assert_non_null(in);
  uint32_t x = 2463534242u;
  for (size_t i = 0; i < XFER_BYTES; i++) {
    x ^= x << 13; x ^= x >> 17; x ^= x << 5;
    out[i] = (uint8_t)x;
  }
  memset(in, 0, XFER_BYTES);

  /* 1 MiB exceeds the socket buffers, so the sender needs its own thread. */
  struct sender_arg sa = {.fd = p.cfd, .buf = out, .n = XFER_BYTES, .st = -1};
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, sender_main, &sa), 0);
  int st = sock_recv_all(p.sfd, in, XFER_BYTES, time_ms() + 10000, NULL);
  assert_int_equal(pthread_join(t, NULL), 0);
  assert_int_equal(st, SOCK_OK);
  assert_int_equal(sa.st, SOCK_OK);
  assert_memory_equal(in, out, XFER_BYTES);

  /* And back the other way, small, no deadline. */
  assert_int_equal(sock_send_all(p.sfd, "pong", 4, -1, NULL), SOCK_OK);
  char reply[4];
  assert_int_equal(sock_recv_all(p.cfd, reply, 4, time_ms() + 10000, NULL), SOCK_OK);
  assert_memory_equal(reply, "pong", 4);

  free(out);
  free(in);
  close_pair(&p);
}

static void test_recv_after_peer_close(void** state) {
  (void)state;
  struct conn_pair p;
  open_pair(&p);
  /* Some bytes, then an orderly close: the bytes arrive, then SOCK_CLOSED. */
  assert_int_equal(sock_send_all(p.cfd, "abc", 3, time_ms() + 10000, NULL), SOCK_OK);
  close(p.cfd);
  p.cfd = -1;
  char buf[8];
  assert_int_equal(sock_recv_all(p.sfd, buf, 3, time_ms() + 10000, NULL), SOCK_OK);
  assert_memory_equal(buf, "abc", 3);
  assert_int_equal(sock_recv_all(p.sfd, buf, 1, time_ms() + 10000, NULL), SOCK_CLOSED);
  /* A partial message cut short by the close is also SOCK_CLOSED. */
  close_pair(&p);

  open_pair(&p);
  assert_int_equal(sock_send_all(p.cfd, "ab", 2, time_ms() + 10000, NULL), SOCK_OK);
  close(p.cfd);
  p.cfd = -1;
  assert_int_equal(sock_recv_all(p.sfd, buf, 8, time_ms() + 10000, NULL), SOCK_CLOSED);
  close_pair(&p);
}

static void test_recv_deadline_passed(void** state) {
  (void)state;
  struct conn_pair p;
  open_pair(&p);
  char buf[4];
  int64_t t0 = time_ms();
  assert_int_equal(sock_recv_all(p.sfd, buf, sizeof(buf), t0 - 1, NULL), SOCK_TIMEOUT);
  /* A short future deadline also times out, and not long after it. */
  t0 = time_ms();
  assert_int_equal(sock_recv_all(p.sfd, buf, sizeof(buf), t0 + 50, NULL), SOCK_TIMEOUT);
  int64_t took = time_ms() - t0;
  assert_true(took >= 49);
  assert_true(took < 5000);
  close_pair(&p);
}

static void test_recv_aborted(void** state) {
  (void)state;
  struct conn_pair p;
  open_pair(&p);
  char buf[4];
  volatile uint32_t abort_flag = 1;
  assert_int_equal(sock_recv_all(p.sfd, buf, sizeof(buf), time_ms() + 10000, &abort_flag), SOCK_ABORTED);
  close_pair(&p);
}

static void test_recv_some_partial(void** state) {
  (void)state;
  struct conn_pair p;
  open_pair(&p);
  char buf[8];
  size_t got = 0;
  assert_int_equal(sock_recv_some(p.sfd, buf, sizeof(buf), &got), SOCK_AGAIN);
  assert_int_equal(got, 0);
  assert_int_equal(sock_send_all(p.cfd, "1234", 4, time_ms() + 10000, NULL), SOCK_OK);
  int64_t deadline = time_ms() + 10000;
  int st;
  while ((st = sock_recv_some(p.sfd, buf, sizeof(buf), &got)) == SOCK_AGAIN && got < 4) {
    assert_true(time_ms() < deadline);
    usleep(1000);
  }
  assert_int_equal(st, SOCK_AGAIN);
  assert_int_equal(got, 4);
  assert_int_equal(sock_send_all(p.cfd, "5678", 4, time_ms() + 10000, NULL), SOCK_OK);
  while ((st = sock_recv_some(p.sfd, buf, sizeof(buf), &got)) == SOCK_AGAIN) {
    assert_true(time_ms() < deadline);
    usleep(1000);
  }
  assert_int_equal(st, SOCK_OK);
  assert_int_equal(got, 8);
  assert_memory_equal(buf, "12345678", 8);
  close_pair(&p);
}

static void test_connect_refused_times_out(void** state) {
  (void)state;
  /* Reserve a port, then close it: nothing listens there. */
  union sock_addr a;
  int lfd;
  assert_int_equal(sock_parse_addr("127.0.0.1:1", "TEST", &a), ncclSuccess);
  a.sin.sin_port = 0;
  assert_int_equal(sock_listen(&a, &lfd), ncclSuccess);
  close(lfd);
  int fd = -1;
  int64_t t0 = time_ms();
  assert_int_equal(sock_connect(&a, t0 + 200, NULL, &fd), SOCK_TIMEOUT);
  int64_t took = time_ms() - t0;
  assert_true(took < 5000);
  assert_int_equal(fd, -1);
}

static void test_accept_nothing_pending(void** state) {
  (void)state;
  union sock_addr a, peer;
  int lfd, fd = -1;
  assert_int_equal(sock_parse_addr("127.0.0.1:1", "TEST", &a), ncclSuccess);
  a.sin.sin_port = 0;
  assert_int_equal(sock_listen(&a, &lfd), ncclSuccess);
  assert_int_equal(sock_accept(lfd, &fd, &peer), SOCK_AGAIN);
  assert_int_equal(fd, -1);
  close(lfd);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ifname_empty_spec_matches_all),
      cmocka_unit_test(test_ifname_prefix),
      cmocka_unit_test(test_ifname_list),
      cmocka_unit_test(test_ifname_exclude),
      cmocka_unit_test(test_ifname_exact),
      cmocka_unit_test(test_ifname_exclude_exact),
      cmocka_unit_test(test_ifname_empty_entries),
      cmocka_unit_test(test_parse_ipv4),
      cmocka_unit_test(test_parse_ipv6),
      cmocka_unit_test(test_parse_hostname),
      cmocka_unit_test(test_parse_errors),
      cmocka_unit_test(test_parse_error_message_names_variable),
      cmocka_unit_test(test_addr_str_unset_and_truncation),
      cmocka_unit_test(test_loopback),
      cmocka_unit_test(test_status_strings),
      cmocka_unit_test(test_send_recv_round_trip),
      cmocka_unit_test(test_recv_after_peer_close),
      cmocka_unit_test(test_recv_deadline_passed),
      cmocka_unit_test(test_recv_aborted),
      cmocka_unit_test(test_recv_some_partial),
      cmocka_unit_test(test_connect_refused_times_out),
      cmocka_unit_test(test_accept_nothing_pending),
  };
  return cmocka_run_group_tests_name("socket", tests, NULL, NULL);
}
