/* TCP socket utilities for the bootstrap (and later the socket transport):
 * address parsing and printing, interface selection (NCCL_SOCKET_IFNAME,
 * NCCL_SOCKET_FAMILY), listen/connect, and deadline-bounded send/recv that
 * poll in short slices so an abort flag is always noticed. */
#ifndef COLLIE_SOCKET_H
#define COLLIE_SOCKET_H

#include <netinet/in.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "nccl.h"

union sock_addr {
  struct sockaddr sa;
  struct sockaddr_in sin;
  struct sockaddr_in6 sin6;
};

enum sock_status {
  SOCK_OK = 0,
  SOCK_TIMEOUT,   /* deadline passed */
  SOCK_CLOSED,    /* orderly close by the peer */
  SOCK_ERROR,     /* any other socket error; errno kept */
  SOCK_ABORTED,   /* *abort became non-zero */
  SOCK_AGAIN,     /* nonblocking step: nothing more now */
};
const char* sock_status_str(int st);

#define SOCK_ADDR_STRLEN 64
/* "1.2.3.4:5" or "[::1]:5"; never fails. */
const char* sock_addr_str(const union sock_addr* a, char* buf, size_t n);
socklen_t sock_addr_len(const union sock_addr* a);
int sock_addr_is_loopback(const union sock_addr* a);
/* 1 when the connected socket `fd` joins two ends within one network stack:
 * its peer's address is its own address, or both are loopback. Nothing
 * between the ends can cut such a link without the kernel telling both. */
int sock_link_local(int fd);
/* A loopback port (family AF_INET or AF_INET6) that binds now, for a launcher
 * or test that must name it before anyone listens on it: random, below the
 * kernel's ephemeral range, so no other process's outgoing connection can
 * take it in between (a bind(0) port, closed again, can). -1 if none. */
int sock_free_loopback_port(int family);
/* The same, but the port stays bound and listening on *listen_fd (O_CLOEXEC,
 * blocking) until the caller hands it on or closes it: collie-run holds rank
 * 0's bootstrap root port so that nothing else can take it while rank 0
 * starts (bootstrap/root.c, COLLIE_BOOTSTRAP_ROOT_FD). -1 if none. */
int sock_reserve_loopback_port(int family, int* listen_fd);
/* 1 if fd is a listening TCP socket bound to exactly addr (family, address,
 * port), else 0. */
int sock_is_listener_on(int fd, const union sock_addr* addr);
int sock_addr_valid(const union sock_addr* a);

/* Parses "ip:port", "[ipv6]:port" or "host:port" (resolved). Port 1..65535.
 * Returns ncclInvalidArgument with a message naming `what` on bad input. */
ncclResult_t sock_parse_addr(const char* s, const char* what, union sock_addr* out);

/* NCCL_SOCKET_IFNAME matching: comma-separated prefixes; leading '^' excludes
 * the listed names; '=' (after any '^') makes the match exact. An empty or
 * NULL spec matches everything. Returns 1 when `ifname` is selected. */
int sock_ifname_match(const char* spec, const char* ifname);

/* Chooses the local interface address for listening: NCCL_SOCKET_IFNAME /
 * NCCL_SOCKET_FAMILY when set; otherwise the first up interface that is not
 * loopback or docker*, and loopback when that is all there is. When `near` is
 * a loopback address and no IFNAME is given, loopback is chosen (all ranks of
 * a loopback job live on this host). Port is set to 0. */
ncclResult_t sock_pick_interface(const union sock_addr* near, union sock_addr* out, char* ifname,
                                 size_t ifname_len);

/* Listening socket on `addr` (port 0: ephemeral; the chosen port is written
 * back). Nonblocking, close-on-exec. */
ncclResult_t sock_listen(union sock_addr* addr, int* fd);
/* The same; with `wildcard` (COLLIE_LISTEN_ANY, read by the caller at init)
 * it binds the wildcard address of addr's family on addr's port, and only
 * the port is written back: `addr` stays what peers are told. */
ncclResult_t sock_listen_on(union sock_addr* addr, int wildcard, int* fd);

/* Connects, retrying refused/unreachable attempts with backoff until
 * `deadline_ms` (CLOCK_MONOTONIC ms). TCP_NODELAY, nonblocking, cloexec. */
int sock_connect(const union sock_addr* addr, int64_t deadline_ms, volatile uint32_t* abort_flag,
                 int* fd);
/* What a caller of sock_connect_opt adds (any member may be NULL). */
struct sock_connect_opts {
  /* Sets options on each new socket before it connects (those the kernel
   * applies when the connection is established, such as TCP_CONGESTION). */
  void (*prep)(int fd);
  /* Asked after each refused attempt: anything but ncclSuccess ends the
   * retries with SOCK_ABORTED (a peer known to have failed refuses until the
   * deadline); the same signature as the bootstrap's watch. */
  ncclResult_t (*stop)(void* arg);
  void* arg;
};
/* The same as sock_connect, with `o` (NULL: none). */
int sock_connect_opt(const union sock_addr* addr, int64_t deadline_ms, volatile uint32_t* abort_flag,
                     const struct sock_connect_opts* o, int* fd);

/* Accepts one pending connection without blocking: SOCK_OK, SOCK_AGAIN or SOCK_ERROR. */
int sock_accept(int lfd, int* fd, union sock_addr* peer);

/* Whole-buffer transfers bounded by `deadline_ms` (-1: none). */
int sock_send_all(int fd, const void* buf, size_t n, int64_t deadline_ms, volatile uint32_t* abort_flag);
int sock_recv_all(int fd, void* buf, size_t n, int64_t deadline_ms, volatile uint32_t* abort_flag);

/* One nonblocking read into buf[*got..n): SOCK_OK when complete, SOCK_AGAIN
 * when more is needed, SOCK_CLOSED / SOCK_ERROR otherwise. */
int sock_recv_some(int fd, void* buf, size_t n, size_t* got);

#endif
