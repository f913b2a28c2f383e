/* NCCL net plugins as a collie transport: NCCL_NET_PLUGIN names a
 * libnccl-net-<name>.so (or a path; unset tries libnccl-net.so, "none" loads
 * nothing), dlopen'ed once per process on the first connector setup, its
 * ncclNetPlugin_v10/_v9/_v8 table (newest first, net_plugin.h) wrapped as one
 * entry of connect.c's transport table, named by the plugin's own name (what
 * NCCL_NET selects). Connectors move slots the same way as the other net
 * transports: each side keeps nslots header+payload slots registered with
 * regMr; the receiver keeps an irecv posted on every free slot, the sender
 * isends each committed slot, and test() in order completes them. The listen
 * handle travels in the bootstrap info blob; connect/accept, which may return
 * no comm yet, are retried from progress until they do (bounded). */
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "../bootstrap/bootstrap.h"
#include "../comm.h"
#include "../comm_err.h"
#include "net_plugin.h"
#include "transport.h"

#define NP_HDR_BYTES 64   /* a slot's header area (struct slot_hdr, padded) */
#define NP_TAG 0x636f6c6c /* one tag for every message: slots of a connector are in order */

/* ---- the loaded plugin ---------------------------------------------------- */

static pthread_once_t np_once = PTHREAD_ONCE_INIT;
static int np_version;       /* 10, 9, 8; 0: none loaded */
static const void* np_table; /* ncclNet_v<np_version>_t */
static int np_ndev;
static char np_name[32]; /* the transport's name: the plugin's */

/* Fields at the same offset with the same type in v8, v9 and v10 (name,
 * devices, listen, accept, regMr, deregMr, test, close*; v8/v9 init): read
 * through the v8 layout. The others are called per version. */
#define NP(field) (((const ncclNet_v8_t*)np_table)->field)

/* Plugin messages go to collie's log with the plugin's file:line. */
static void np_logger(int level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  if (level == LOG_ABORT) level = LOG_WARN;
  if (level <= LOG_NONE || level > LOG_TRACE || !log_enabled(level, flags ? flags : LOG_NET)) return;
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  log_msg(level, flags ? flags : LOG_NET, file ? file : "net-plugin", line, "%s", buf);
}

static void np_load_once(void) {
  const char* want = param_str(P_NCCL_NET_PLUGIN);
  int explicit = want && *want;
  if (explicit && strcasecmp(want, "none") == 0) {
    INFO(LOG_INIT | LOG_NET, "NET/Plugin: NCCL_NET_PLUGIN=none, no net plugin");
    return;
  }
  char path[512];
  void* dl = NULL;
  char err[256] = "";
  if (!explicit) snprintf(path, sizeof(path), "libnccl-net.so");
  else if (strchr(want, '/')) snprintf(path, sizeof(path), "%s", want);
  else snprintf(path, sizeof(path), "libnccl-net-%s.so", want);
  dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!dl) {
    const char* e = dlerror(); /* copied: a second dlopen may replace it */
    snprintf(err, sizeof(err), "%s", e ? e : "?");
  }
  if (!dl && explicit && !strchr(want, '/')) { /* NCCL also takes the name as a file name */
    snprintf(path, sizeof(path), "%s", want);
    dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  }
  if (!dl) {
    if (explicit)
      WARN("NET/Plugin: cannot load NCCL_NET_PLUGIN=%s (%s); using collie's own network transports", want, err);
    else INFO(LOG_INIT | LOG_NET, "NET/Plugin: no libnccl-net.so found, using collie's own network transports");
    return;
  }
  static const struct {
    const char* sym;
    int version;
  } syms[] = {{"ncclNetPlugin_v10", 10}, {"ncclNetPlugin_v9", 9}, {"ncclNetPlugin_v8", 8}};
  for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]) && !np_table; i++) {
    np_table = dlsym(dl, syms[i].sym);
    if (np_table) np_version = syms[i].version;
  }
  if (!np_table) {
    WARN("NET/Plugin: %s exports none of ncclNetPlugin_v10, _v9, _v8; using collie's own network transports", path);
    goto fail;
  }
  ncclResult_t r = np_version == 10 ? ((const ncclNet_v10_t*)np_table)->init(np_logger, NULL) : NP(init)(np_logger);
  if (r != ncclSuccess) {
    WARN("NET/Plugin: %s (v%d) init failed (error %d); using collie's own network transports", path, np_version,
         (int)r);
    goto fail;
  }
  if (NP(devices)(&np_ndev) != ncclSuccess || np_ndev <= 0) {
    WARN("NET/Plugin: %s (v%d) has no devices; using collie's own network transports", path, np_version);
    goto fail;
  }
  const char* name = NP(name);
  snprintf(np_name, sizeof(np_name), "%s", name && *name ? name : "Plugin");
  INFO(LOG_INIT | LOG_NET, "NET/Plugin: loaded %s (%s, ncclNetPlugin_v%d, %d device%s)", np_name, path, np_version,
       np_ndev, np_ndev == 1 ? "" : "s");
  /* The handle stays open for the life of the process: comms may live until exit. */
  return;
fail:
  np_table = NULL;
  np_version = 0;
  np_ndev = 0;
  dlclose(dl);
}

void net_plugin_load(void) { pthread_once(&np_once, np_load_once); }
const char* net_plugin_name(void) { return np_name; }

/* ---- connectors ------------------------------------------------------------ */

struct np_conn {
  pthread_mutex_t mu; /* plugin calls: progress vs fail from another thread */
  void* listen_comm;  /* receiver, until accepted */
  void* net_comm;     /* the plugin's send or receive comm; NULL until established */
  int dev;
  char handle[NCCL_NET_HANDLE_MAXSIZE]; /* sender: the receiver's handle (connect retries) */
  void* mh;                             /* the slots' registration */
  char* slots;                          /* nslots x stride */
  size_t stride;
  void** req;          /* per slot: its outstanding request */
  int* got;            /* receiver: bytes landed in slot i */
  uint32_t pos;        /* sender: slots committed; receiver: slots consumed */
  uint32_t posted;     /* isends / irecvs handed to the plugin */
  uint32_t done;       /* requests completed, in order */
  int64_t deadline_ms; /* connection must be established by then */
  int failed;
  char why[160];
};

static char* np_slot(struct conn* c, uint32_t i) {
  struct np_conn* s = c->priv;
  return s->slots + (size_t)(i % (uint32_t)c->nslots) * s->stride;
}

static ncclResult_t np_error(struct conn* c, const char* what) {
  struct np_conn* s = c->priv;
  if (!s->failed) snprintf(s->why, sizeof(s->why), "%s", what);
  s->failed = 1;
  NCCLCHECK(comm_await_cause(c->comm, CAUSE_WAIT_MS));
  return err_set(ncclRemoteError, "NET/%s: rank %d: connection with rank %d (%s) failed: %s", np_name, c->comm->rank,
                 c->peer, bootstrap_peer_host(c->comm->bs, c->peer), s->why);
}

/* A receiver's failure only marks the connector (slots landed stay
 * readable; a consumer waiting for more learns it through peer_failed), as
 * with a socket at EOF; a sender's failure is an error at once. */
static ncclResult_t np_fault(struct conn* c, const char* what, ncclResult_t r) {
  struct np_conn* s = c->priv;
  char why[128];
  snprintf(why, sizeof(why), "%s returned %d", what, (int)r);
  if (c->is_send) return np_error(c, why);
  if (!s->failed) snprintf(s->why, sizeof(s->why), "%s", why);
  s->failed = 1;
  return ncclSuccess;
}

/* Finishes connect/accept (plugins may need several calls), then registers
 * the slots. Called with s->mu held. */
static ncclResult_t np_establish(struct conn* c) {
  struct np_conn* s = c->priv;
  ncclResult_t r;
  ncclNetDeviceHandle_v8_t* devh = NULL;
  if (c->is_send) {
    if (np_version == 10) {
      ncclNetCommConfig_v10_t cfg = {-1};
      r = ((const ncclNet_v10_t*)np_table)->connect(s->dev, &cfg, s->handle, &s->net_comm, &devh);
    } else {
      r = NP(connect)(s->dev, s->handle, &s->net_comm, &devh);
    }
    if (r != ncclSuccess) return np_error(c, "connect failed");
  } else {
    r = NP(accept)(s->listen_comm, &s->net_comm, &devh);
    if (r != ncclSuccess) return np_error(c, "accept failed");
  }
  if (!s->net_comm) {
    if (time_ms() > s->deadline_ms) return np_error(c, "connection not established in time");
    return ncclSuccess;
  }
  if (!c->is_send && s->listen_comm) {
    NP(closeListen)(s->listen_comm);
    s->listen_comm = NULL;
  }
  r = NP(regMr)(s->net_comm, s->slots, s->stride * (size_t)c->nslots, NCCL_PTR_HOST, &s->mh);
  if (r != ncclSuccess) {
    s->mh = NULL;
    return np_error(c, "regMr of the slots failed");
  }
  INFO(LOG_NET, "NET/%s: rank %d %s rank %d established (device %d)", np_name, c->comm->rank, c->is_send ? "->" : "<-",
       c->peer, s->dev);
  return ncclSuccess;
}

static ncclResult_t np_isend(struct np_conn* s, void* data, size_t size, void** req) {
  if (np_version == 10)
    return ((const ncclNet_v10_t*)np_table)->isend(s->net_comm, data, size, NP_TAG, s->mh, NULL, req);
  if (np_version == 9) return ((const ncclNet_v9_t*)np_table)->isend(s->net_comm, data, size, NP_TAG, s->mh, req);
  return ((const ncclNet_v8_t*)np_table)->isend(s->net_comm, data, (int)size, NP_TAG, s->mh, req);
}

static ncclResult_t np_irecv(struct np_conn* s, void* data, size_t size, void** req) {
  int tag = NP_TAG;
  void* mh = s->mh;
  if (np_version == 10) {
    void* ph = NULL;
    return ((const ncclNet_v10_t*)np_table)->irecv(s->net_comm, 1, &data, &size, &tag, &mh, &ph, req);
  }
  if (np_version == 9) return ((const ncclNet_v9_t*)np_table)->irecv(s->net_comm, 1, &data, &size, &tag, &mh, req);
  int isize = (int)size;
  return ((const ncclNet_v8_t*)np_table)->irecv(s->net_comm, 1, &data, &isize, &tag, &mh, req);
}

/* Posts what can be posted and completes requests in order. s->mu held. */
static ncclResult_t np_progress_locked(struct conn* c) {
  struct np_conn* s = c->priv;
  if (s->failed) return c->is_send ? np_error(c, s->why) : ncclSuccess;
  if (!s->mh) {
    NCCLCHECK(np_establish(c));
    if (!s->mh) return ncclSuccess;
  }
  uint32_t n = (uint32_t)c->nslots;
  ncclResult_t r;
  if (c->is_send) {
    while (s->posted != s->pos) {
      uint32_t i = s->posted % n;
      const struct slot_hdr* h = (const struct slot_hdr*)np_slot(c, s->posted);
      void* req = NULL;
      if ((r = np_isend(s, np_slot(c, s->posted), NP_HDR_BYTES + h->bytes, &req)) != ncclSuccess)
        return np_fault(c, "isend", r);
      if (!req) break; /* the receiver has no buffer posted yet */
      s->req[i] = req;
      s->posted++;
    }
  } else {
    while (s->posted - s->pos < n) {
      uint32_t i = s->posted % n;
      void* req = NULL;
      if ((r = np_irecv(s, np_slot(c, s->posted), s->stride, &req)) != ncclSuccess) return np_fault(c, "irecv", r);
      if (!req) break;
      s->req[i] = req;
      s->posted++;
    }
  }
  while (s->done != s->posted) {
    uint32_t i = s->done % n;
    int fin = 0, size = 0;
    if ((r = NP(test)(s->req[i], &fin, &size)) != ncclSuccess) return np_fault(c, "test", r);
    if (!fin) break;
    s->req[i] = NULL;
    if (!c->is_send) {
      const struct slot_hdr* h = (const struct slot_hdr*)np_slot(c, s->done);
      if (size < (int)sizeof(*h) || (size_t)size != NP_HDR_BYTES + (size_t)h->bytes)
        return np_fault(c, "a receive of the wrong size", ncclInternalError);
      s->got[i] = size;
    }
    s->done++;
  }
  return ncclSuccess;
}

static ncclResult_t np_progress(struct conn* c) {
  struct np_conn* s = c->priv;
  pthread_mutex_lock(&s->mu);
  ncclResult_t r = np_progress_locked(c);
  pthread_mutex_unlock(&s->mu);
  return r;
}

static void* np_send_slot(struct conn* c, size_t bytes) {
  (void)bytes; /* whole slots: a payload starts at the slot's start */
  struct np_conn* s = c->priv;
  if (!s->mh || s->pos - s->done >= (uint32_t)c->nslots) return NULL;
  return np_slot(c, s->pos) + NP_HDR_BYTES;
}

static ncclResult_t np_send_commit(struct conn* c, const struct slot_hdr* h) {
  struct np_conn* s = c->priv;
  memcpy(np_slot(c, s->pos), h, sizeof(*h));
  s->pos++;
  return np_progress(c);
}

static const void* np_recv_slot(struct conn* c, struct slot_hdr* h) {
  struct np_conn* s = c->priv;
  if (s->done == s->pos) return NULL;
  const char* slot = np_slot(c, s->pos);
  memcpy(h, slot, sizeof(*h));
  return slot + NP_HDR_BYTES;
}

static ncclResult_t np_recv_release(struct conn* c) {
  struct np_conn* s = c->priv;
  s->pos++;
  return np_progress(c); /* reposts the irecv on the freed slot */
}

static void np_wait(struct conn* c, int timeout_ms) {
  (void)c;
  if (timeout_ms > 0) usleep(50); /* plugins are polled through test(), they give no fd */
}

/* Poison: closing our end is what the peer can see (its test() fails), as a
 * socket shut down. Requests still outstanding die with the comm; progress
 * stops at s->failed and never touches them again. */
static void np_fail(struct conn* c) {
  struct np_conn* s = c->priv;
  if (!s) return;
  pthread_mutex_lock(&s->mu);
  if (!s->failed) snprintf(s->why, sizeof(s->why), "failed locally");
  s->failed = 1;
  if (s->net_comm) {
    if (s->mh) NP(deregMr)(s->net_comm, s->mh);
    s->mh = NULL;
    (c->is_send ? NP(closeSend) : NP(closeRecv))(s->net_comm);
    s->net_comm = NULL;
  }
  pthread_mutex_unlock(&s->mu);
}

static int np_pending(struct conn* c) {
  struct np_conn* s = c->priv;
  return c->is_send && !s->failed && s->done != s->pos;
}

static int np_peer_failed(struct conn* c) { return ((struct np_conn*)c->priv)->failed; }

static void np_close(struct conn* c) {
  struct np_conn* s = c->priv;
  if (!s) return;
  pthread_mutex_lock(&s->mu); /* a late np_fail from another thread closes nothing twice */
  if (np_table) {
    if (s->net_comm && s->mh) NP(deregMr)(s->net_comm, s->mh);
    if (s->net_comm) (c->is_send ? NP(closeSend) : NP(closeRecv))(s->net_comm);
    if (s->listen_comm) NP(closeListen)(s->listen_comm);
    s->net_comm = s->listen_comm = s->mh = NULL;
  }
  pthread_mutex_unlock(&s->mu);
  pthread_mutex_destroy(&s->mu);
  free(s->slots);
  free(s->req);
  free(s->got);
  free(s);
  c->priv = NULL;
}

static const struct conn_ops np_ops = {
    .send_slot = np_send_slot,
    .send_commit = np_send_commit,
    .recv_slot = np_recv_slot,
    .recv_release = np_recv_release,
    .progress = np_progress,
    .wait = np_wait,
    .fail = np_fail,
    .pending = np_pending,
    .peer_failed = np_peer_failed,
    .close = np_close,
};

/* Both sides: slots and per-slot requests; the receiver also listens and
 * describes its handle in info (the sender has nothing to say). */
static ncclResult_t np_setup(struct conn* c, void* info, size_t* len) {
  if (!np_table) return err_set(ncclInternalError, "NET/Plugin: no net plugin loaded");
  struct np_conn* s = calloc(1, sizeof(*s));
  if (!s) return err_set(ncclSystemError, "NET/%s: out of memory", np_name);
  pthread_mutex_init(&s->mu, NULL);
  c->priv = s;
  c->ops = &np_ops;
  ncclResult_t res;
  s->dev = c->comm->local_rank % np_ndev;
  s->stride = NP_HDR_BYTES + ((c->slot_bytes + 63) & ~(size_t)63);
  size_t bytes = s->stride * (size_t)c->nslots;
  if (posix_memalign((void**)&s->slots, 4096, bytes) != 0 || !(s->req = calloc((size_t)c->nslots, sizeof(void*))) ||
      !(s->got = calloc((size_t)c->nslots, sizeof(int)))) {
    res = err_set(ncclSystemError, "NET/%s: out of memory for %zu bytes of slots", np_name, bytes);
    goto fail;
  }
  memset(s->slots, 0, bytes);
  int64_t tmo = param_int(P_COLLIE_PEER_TIMEOUT, 0, 1 << 20);
  s->deadline_ms = time_ms() + 1000 * (tmo > 30 ? 2 * tmo : 60);
  *len = 0;
  if (!c->is_send) {
    char handle[NCCL_NET_HANDLE_MAXSIZE];
    memset(handle, 0, sizeof(handle));
    ncclResult_t r = NP(listen)(s->dev, handle, &s->listen_comm);
    if (r != ncclSuccess || !s->listen_comm) {
      s->listen_comm = NULL;
      res = err_set(ncclSystemError, "NET/%s: listen on device %d failed (error %d)", np_name, s->dev, (int)r);
      goto fail;
    }
    memcpy(info, handle, sizeof(handle));
    *len = sizeof(handle);
  }
  return ncclSuccess;
fail:
  np_close(c);
  return res;
}

/* Sender: one connect attempt now, the rest from progress (a plugin's
 * connect may need the receiver's accept, which runs after our ack).
 * Receiver: one accept attempt now, likewise. */
static ncclResult_t np_connect(struct conn* c, const void* peer_info, size_t len) {
  struct np_conn* s = c->priv;
  if (c->is_send) {
    if (len != NCCL_NET_HANDLE_MAXSIZE)
      return err_set(ncclInternalError, "NET/%s: bad connector info (%zu bytes)", np_name, len);
    memcpy(s->handle, peer_info, len);
  }
  pthread_mutex_lock(&s->mu);
  ncclResult_t r = np_establish(c);
  pthread_mutex_unlock(&s->mu);
  return r;
}

static int np_can_connect(struct ncclComm* comm, int peer) {
  (void)comm;
  (void)peer;
  return np_table != NULL;
}

const struct transport transport_netplugin = {
    .name = np_name,
    .caps = TRANSPORT_CAP_PROGRESS | TRANSPORT_CAP_FLUSH | TRANSPORT_CAP_NET,
    .can_connect = np_can_connect,
    .send = {np_setup, np_connect, np_close},
    .recv = {np_setup, np_connect, np_close},
    .ops = &np_ops,
};
