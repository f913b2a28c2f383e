/* TCP socket utilities; see socket.h. Used by bootstrap.c and root.c. */
#include "socket.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "../core.h"

/* Longest single poll; keeps abort flags responsive without spinning. */
#define SOCK_POLL_SLICE_MS 100

const char* sock_status_str(int st) {
  switch (st) {
    case SOCK_OK: return "ok";
    case SOCK_TIMEOUT: return "timed out";
    case SOCK_CLOSED: return "connection closed by peer";
    case SOCK_ERROR: return "socket error";
    case SOCK_ABORTED: return "aborted";
    case SOCK_AGAIN: return "would block";
    default: return "unknown";
  }
}

socklen_t sock_addr_len(const union sock_addr* a) {
  return a->sa.sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
}

int sock_addr_valid(const union sock_addr* a) {
  return (a->sa.sa_family == AF_INET || a->sa.sa_family == AF_INET6) && a->sin.sin_port != 0;
}

int sock_addr_is_loopback(const union sock_addr* a) {
  if (a->sa.sa_family == AF_INET) return (ntohl(a->sin.sin_addr.s_addr) >> 24) == 127;
  if (a->sa.sa_family == AF_INET6) {
    if (IN6_IS_ADDR_LOOPBACK(&a->sin6.sin6_addr)) return 1;
    if (IN6_IS_ADDR_V4MAPPED(&a->sin6.sin6_addr)) return a->sin6.sin6_addr.s6_addr[12] == 127;
  }
  return 0;
}

int sock_link_local(int fd) {
  union sock_addr me, peer;
  socklen_t ml = sizeof(me), pl = sizeof(peer);
  memset(&me, 0, sizeof(me));
  memset(&peer, 0, sizeof(peer));
  if (getsockname(fd, &me.sa, &ml) != 0 || getpeername(fd, &peer.sa, &pl) != 0) return 0;
  if (sock_addr_is_loopback(&me) && sock_addr_is_loopback(&peer)) return 1;
  if (me.sa.sa_family != peer.sa.sa_family) return 0;
  if (me.sa.sa_family == AF_INET) return me.sin.sin_addr.s_addr == peer.sin.sin_addr.s_addr;
  if (me.sa.sa_family == AF_INET6)
    return !memcmp(&me.sin6.sin6_addr, &peer.sin6.sin6_addr, sizeof(me.sin6.sin6_addr)) &&
           (!IN6_IS_ADDR_LINKLOCAL(&me.sin6.sin6_addr) || me.sin6.sin6_scope_id == peer.sin6.sin6_scope_id);
  return 0;
}

const char* sock_addr_str(const union sock_addr* a, char* buf, size_t n) {
  char host[INET6_ADDRSTRLEN] = "?";
  if (a->sa.sa_family == AF_INET) {
    inet_ntop(AF_INET, &a->sin.sin_addr, host, sizeof(host));
    snprintf(buf, n, "%s:%u", host, ntohs(a->sin.sin_port));
  } else if (a->sa.sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &a->sin6.sin6_addr, host, sizeof(host));
    snprintf(buf, n, "[%s]:%u", host, ntohs(a->sin6.sin6_port));
  } else {
    snprintf(buf, n, "<no address>");
  }
  return buf;
}

ncclResult_t sock_parse_addr(const char* s, const char* what, union sock_addr* out) {
  memset(out, 0, sizeof(*out));
  if (!s || !*s) return err_set(ncclInvalidArgument, "%s: empty address", what);
  char host[256];
  const char* port_str;
  if (s[0] == '[') {
    const char* close = strchr(s, ']');
    if (!close || close[1] != ':' || (size_t)(close - s - 1) >= sizeof(host))
      return err_set(ncclInvalidArgument, "%s=\"%s\": expected [ipv6]:port", what, s);
    memcpy(host, s + 1, (size_t)(close - s - 1));
    host[close - s - 1] = '\0';
    port_str = close + 2;
  } else {
    const char* colon = strrchr(s, ':');
    if (!colon || colon == s || (size_t)(colon - s) >= sizeof(host))
      return err_set(ncclInvalidArgument, "%s=\"%s\": expected ip:port, [ipv6]:port or host:port", what, s);
    if (strchr(s, ':') != colon)
      return err_set(ncclInvalidArgument, "%s=\"%s\": IPv6 addresses need brackets: [addr]:port", what, s);
    memcpy(host, s, (size_t)(colon - s));
    host[colon - s] = '\0';
    port_str = colon + 1;
  }
  char* end;
  errno = 0;
  long port = (*port_str >= '0' && *port_str <= '9') ? strtol(port_str, &end, 10) : (end = (char*)port_str, -1);
  if (errno || end == port_str || *end || port < 1 || port > 65535)
    return err_set(ncclInvalidArgument, "%s=\"%s\": port must be 1..65535", what, s);
  if (inet_pton(AF_INET, host, &out->sin.sin_addr) == 1) {
    out->sin.sin_family = AF_INET;
    out->sin.sin_port = htons((uint16_t)port);
    return ncclSuccess;
  }
  if (inet_pton(AF_INET6, host, &out->sin6.sin6_addr) == 1) {
    out->sin6.sin6_family = AF_INET6;
    out->sin6.sin6_port = htons((uint16_t)port);
    return ncclSuccess;
  }
  struct addrinfo hints = {0}, *res = NULL;
  hints.ai_socktype = SOCK_STREAM;
  const char* fam = param_str(P_NCCL_SOCKET_FAMILY);
  if (fam && strcmp(fam, "AF_INET") == 0) hints.ai_family = AF_INET;
  else if (fam && strcmp(fam, "AF_INET6") == 0) hints.ai_family = AF_INET6;
  else hints.ai_family = AF_UNSPEC;
  int rc = getaddrinfo(host, NULL, &hints, &res);
  if (rc != 0 || !res)
    return err_set(ncclInvalidArgument, "%s=\"%s\": cannot resolve host \"%s\": %s", what, s, host,
                   gai_strerror(rc));
  memcpy(out, res->ai_addr, res->ai_addrlen < sizeof(*out) ? res->ai_addrlen : sizeof(*out));
  freeaddrinfo(res);
  if (out->sa.sa_family == AF_INET) out->sin.sin_port = htons((uint16_t)port);
  else out->sin6.sin6_port = htons((uint16_t)port);
  return ncclSuccess;
}

int sock_ifname_match(const char* spec, const char* ifname) {
  if (!spec || !*spec) return 1;
  int exclude = 0, exact = 0;
  if (*spec == '^') { exclude = 1; spec++; }
  if (*spec == '=') { exact = 1; spec++; }
  int hit = 0;
  const char* p = spec;
  while (*p && !hit) {
    const char* comma = strchr(p, ',');
    size_t len = comma ? (size_t)(comma - p) : strlen(p);
    if (len > 0) {
      if (exact) hit = strlen(ifname) == len && strncmp(ifname, p, len) == 0;
      else hit = strncmp(ifname, p, len) == 0;
    }
    p += len + (comma ? 1 : 0);
    if (!comma) break;
  }
  return exclude ? !hit : hit;
}

/* Link-local IPv6 addresses need a scope id on every peer; skip them. */
static int usable_addr(const struct sockaddr* sa, int family) {
  if (!sa || (sa->sa_family != AF_INET && sa->sa_family != AF_INET6)) return 0;
  if (family && sa->sa_family != family) return 0;
  if (sa->sa_family == AF_INET6 && IN6_IS_ADDR_LINKLOCAL(&((const struct sockaddr_in6*)sa)->sin6_addr))
    return 0;
  return 1;
}

ncclResult_t sock_pick_interface(const union sock_addr* near, union sock_addr* out, char* ifname,
                                 size_t ifname_len) {
  const char* spec = param_str(P_NCCL_SOCKET_IFNAME);
  const char* fam = param_str(P_NCCL_SOCKET_FAMILY);
  int family = 0;
  if (fam) {
    if (strcmp(fam, "AF_INET") == 0) family = AF_INET;
    else if (strcmp(fam, "AF_INET6") == 0) family = AF_INET6;
    else return err_set(ncclInvalidArgument, "NCCL_SOCKET_FAMILY=\"%s\": expected AF_INET or AF_INET6", fam);
  }
  struct ifaddrs* list = NULL;
  if (getifaddrs(&list) != 0)
    return err_set(ncclSystemError, "getifaddrs failed: %s", strerror(errno));
  const struct ifaddrs* chosen = NULL;
  const struct ifaddrs* loopback = NULL;
  int want_loopback = !spec && near && sock_addr_is_loopback(near);
  /* Prefer the family of the root address, so ranks can reach it and each other. */
  int pref = family ? family : (near ? near->sa.sa_family : 0);
  for (int pass = 0; pass < 2 && !chosen; pass++) {
    int fam_now = pass == 0 ? pref : family;
    for (const struct ifaddrs* ifa = list; ifa; ifa = ifa->ifa_next) {
      if (!usable_addr(ifa->ifa_addr, fam_now)) continue;
      if (!(ifa->ifa_flags & IFF_UP)) continue;
      int is_lo = (ifa->ifa_flags & IFF_LOOPBACK) != 0;
      if (spec) {
        if (!sock_ifname_match(spec, ifa->ifa_name)) continue;
        chosen = ifa;
        break;
      }
      if (is_lo) {
        if (!loopback) loopback = ifa;
        if (want_loopback) { chosen = ifa; break; }
        continue;
      }
      if (want_loopback || strncmp(ifa->ifa_name, "docker", 6) == 0) continue;
      chosen = ifa;
      break;
    }
  }
  if (!chosen && !spec) chosen = loopback;
  if (!chosen) {
    freeifaddrs(list);
    return err_set(ncclSystemError, "no usable network interface matches NCCL_SOCKET_IFNAME=\"%s\"%s%s",
                   spec ? spec : "", fam ? " and NCCL_SOCKET_FAMILY=" : "", fam ? fam : "");
  }
  memset(out, 0, sizeof(*out));
  memcpy(out, chosen->ifa_addr,
         chosen->ifa_addr->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in));
  if (out->sa.sa_family == AF_INET) out->sin.sin_port = 0;
  else out->sin6.sin6_port = 0;
  if (ifname) snprintf(ifname, ifname_len, "%s", chosen->ifa_name);
  freeifaddrs(list);
  return ncclSuccess;
}

ncclResult_t sock_listen(union sock_addr* addr, int* fd) { return sock_listen_on(addr, 0, fd); }

ncclResult_t sock_listen_on(union sock_addr* addr, int wildcard, int* fd) {
  char buf[SOCK_ADDR_STRLEN];
  /* Bound to the interface's own address by default: a listener on every
   * address would also answer on interfaces the job was told not to use. */
  union sock_addr bind_addr = *addr;
  if (wildcard) {
    if (bind_addr.sa.sa_family == AF_INET6) bind_addr.sin6.sin6_addr = in6addr_any;
    else bind_addr.sin.sin_addr.s_addr = htonl(INADDR_ANY);
  }
  int s = socket(addr->sa.sa_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (s < 0) return err_set(ncclSystemError, "socket() failed: %s", strerror(errno));
  int one = 1;
  /* A fixed port (NCCL_COMM_ID) must be reusable right after a previous job. */
  setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(s, &bind_addr.sa, sock_addr_len(&bind_addr)) != 0) {
    int e = errno;
    close(s);
    return err_set(ncclSystemError, "cannot bind a bootstrap listener to %s: %s%s",
                   sock_addr_str(&bind_addr, buf, sizeof(buf)), strerror(e),
                   e == EADDRNOTAVAIL ? " (not an address of this host: check NCCL_COMM_ID, or set "
                                        "COLLIE_LISTEN_ANY=1 to listen on every address)"
                                      : "");
  }
  if (listen(s, 16384) != 0) {
    int e = errno;
    close(s);
    return err_set(ncclSystemError, "listen() failed: %s", strerror(e));
  }
  socklen_t len = sizeof(bind_addr);
  getsockname(s, &bind_addr.sa, &len);
  if (wildcard) {
    if (addr->sa.sa_family == AF_INET6) addr->sin6.sin6_port = bind_addr.sin6.sin6_port;
    else addr->sin.sin_port = bind_addr.sin.sin_port;
  } else {
    *addr = bind_addr;
  }
  *fd = s;
  return ncclSuccess;
}

static int wait_fd(int fd, short events, int64_t deadline_ms, volatile uint32_t* abort_flag) {
  for (;;) {
    if (abort_flag && __atomic_load_n(abort_flag, __ATOMIC_RELAXED)) return SOCK_ABORTED;
    int64_t slice = SOCK_POLL_SLICE_MS;
    if (deadline_ms >= 0) {
      int64_t left = deadline_ms - time_ms();
      if (left <= 0) return SOCK_TIMEOUT;
      if (left < slice) slice = left;
    }
    struct pollfd p = {.fd = fd, .events = events};
    int rc = poll(&p, 1, (int)slice);
    if (rc > 0) return SOCK_OK;
    if (rc < 0 && errno != EINTR) return SOCK_ERROR;
  }
}

int sock_connect(const union sock_addr* addr, int64_t deadline_ms, volatile uint32_t* abort_flag, int* fd) {
  return sock_connect_opt(addr, deadline_ms, abort_flag, NULL, fd);
}

int sock_connect_opt(const union sock_addr* addr, int64_t deadline_ms, volatile uint32_t* abort_flag,
                     const struct sock_connect_opts* o, int* fd) {
  int backoff_ms = 1;
  for (;;) {
    int s = socket(addr->sa.sa_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (s < 0) return SOCK_ERROR;
    int one = 1;
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (o && o->prep) o->prep(s);
    int rc = connect(s, &addr->sa, sock_addr_len(addr));
    int err = rc == 0 ? 0 : errno;
    if (err == EINPROGRESS) {
      int st = wait_fd(s, POLLOUT, deadline_ms, abort_flag);
      if (st != SOCK_OK) {
        close(s);
        return st;
      }
      socklen_t len = sizeof(err);
      getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len);
    }
    if (err == 0) {
      *fd = s;
      return SOCK_OK;
    }
    close(s);
    /* The listener may not exist yet (root or peer still starting): retry. */
    if (err != ECONNREFUSED && err != ETIMEDOUT && err != ENETUNREACH && err != EHOSTUNREACH &&
        err != ECONNRESET && err != EAGAIN) {
      errno = err;
      return SOCK_ERROR;
    }
    if (abort_flag && __atomic_load_n(abort_flag, __ATOMIC_RELAXED)) return SOCK_ABORTED;
    if (o && o->stop && o->stop(o->arg) != ncclSuccess) return SOCK_ABORTED;
    if (deadline_ms >= 0 && time_ms() + backoff_ms >= deadline_ms) return SOCK_TIMEOUT;
    usleep((useconds_t)backoff_ms * 1000);
    if (backoff_ms < 100) backoff_ms *= 2;
  }
}

int sock_accept(int lfd, int* fd, union sock_addr* peer) {
  socklen_t len = sizeof(*peer);
  int s = accept4(lfd, &peer->sa, &len, SOCK_CLOEXEC | SOCK_NONBLOCK);
  if (s < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED) return SOCK_AGAIN;
    return SOCK_ERROR;
  }
  int one = 1;
  setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  *fd = s;
  return SOCK_OK;
}

int sock_send_all(int fd, const void* buf, size_t n, int64_t deadline_ms, volatile uint32_t* abort_flag) {
  const char* p = buf;
  size_t done = 0;
  while (done < n) {
    ssize_t rc = send(fd, p + done, n - done, MSG_NOSIGNAL);
    if (rc > 0) {
      done += (size_t)rc;
      continue;
    }
    if (rc < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      int st = wait_fd(fd, POLLOUT, deadline_ms, abort_flag);
      if (st != SOCK_OK) return st;
      continue;
    }
    if (rc < 0 && (errno == EPIPE || errno == ECONNRESET)) return SOCK_CLOSED;
    return SOCK_ERROR;
  }
  return SOCK_OK;
}

int sock_recv_some(int fd, void* buf, size_t n, size_t* got) {
  while (*got < n) {
    ssize_t rc = recv(fd, (char*)buf + *got, n - *got, 0);
    if (rc > 0) {
      *got += (size_t)rc;
      continue;
    }
    if (rc == 0) return SOCK_CLOSED;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return SOCK_AGAIN;
    if (errno == EINTR) continue;
    if (errno == ECONNRESET) return SOCK_CLOSED;
    return SOCK_ERROR;
  }
  return SOCK_OK;
}

int sock_recv_all(int fd, void* buf, size_t n, int64_t deadline_ms, volatile uint32_t* abort_flag) {
  size_t got = 0;
  for (;;) {
    int st = sock_recv_some(fd, buf, n, &got);
    if (st != SOCK_AGAIN) return st;
    st = wait_fd(fd, POLLIN, deadline_ms, abort_flag);
    if (st != SOCK_OK) return st;
  }
}

/* A random loopback port below the kernel's ephemeral range (a port the
 * kernel handed out for bind(0) can go to any outgoing connection the moment
 * it is closed), bound and, with listen_fd, listening: the port, or -1. */
static int loopback_port(int family, int* listen_fd) {
  int lo = 32768;
  FILE* f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
  if (f) {
    if (fscanf(f, "%d", &lo) != 1) lo = 32768;
    fclose(f);
  }
  if (lo <= 11024) lo = 32768;
  unsigned seed = (unsigned)getpid() ^ (unsigned)time(NULL);
  {
    unsigned r;
    if (getrandom(&r, sizeof(r), GRND_NONBLOCK) == (ssize_t)sizeof(r)) seed ^= r;
  }
  for (int i = 0; i < 200; i++) {
    union sock_addr a;
    memset(&a, 0, sizeof(a));
    uint16_t port = (uint16_t)(10000 + rand_r(&seed) % (unsigned)(lo - 10001));
    socklen_t len;
    if (family == AF_INET6) {
      a.sin6.sin6_family = AF_INET6;
      a.sin6.sin6_addr = in6addr_loopback;
      a.sin6.sin6_port = htons(port);
      len = sizeof(a.sin6);
    } else {
      a.sin.sin_family = AF_INET;
      a.sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      a.sin.sin_port = htons(port);
      len = sizeof(a.sin);
    }
    int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    if (listen_fd) {
      int one = 1;
      setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    }
    int ok = bind(fd, &a.sa, len) == 0 && (!listen_fd || listen(fd, 16384) == 0);
    if (ok && listen_fd) {
      *listen_fd = fd;
      return port;
    }
    close(fd);
    if (ok) return port;
  }
  return -1;
}

int sock_free_loopback_port(int family) { return loopback_port(family, NULL); }

int sock_reserve_loopback_port(int family, int* listen_fd) { return loopback_port(family, listen_fd); }

int sock_is_listener_on(int fd, const union sock_addr* addr) {
  int on = 0;
  socklen_t olen = sizeof(on);
  if (fd < 0 || getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &on, &olen) != 0 || !on) return 0;
  union sock_addr got;
  memset(&got, 0, sizeof(got));
  socklen_t len = sizeof(got);
  if (getsockname(fd, &got.sa, &len) != 0 || got.sa.sa_family != addr->sa.sa_family) return 0;
  if (got.sa.sa_family == AF_INET)
    return got.sin.sin_port == addr->sin.sin_port && got.sin.sin_addr.s_addr == addr->sin.sin_addr.s_addr;
  if (got.sa.sa_family == AF_INET6)
    return got.sin6.sin6_port == addr->sin6.sin6_port &&
           memcmp(&got.sin6.sin6_addr, &addr->sin6.sin6_addr, sizeof(got.sin6.sin6_addr)) == 0;
  return 0;
}
