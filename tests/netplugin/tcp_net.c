/* A test NCCL net plugin (libnccl-net-collietest.so, never installed):
 * ncclNetPlugin_v8 over loopback TCP, written from the semantics the net
 * headers document (connect/accept may return no comm yet and are called
 * again; isend/irecv are non-blocking and may return no request; test()
 * completes a request and gives its size; tags are ignored). It proves
 * collie's loader and plugin transport (src/transport/net_plugin.c) end to
 * end (built with TN_V10 / TN_V9 it also exports ncclNetPlugin_v10 / _v9).
 * COLLIE_TESTNET_FAIL=init makes init fail; a process exiting with
 * comms or registrations still open prints "collietest-net: leaked" (to
 * COLLIE_TESTNET_LEAKFILE if set). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "net_plugin.h"

#define TN_MAGIC 0x54434e31u
#define TN_MAX_REQS 32 /* per comm; more and isend/irecv return no request */

struct tn_handle { /* inside the 128-byte NCCL handle */
  uint32_t magic;
  uint32_t stage; /* connect: 0 first call (answers "not yet"), 1 then connects */
  struct sockaddr_in addr;
};

struct tn_req;
struct tn_comm {
  int fd;
  ino_t ino; /* the socket's inode: tells whether fd still is our socket */
  int is_send;
  int failed;
  int nreqs;
  struct tn_req* head; /* oldest first */
};

struct tn_req {
  struct tn_comm* comm;
  struct tn_req* next;
  char* data;
  size_t cap;     /* receive: the buffer's size */
  uint64_t len;   /* bytes of the message */
  size_t hdr_off; /* bytes of the 8-byte length moved */
  size_t off;     /* bytes of the payload moved */
  int done;
};

struct tn_mr {
  char* data;
  size_t size;
};

static ncclDebugLogger_t tn_log;
static int tn_live_comms, tn_live_mrs;

#define TN_WARN(...)                                              \
  do {                                                            \
    if (tn_log) tn_log(2, ~0ul, __FILE__, __LINE__, __VA_ARGS__); \
  } while (0)

static ncclResult_t tn_init(ncclDebugLogger_t log) {
  tn_log = log;
  const char* f = getenv("COLLIE_TESTNET_FAIL");
  if (f && strcmp(f, "init") == 0) {
    TN_WARN("collietest-net: init fails on purpose (COLLIE_TESTNET_FAIL=init)");
    return ncclSystemError;
  }
  if (tn_log) tn_log(3, 0x10, __FILE__, __LINE__, "collietest-net: init");
  return ncclSuccess;
}

static ncclResult_t tn_devices(int* n) {
  *n = 1;
  return ncclSuccess;
}

static ncclResult_t tn_props(int dev, ncclNetProperties_v8_t* p) {
  if (dev != 0) return ncclInvalidArgument;
  memset(p, 0, sizeof(*p));
  p->name = (char*)"lo-tcp";
  p->pciPath = NULL;
  p->guid = 0x636f6c6c6965ull;
  p->ptrSupport = NCCL_PTR_HOST;
  p->speed = 10000;
  p->port = 1;
  p->latency = 0;
  p->maxComms = 65536;
  p->maxRecvs = 1;
  return ncclSuccess;
}

static ncclResult_t tn_listen(int dev, void* handle, void** listen_comm) {
  if (dev != 0) return ncclInvalidArgument;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return ncclSystemError;
  struct sockaddr_in a;
  memset(&a, 0, sizeof(a));
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t al = sizeof(a);
  if (bind(fd, (struct sockaddr*)&a, sizeof(a)) != 0 || listen(fd, 128) != 0 ||
      getsockname(fd, (struct sockaddr*)&a, &al) != 0) {
    close(fd);
    return ncclSystemError;
  }
  struct tn_handle h = {TN_MAGIC, 0, a};
  memcpy(handle, &h, sizeof(h));
  struct tn_comm* lc = calloc(1, sizeof(*lc));
  if (!lc) {
    close(fd);
    return ncclSystemError;
  }
  lc->fd = fd;
  __atomic_add_fetch(&tn_live_comms, 1, __ATOMIC_RELAXED);
  *listen_comm = lc;
  return ncclSuccess;
}

static struct tn_comm* tn_comm_new(int fd, int is_send) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  struct tn_comm* c = calloc(1, sizeof(*c));
  if (!c) return NULL;
  c->fd = fd;
  struct stat st;
  c->ino = fstat(fd, &st) == 0 ? st.st_ino : 0;
  c->is_send = is_send;
  __atomic_add_fetch(&tn_live_comms, 1, __ATOMIC_RELAXED);
  return c;
}

static ncclResult_t tn_connect(int dev, void* handle, void** send_comm, ncclNetDeviceHandle_v8_t** dev_comm) {
  (void)dev_comm;
  struct tn_handle h;
  memcpy(&h, handle, sizeof(h));
  *send_comm = NULL;
  if (h.magic != TN_MAGIC) return ncclInternalError;
  if (h.stage == 0) { /* the caller must call again: exercises its retry */
    h.stage = 1;
    memcpy(handle, &h, sizeof(h));
    return ncclSuccess;
  }
  /* A loopback connect to a listening socket completes at once (the kernel
   * queues it until accept), so a blocking connect does not wait on the peer. */
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return ncclSystemError;
  if (connect(fd, (struct sockaddr*)&h.addr, sizeof(h.addr)) != 0) {
    TN_WARN("collietest-net: connect: %s", strerror(errno));
    close(fd);
    return ncclSystemError;
  }
  struct tn_comm* c = tn_comm_new(fd, 1);
  if (!c || fcntl(fd, F_SETFL, O_NONBLOCK) != 0) {
    free(c);
    close(fd);
    return ncclSystemError;
  }
  *send_comm = c;
  return ncclSuccess;
}

static ncclResult_t tn_accept(void* listen_comm, void** recv_comm, ncclNetDeviceHandle_v8_t** dev_comm) {
  (void)dev_comm;
  struct tn_comm* lc = listen_comm;
  *recv_comm = NULL;
  int fd = accept4(lc->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (fd < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? ncclSuccess : ncclSystemError;
  struct tn_comm* c = tn_comm_new(fd, 0);
  if (!c) {
    close(fd);
    return ncclSystemError;
  }
  *recv_comm = c;
  return ncclSuccess;
}

static ncclResult_t tn_reg(void* comm, void* data, size_t size, int type, void** mhandle) {
  if (!comm || type != NCCL_PTR_HOST) return ncclInternalError;
  struct tn_mr* m = malloc(sizeof(*m));
  if (!m) return ncclSystemError;
  m->data = data;
  m->size = size;
  __atomic_add_fetch(&tn_live_mrs, 1, __ATOMIC_RELAXED);
  *mhandle = m;
  return ncclSuccess;
}

static ncclResult_t tn_reg_dmabuf(void* comm, void* data, size_t size, int type, uint64_t offset, int fd,
                                  void** mhandle) {
  (void)comm, (void)data, (void)size, (void)type, (void)offset, (void)fd, (void)mhandle;
  return ncclInternalError;
}

static ncclResult_t tn_dereg(void* comm, void* mhandle) {
  (void)comm;
  free(mhandle);
  __atomic_sub_fetch(&tn_live_mrs, 1, __ATOMIC_RELAXED);
  return ncclSuccess;
}

/* A buffer outside its registration is the caller's bug: refuse it. */
static int tn_in_mr(void* mhandle, const void* data, size_t size) {
  const struct tn_mr* m = mhandle;
  return m && (const char*)data >= m->data && (const char*)data + size <= m->data + m->size;
}

static struct tn_req* tn_enqueue(struct tn_comm* c, void* data, size_t cap, uint64_t len) {
  struct tn_req* r = calloc(1, sizeof(*r));
  if (!r) return NULL;
  r->comm = c;
  r->data = data;
  r->cap = cap;
  r->len = len;
  struct tn_req** p = &c->head;
  while (*p) p = &(*p)->next;
  *p = r;
  c->nreqs++;
  return r;
}

static ncclResult_t tn_isend(void* send_comm, void* data, int size, int tag, void* mhandle, void** request) {
  (void)tag;
  struct tn_comm* c = send_comm;
  *request = NULL;
  if (c->failed) return ncclRemoteError;
  if (size < 0 || !tn_in_mr(mhandle, data, (size_t)size)) {
    TN_WARN("collietest-net: isend of %d bytes at %p outside its registration", size, data);
    return ncclInternalError;
  }
  if (c->nreqs >= TN_MAX_REQS) return ncclSuccess;
  if (!(*request = tn_enqueue(c, data, (size_t)size, (uint64_t)size))) return ncclSystemError;
  return ncclSuccess;
}

static ncclResult_t tn_irecv(void* recv_comm, int n, void** data, int* sizes, int* tags, void** mhandles,
                             void** request) {
  (void)tags;
  struct tn_comm* c = recv_comm;
  *request = NULL;
  if (c->failed) return ncclRemoteError;
  if (n != 1) return ncclInternalError; /* maxRecvs is 1 */
  if (sizes[0] < 0 || !tn_in_mr(mhandles[0], data[0], (size_t)sizes[0])) {
    TN_WARN("collietest-net: irecv of %d bytes at %p outside its registration", sizes[0], data[0]);
    return ncclInternalError;
  }
  if (c->nreqs >= TN_MAX_REQS) return ncclSuccess;
  if (!(*request = tn_enqueue(c, data[0], (size_t)sizes[0], 0))) return ncclSystemError;
  return ncclSuccess;
}

static ncclResult_t tn_iflush(void* recv_comm, int n, void** data, int* sizes, void** mhandles, void** request) {
  (void)recv_comm, (void)n, (void)data, (void)sizes, (void)mhandles;
  *request = NULL; /* host memory: nothing to flush */
  return ncclSuccess;
}

/* Moves bytes for the comm's requests in order, without blocking. */
static ncclResult_t tn_progress(struct tn_comm* c) {
  for (struct tn_req* r = c->head; r; r = r->next) {
    if (r->done) continue;
    while (!r->done) {
      ssize_t n;
      if (c->is_send) {
        struct iovec iov[2];
        int k = 0;
        if (r->hdr_off < 8) iov[k++] = (struct iovec){(char*)&r->len + r->hdr_off, 8 - r->hdr_off};
        if (r->off < r->len) iov[k++] = (struct iovec){r->data + r->off, r->len - r->off};
        struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)k};
        n = sendmsg(c->fd, &m, MSG_NOSIGNAL);
      } else if (r->hdr_off < 8) {
        n = recv(c->fd, (char*)&r->len + r->hdr_off, 8 - r->hdr_off, 0);
      } else {
        n = r->len > r->off ? recv(c->fd, r->data + r->off, r->len - r->off, 0) : 0;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return ncclSuccess;
      if (n < 0 || (n == 0 && (c->is_send || r->hdr_off < 8 || r->off < r->len))) {
        struct sockaddr_in a, b;
        socklen_t al = sizeof(a), bl = sizeof(b);
        memset(&a, 0, sizeof(a));
        memset(&b, 0, sizeof(b));
        getsockname(c->fd, (struct sockaddr*)&a, &al);
        getpeername(c->fd, (struct sockaddr*)&b, &bl);
        TN_WARN("collietest-net: fd %d (%d -> %d): %s", c->fd, ntohs(a.sin_port), ntohs(b.sin_port),
                n < 0 ? strerror(errno) : "closed by the peer");
        c->failed = 1;
        return ncclRemoteError; /* EOF or a reset: the peer closed or died */
      }
      size_t h = r->hdr_off < 8 ? ((size_t)n < 8 - r->hdr_off ? (size_t)n : 8 - r->hdr_off) : 0;
      r->hdr_off += h;
      r->off += (size_t)n - h;
      if (!c->is_send && r->hdr_off == 8 && r->len > r->cap) {
        TN_WARN("collietest-net: message of %llu bytes for a %zu-byte receive", (unsigned long long)r->len, r->cap);
        c->failed = 1;
        return ncclInternalError;
      }
      if (r->hdr_off == 8 && r->off == r->len) r->done = 1;
    }
  }
  return ncclSuccess;
}

static ncclResult_t tn_test(void* request, int* done, int* size) {
  struct tn_req* r = request;
  struct tn_comm* c = r->comm;
  *done = 0;
  /* A peer that closed after its last message only fails the requests it
   * did not complete: this one may be done even if a later one failed. */
  ncclResult_t res = c->failed ? ncclRemoteError : tn_progress(c);
  if (!r->done) return res;
  *done = 1;
  if (size) *size = (int)r->len;
  for (struct tn_req** p = &c->head; *p; p = &(*p)->next)
    if (*p == r) {
      *p = r->next;
      break;
    }
  c->nreqs--;
  free(r);
  return ncclSuccess;
}

static ncclResult_t tn_close(void* comm) {
  struct tn_comm* c = comm;
  if (!c) return ncclSuccess;
  while (c->head) {
    struct tn_req* r = c->head;
    c->head = r->next;
    free(r);
  }
  struct stat st;
  if (c->ino && (fstat(c->fd, &st) != 0 || st.st_ino != c->ino)) {
    /* Someone else closed our fd (and the number may be reused): not ours to close. */
    TN_WARN("collietest-net: fd %d was closed behind the plugin's back", c->fd);
    free(c);
    __atomic_sub_fetch(&tn_live_comms, 1, __ATOMIC_RELAXED);
    return ncclSuccess;
  }
  if (tn_log) {
    struct sockaddr_in a, b;
    socklen_t al = sizeof(a), bl = sizeof(b);
    memset(&a, 0, sizeof(a));
    memset(&b, 0, sizeof(b));
    getsockname(c->fd, (struct sockaddr*)&a, &al);
    getpeername(c->fd, (struct sockaddr*)&b, &bl);
    tn_log(3, 0x10, __FILE__, __LINE__, "collietest-net: close fd %d (%d -> %d)", c->fd, ntohs(a.sin_port),
           ntohs(b.sin_port));
  }
  close(c->fd);
  free(c);
  __atomic_sub_fetch(&tn_live_comms, 1, __ATOMIC_RELAXED);
  return ncclSuccess;
}

static ncclResult_t tn_get_device_mr(void* comm, void* mhandle, void** dptr) {
  (void)comm, (void)mhandle, (void)dptr;
  return ncclInternalError;
}

static ncclResult_t tn_irecv_consumed(void* recv_comm, int n, void* request) {
  (void)recv_comm, (void)n, (void)request;
  return ncclSuccess;
}

__attribute__((visibility("default"))) const ncclNet_v8_t ncclNetPlugin_v8 = {
    .name = "CollieTest",
    .init = tn_init,
    .devices = tn_devices,
    .getProperties = tn_props,
    .listen = tn_listen,
    .connect = tn_connect,
    .accept = tn_accept,
    .regMr = tn_reg,
    .regMrDmaBuf = tn_reg_dmabuf,
    .deregMr = tn_dereg,
    .isend = tn_isend,
    .irecv = tn_irecv,
    .iflush = tn_iflush,
    .test = tn_test,
    .closeSend = tn_close,
    .closeRecv = tn_close,
    .closeListen = tn_close,
    .getDeviceMr = tn_get_device_mr,
    .irecvConsumed = tn_irecv_consumed,
};

#if defined(TN_V10) || defined(TN_V9)
/* Built again as libnccl-net-collietest10.so / -collietest9.so: the v10 or
 * v9 table too (the loader must take it over v8), its calls adapted to the v8
 * ones above (v9 and v10 share the properties and vdevice layouts). */

static ncclResult_t tn_props10(int dev, ncclNetProperties_v10_t* p) {
  ncclNetProperties_v8_t p8;
  ncclResult_t r = tn_props(dev, &p8);
  if (r != ncclSuccess) return r;
  memset(p, 0, sizeof(*p));
  p->name = p8.name;
  p->guid = p8.guid;
  p->ptrSupport = p8.ptrSupport;
  p->speed = p8.speed;
  p->port = p8.port;
  p->maxComms = p8.maxComms;
  p->maxRecvs = p8.maxRecvs;
  p->vProps.ndevs = 1;
  p->maxP2pBytes = p->maxCollBytes = (size_t)1 << 30;
  return ncclSuccess;
}

static ncclResult_t tn_make_vdevice(int* d, ncclNetVDeviceProps_v10_t* props) {
  (void)d, (void)props;
  return ncclInternalError;
}

static ncclResult_t tn_irecv_sz(void* recv_comm, int n, void** data, size_t* sizes, int* tags, void** mhandles,
                                void** request) {
  if (n != 1 || sizes[0] > (size_t)1 << 30) return ncclInternalError;
  int size = (int)sizes[0];
  return tn_irecv(recv_comm, n, data, &size, tags, mhandles, request);
}
#endif

#ifdef TN_V9
static ncclResult_t tn_isend9(void* send_comm, void* data, size_t size, int tag, void* mhandle, void** request) {
  if (size > (size_t)1 << 30) return ncclInternalError;
  return tn_isend(send_comm, data, (int)size, tag, mhandle, request);
}

__attribute__((visibility("default"))) const ncclNet_v9_t ncclNetPlugin_v9 = {
    .name = "CollieTest",
    .init = tn_init,
    .devices = tn_devices,
    .getProperties = tn_props10,
    .listen = tn_listen,
    .connect = tn_connect,
    .accept = tn_accept,
    .regMr = tn_reg,
    .regMrDmaBuf = tn_reg_dmabuf,
    .deregMr = tn_dereg,
    .isend = tn_isend9,
    .irecv = tn_irecv_sz,
    .iflush = tn_iflush,
    .test = tn_test,
    .closeSend = tn_close,
    .closeRecv = tn_close,
    .closeListen = tn_close,
    .getDeviceMr = tn_get_device_mr,
    .irecvConsumed = tn_irecv_consumed,
    .makeVDevice = tn_make_vdevice,
};
#endif

#ifdef TN_V10
static ncclResult_t tn_init10(ncclDebugLogger_t log, ncclProfilerCallback_t prof) {
  (void)prof;
  return tn_init(log);
}

static ncclResult_t tn_connect10(int dev, ncclNetCommConfig_v10_t* cfg, void* handle, void** send_comm,
                                 ncclNetDeviceHandle_v10_t** dev_comm) {
  (void)cfg;
  return tn_connect(dev, handle, send_comm, dev_comm);
}

static ncclResult_t tn_isend10(void* send_comm, void* data, size_t size, int tag, void* mhandle, void* phandle,
                               void** request) {
  (void)phandle;
  if (size > (size_t)1 << 30) return ncclInternalError;
  return tn_isend(send_comm, data, (int)size, tag, mhandle, request);
}

static ncclResult_t tn_irecv10(void* recv_comm, int n, void** data, size_t* sizes, int* tags, void** mhandles,
                               void** phandles, void** request) {
  (void)phandles;
  return tn_irecv_sz(recv_comm, n, data, sizes, tags, mhandles, request);
}

__attribute__((visibility("default"))) const ncclNet_v10_t ncclNetPlugin_v10 = {
    .name = "CollieTest",
    .init = tn_init10,
    .devices = tn_devices,
    .getProperties = tn_props10,
    .listen = tn_listen,
    .connect = tn_connect10,
    .accept = tn_accept,
    .regMr = tn_reg,
    .regMrDmaBuf = tn_reg_dmabuf,
    .deregMr = tn_dereg,
    .isend = tn_isend10,
    .irecv = tn_irecv10,
    .iflush = tn_iflush,
    .test = tn_test,
    .closeSend = tn_close,
    .closeRecv = tn_close,
    .closeListen = tn_close,
    .getDeviceMr = tn_get_device_mr,
    .irecvConsumed = tn_irecv_consumed,
    .makeVDevice = tn_make_vdevice,
};
#endif

/* What was not closed when the process ends (after a clean destroy: nothing). */
__attribute__((destructor)) static void tn_report(void) {
  if (!tn_live_comms && !tn_live_mrs) return;
  const char* path = getenv("COLLIE_TESTNET_LEAKFILE");
  FILE* f = path && *path ? fopen(path, "a") : NULL;
  fprintf(f ? f : stderr, "collietest-net: leaked %d comms and %d registrations (pid %d)\n", tn_live_comms, tn_live_mrs,
          (int)getpid());
  if (f) fclose(f);
}
