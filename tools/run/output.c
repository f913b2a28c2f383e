/* collie-run --tag-output: each rank's stdout and stderr come through a pipe
 * and go out line by line with a "[RANK] " prefix, lines of different ranks
 * never mixed. supervise.c polls the pipes and calls stream_read. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "run.h"

/* An unfinished line is held in a buffer that starts small and grows up to
 * the maximum; a longer line is passed on in pieces (see stream_flush_lines).
 * Small start: 4096 ranks x 2 streams add up. */
#define STREAM_BUF_MIN 1024
#define STREAM_BUF_MAX (64 * 1024)
/* At the end, read at most this many buffers per stream, so a grandchild that
 * keeps writing into an inherited pipe cannot hold the launcher forever. */
#define DRAIN_READS 64

static void stream_close(struct stream* s) {
  if (s->fd >= 0) close(s->fd);
  s->fd = -1;
  free(s->buf);
  s->buf = NULL;
  s->len = 0;
  s->cap = 0;
}

/* A destination we cannot write to any more (e.g. `collie-run ... | head`):
 * close the pipes that feed it, so the ranks get SIGPIPE/EPIPE just as they
 * would have writing there directly. */
static void dest_broken(struct job* job, int dest) {
  job->dest_broken[dest] = true;
  for (int i = 0; i < job->nstreams; i++)
    if (job->streams[i].dest == dest) stream_close(&job->streams[i]);
}

/* Writes [prefix] data [newline] as one unit, so that lines of different ranks
 * never mix below the line level. */
static void stream_emit(struct job* job, struct stream* s, const char* data, size_t len, bool newline) {
  char prefix[24];
  struct iovec iov[3];
  int n = 0;

  if (job->dest_broken[s->dest]) return;
  if (s->line_start) {
    int plen = snprintf(prefix, sizeof(prefix), "[%d] ", s->rank);
    iov[n++] = (struct iovec){.iov_base = prefix, .iov_len = (size_t)plen};
  }
  if (len > 0) iov[n++] = (struct iovec){.iov_base = (void*)data, .iov_len = len};
  if (newline) iov[n++] = (struct iovec){.iov_base = "\n", .iov_len = 1};

  struct iovec* v = iov;
  while (n > 0) {
    ssize_t w = writev(s->dest, v, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      dest_broken(job, s->dest);
      return;
    }
    while (n > 0 && (size_t)w >= v->iov_len) {
      w -= (ssize_t)v->iov_len;
      v++;
      n--;
    }
    if (n > 0) {
      v->iov_base = (char*)v->iov_base + w;
      v->iov_len -= (size_t)w;
    }
  }
}

/* Passes on every complete line in the buffer. A full buffer of one line is
 * passed on as it is, without a newline, and the rest of that line follows
 * without a prefix: no line is too long, at the price that another rank's
 * output may land inside a line longer than STREAM_BUF_MAX. Holding the
 * other ranks back instead could deadlock a job whose ranks wait on each
 * other. */
static void stream_flush_lines(struct job* job, struct stream* s) {
  char* start = s->buf;
  size_t left = s->len;
  char* nl;

  while (left > 0 && (nl = memchr(start, '\n', left)) != NULL) {
    size_t n = (size_t)(nl - start) + 1;
    stream_emit(job, s, start, n, false);
    if (s->fd < 0) return;
    s->line_start = true;
    start += n;
    left -= n;
  }
  if (left == STREAM_BUF_MAX) {
    stream_emit(job, s, start, left, false);
    if (s->fd < 0) return;
    s->line_start = false;
    left = 0;
  }
  memmove(s->buf, start, left);
  s->len = left;
}

/* End of a stream: an unfinished last line is passed on with a newline added,
 * so that the next rank's line starts on a line of its own. */
void stream_finish(struct job* job, struct stream* s) {
  if (s->fd >= 0 && (s->len > 0 || !s->line_start)) stream_emit(job, s, s->buf, s->len, true);
  stream_close(s);
}

/* One read. Returns true if the stream may have more data right now. */
bool stream_read(struct job* job, struct stream* s) {
  if (s->fd < 0) return false;
  if (s->len == s->cap) {
    /* stream_flush_lines leaves a full buffer only below the maximum. */
    size_t cap = s->cap == 0 ? STREAM_BUF_MIN : 2 * s->cap;
    char* buf = realloc(s->buf, cap);
    if (buf == NULL) {
      /* Dropping one rank's output is better than losing the job. */
      fprintf(stderr, "collie-run: out of memory; dropping output of rank %d\n", s->rank);
      stream_close(s);
      return false;
    }
    s->buf = buf;
    s->cap = cap;
  }
  for (;;) {
    ssize_t r = read(s->fd, s->buf + s->len, s->cap - s->len);
    if (r > 0) {
      s->len += (size_t)r;
      stream_flush_lines(job, s);
      return s->fd >= 0;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && errno == EAGAIN) return false;
    stream_finish(job, s); /* EOF, or an error that will not go away */
    return false;
  }
}

void stream_drain(struct job* job, struct stream* s) {
  for (int i = 0; i < DRAIN_READS && stream_read(job, s); i++)
    ;
}
