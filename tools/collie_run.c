/* collie-run: the local launcher. Forks N ranks of a program on this host with
 * the environment that collie's bootstrap (src/bootstrap) reads -- COLLIE_RANK,
 * COLLIE_SIZE, NCCL_COMM_ID, COLLIE_BOOTSTRAP_SECRET -- and supervises them:
 * one failed rank stops the whole job. With --elastic it instead serves the
 * elastic rendezvous store (src/elastic/store.c, the only library code it
 * uses), restarts failed workers and lets the job go on without them. */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* pipe2, strsignal, signalfd, getrandom */
#endif

#include <ctype.h>
#include <stdarg.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "elastic/store.h"

#ifndef COLLIE_VERSION
#define COLLIE_VERSION "0.1.0"
#endif

/* Enough for any single host; mostly a guard against a typo such as -n 40000
 * turning into a fork bomb. */
#define MAX_RANKS 4096
/* How long ranks get between SIGTERM and SIGKILL. */
#define KILL_GRACE_MS 3000
/* After SIGKILL, how long to wait for helpers a rank left behind to die, so
 * that we reap them instead of leaving zombies to an init that may not. */
#define REAP_GRACE_MS 1000
/* --tag-output holds an unfinished line in a buffer that starts small and
 * grows up to the maximum; a longer line is passed on in pieces (see
 * stream_flush_lines). Small start: 4096 ranks x 2 streams add up. */
#define STREAM_BUF_MIN 1024
#define STREAM_BUF_MAX (64 * 1024)
/* At the end, read at most this many buffers per stream, so a grandchild that
 * keeps writing into an inherited pipe cannot hold the launcher forever. */
#define DRAIN_READS 64
#define SECRET_BYTES 16

#define EXIT_FAILED 1
#define EXIT_USAGE 2
#define EXIT_TIMEOUT 124
#define EXIT_EXEC 127

/* Variables the launcher owns; -x may not set them, since a rank that saw a
 * different COLLIE_SIZE than its peers would hang in the bootstrap. */
static const char *const reserved_vars[] = {
    "COLLIE_RANK", "COLLIE_SIZE", "COLLIE_LOCAL_RANK", "COLLIE_LOCAL_SIZE",
    "COLLIE_BOOTSTRAP_SECRET", "COLLIE_RENDEZVOUS", "COLLIE_RENDEZVOUS_SECRET",
    "COLLIE_ELASTIC_SLOT", "COLLIE_ELASTIC_RESTARTS",
};

struct options {
    int nranks;
    bool tag_output;
    long timeout_s; /* 0: no timeout */
    char **extra_env; /* "VAR=VALUE" strings from -x, pointing into argv */
    int n_extra;
    char **prog_argv; /* the program and its arguments, NULL-terminated */
    /* --elastic */
    bool elastic;
    int min, max;
    int reset_limit;     /* -1: none */
    int slot_failures;   /* a slot failing this often is not restarted (0: never excluded) */
    long rdzv_timeout_s;
    long hb_timeout_s;
};

/* One rank's stdout or stderr under --tag-output. */
struct stream {
    int fd;          /* read end of the pipe; -1 once closed */
    int dest;        /* 1 or 2: where the tagged lines go */
    int rank;
    bool line_start; /* the next byte starts a new line and needs a prefix */
    size_t len;
    size_t cap;
    char *buf;       /* allocated on first use */
};

struct job {
    int n;
    int launched;        /* ranks forked so far */
    pid_t *pgid;         /* rank pid == its process-group id; kept after reaping */
    bool *running;       /* not yet reaped */
    int running_count;
    struct stream *streams; /* 2 per rank under --tag-output, else NULL */
    int nstreams;
    struct pollfd *pfd;
    int *pfd_stream;     /* pfd[k] (k >= 1) polls streams[pfd_stream[k]] */
    int sfd;             /* signalfd for SIGCHLD and the forwarded signals */
    bool stopping;       /* SIGTERM has gone out; no more failures reported */
    bool killed;         /* SIGKILL has gone out */
    int64_t kill_at_ms;  /* SIGKILL then; once killed, stop waiting for helpers then */
    int64_t timeout_at_ms; /* 0: none */
    int exit_code;
    bool dest_broken[3];
    /* --elastic */
    struct store *store;
    int *restarts;       /* per slot: workers started in it after the first */
    int *failures;       /* per slot */
    bool finishing;      /* a worker exited with 0: no more restarts */
    bool store_failed;
    int clean_exits;
    int64_t fail_stop_at_ms; /* the store failed the job: stop what is left then */
    const struct options *o;
    const struct saved_state *saved;
};

static int launch_one(struct job *job, const struct options *o, const struct saved_state *saved,
                      int rank);

/* What the launcher changed in its own process, so each child can undo it
 * before exec and the program starts with what the user gave us. */
struct saved_state {
    sigset_t mask;
    struct sigaction pipe_action;
    struct rlimit nofile;
    bool nofile_changed;
    pid_t launcher;
};

static void usage_short(FILE *f)
{
    fprintf(f,
            "usage: collie-run -n N [--tag-output] [--timeout SECONDS] "
            "[-x VAR=VALUE]... [--] program [args...]\n"
            "       collie-run --elastic --min N --max M [-n K] [options] [--] program [args...]\n"
            "Try 'collie-run --help' for more.\n");
}

static void usage_long(void)
{
    printf(
        "usage: collie-run -n N [options] [--] program [args...]\n"
        "\n"
        "Start N ranks of a program on this host and supervise them.\n"
        "\n"
        "Options:\n"
        "  -n, --np N           number of ranks (1..%d); required\n"
        "  --tag-output         prefix every line a rank writes to stdout or\n"
        "                       stderr with \"[RANK] \"\n"
        "  --timeout SECONDS    stop the job if it runs longer than this\n"
        "  -x VAR=VALUE         set VAR for every rank (may be repeated)\n"
        "  -h, --help           show this help and exit\n"
        "  --version            show the version and exit\n"
        "\n"
        "Elastic jobs (programs that use collie_elastic_* or collie.elastic):\n"
        "  --elastic            serve a rendezvous store and keep the job going\n"
        "                       when workers fail (see below)\n"
        "  --min N, --max M     fewest workers the job trains with, most it takes in\n"
        "                       (-n defaults to M: the workers started at first)\n"
        "  --reset-limit K      fail the job when the membership changed more than\n"
        "                       K times (default COLLIE_ELASTIC_RESET_LIMIT, or none)\n"
        "  --slot-failures F    a slot whose worker failed F times is not restarted\n"
        "                       and its workers are refused by the store (default 3;\n"
        "                       0: restart forever)\n"
        "  --rendezvous-timeout S  a rendezvous waits this long for slow workers,\n"
        "                       then goes on with those present (>= --min) or fails\n"
        "                       (default 60)\n"
        "  --heartbeat-timeout S   a worker silent this long is dead (default 10)\n"
        "\n"
        "With --elastic each worker gets COLLIE_RENDEZVOUS (the store's address),\n"
        "COLLIE_RENDEZVOUS_SECRET, COLLIE_ELASTIC_SLOT (0..N-1) and\n"
        "COLLIE_ELASTIC_RESTARTS (how often that slot was restarted); ranks come\n"
        "from the store, epoch by epoch. A worker that fails is restarted in its\n"
        "slot (a new worker that joins the running job) until the slot has failed\n"
        "--slot-failures times. Once a worker exits with 0 nothing is restarted.\n"
        "The job ends when every worker has exited: status 0 if one of them\n"
        "exited with 0 and the store did not fail the job, else 1.\n"
        "\n"
        "Each rank gets COLLIE_RANK, COLLIE_SIZE, COLLIE_LOCAL_RANK,\n"
        "COLLIE_LOCAL_SIZE, COLLIE_BOOTSTRAP_SECRET (a fresh random secret per\n"
        "job) and NCCL_COMM_ID=127.0.0.1:PORT on a free loopback port, unless\n"
        "NCCL_COMM_ID is already set, in which case it is passed on unchanged.\n"
        "Only rank 0 reads the launcher's stdin, and not when it is a terminal.\n"
        "\n"
        "If a rank exits with a non-zero status or is killed by a signal, the\n"
        "other ranks get SIGTERM, then SIGKILL after %d seconds. SIGINT, SIGTERM\n"
        "and SIGHUP sent to collie-run are forwarded to the ranks, with the same\n"
        "escalation to SIGKILL. Ranks run in process groups of their own, so\n"
        "helper processes they start are signalled too.\n"
        "\n"
        "Exit status:\n"
        "  0        every rank exited with status 0\n"
        "  1        a rank exited with a non-zero status (127 from a program\n"
        "           that could not be executed counts too), or collie-run\n"
        "           itself failed\n"
        "  2        usage error\n"
        "  124      --timeout expired\n"
        "  128+S    a rank was killed by signal S, or collie-run received\n"
        "           signal S\n"
        "The first event decides the status; what the other ranks do while\n"
        "being stopped does not change it.\n",
        MAX_RANKS, KILL_GRACE_MS / 1000);
}

__attribute__((format(printf, 1, 2), noreturn)) static void usage_error(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "collie-run: ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    usage_short(stderr);
    exit(EXIT_USAGE);
}

/* Decimal only, no sign, no spaces: "-n 0x10" or "-n ' 4'" are more likely
 * mistakes than intent. */
static bool parse_count(const char *s, long lo, long hi, long *out)
{
    if (!isdigit((unsigned char)s[0]))
        return false;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno != 0 || *end != '\0' || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

static bool valid_env_name(const char *s, size_t len)
{
    if (len == 0 || isdigit((unsigned char)s[0]))
        return false;
    for (size_t i = 0; i < len; i++)
        if (!isalnum((unsigned char)s[i]) && s[i] != '_')
            return false;
    return true;
}

static void check_extra_env(const char *arg)
{
    const char *eq = strchr(arg, '=');
    if (eq == NULL || !valid_env_name(arg, (size_t)(eq - arg)))
        usage_error("-x expects VAR=VALUE, got '%s'", arg);
    for (size_t i = 0; i < sizeof(reserved_vars) / sizeof(reserved_vars[0]); i++) {
        const char *r = reserved_vars[i];
        if ((size_t)(eq - arg) == strlen(r) && strncmp(arg, r, strlen(r)) == 0)
            usage_error("%s is set by collie-run and cannot be given with -x", r);
    }
}

enum {
    OPT_TAG_OUTPUT = 256, OPT_TIMEOUT, OPT_VERSION, OPT_ELASTIC, OPT_MIN, OPT_MAX,
    OPT_RESET_LIMIT, OPT_SLOT_FAILURES, OPT_RDZV_TIMEOUT, OPT_HB_TIMEOUT
};

static void parse_args(int argc, char **argv, struct options *o)
{
    static const struct option long_opts[] = {
        {"np", required_argument, NULL, 'n'},
        {"tag-output", no_argument, NULL, OPT_TAG_OUTPUT},
        {"timeout", required_argument, NULL, OPT_TIMEOUT},
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, OPT_VERSION},
        {"elastic", no_argument, NULL, OPT_ELASTIC},
        {"min", required_argument, NULL, OPT_MIN},
        {"max", required_argument, NULL, OPT_MAX},
        {"reset-limit", required_argument, NULL, OPT_RESET_LIMIT},
        {"slot-failures", required_argument, NULL, OPT_SLOT_FAILURES},
        {"rendezvous-timeout", required_argument, NULL, OPT_RDZV_TIMEOUT},
        {"heartbeat-timeout", required_argument, NULL, OPT_HB_TIMEOUT},
        {NULL, 0, NULL, 0},
    };
    long v;

    memset(o, 0, sizeof(*o));
    o->reset_limit = -1;
    o->slot_failures = 3;
    o->rdzv_timeout_s = 60;
    o->hb_timeout_s = 10;
    const char *rl = getenv("COLLIE_ELASTIC_RESET_LIMIT");
    if (rl != NULL && rl[0] != '\0') {
        if (!parse_count(rl, 0, 1000000, &v))
            usage_error("COLLIE_ELASTIC_RESET_LIMIT must be a whole number, got '%s'", rl);
        o->reset_limit = (int)v;
    }
    o->extra_env = calloc((size_t)argc, sizeof(char *));
    if (o->extra_env == NULL) {
        fprintf(stderr, "collie-run: out of memory\n");
        exit(EXIT_FAILED);
    }
    opterr = 0;
    /* '+': stop at the program name, so its own options stay its own. */
    for (;;) {
        int c = getopt_long(argc, argv, "+:n:x:h", long_opts, NULL);
        if (c == -1)
            break;
        switch (c) {
        case 'n':
            if (!parse_count(optarg, 1, MAX_RANKS, &v))
                usage_error("-n needs a whole number from 1 to %d, got '%s'", MAX_RANKS, optarg);
            o->nranks = (int)v;
            break;
        case OPT_TAG_OUTPUT:
            o->tag_output = true;
            break;
        case OPT_TIMEOUT:
            /* A year is far beyond any test job and keeps the deadline
             * arithmetic in milliseconds well inside 64 bits. */
            if (!parse_count(optarg, 1, 365L * 24 * 3600, &v))
                usage_error("--timeout needs a whole number of seconds >= 1, got '%s'", optarg);
            o->timeout_s = v;
            break;
        case 'x':
            check_extra_env(optarg);
            o->extra_env[o->n_extra++] = optarg;
            break;
        case OPT_ELASTIC:
            o->elastic = true;
            break;
        case OPT_MIN:
        case OPT_MAX:
            if (!parse_count(optarg, 1, EPROTO_MAX_WORKERS, &v))
                usage_error("--%s needs a whole number from 1 to %d, got '%s'",
                            c == OPT_MIN ? "min" : "max", EPROTO_MAX_WORKERS, optarg);
            *(c == OPT_MIN ? &o->min : &o->max) = (int)v;
            break;
        case OPT_RESET_LIMIT:
            if (!parse_count(optarg, 0, 1000000, &v))
                usage_error("--reset-limit needs a whole number, got '%s'", optarg);
            o->reset_limit = (int)v;
            break;
        case OPT_SLOT_FAILURES:
            if (!parse_count(optarg, 0, 1000000, &v))
                usage_error("--slot-failures needs a whole number, got '%s'", optarg);
            o->slot_failures = (int)v;
            break;
        case OPT_RDZV_TIMEOUT:
        case OPT_HB_TIMEOUT:
            if (!parse_count(optarg, 1, 7L * 24 * 3600, &v))
                usage_error("%s needs a whole number of seconds >= 1, got '%s'", argv[optind - 1],
                            optarg);
            *(c == OPT_RDZV_TIMEOUT ? &o->rdzv_timeout_s : &o->hb_timeout_s) = v;
            break;
        case 'h':
            usage_long();
            exit(0);
        case OPT_VERSION:
            printf("collie-run (collie) %s\n", COLLIE_VERSION);
            exit(0);
        case ':':
            usage_error("option '%s' needs a value", argv[optind - 1]);
        default:
            /* optopt is 0 for an unknown long option; the short one may sit
             * inside a cluster such as -tq, so name just the letter. */
            if (optopt != 0)
                usage_error("unknown option '-%c'", optopt);
            usage_error("unknown option '%s'", argv[optind - 1]);
        }
    }
    if (o->elastic) {
        if (o->min == 0 || o->max == 0)
            usage_error("--elastic needs --min N and --max M");
        if (o->min > o->max)
            usage_error("--min (%d) is larger than --max (%d)", o->min, o->max);
        if (o->nranks == 0)
            o->nranks = o->max;
        if (o->nranks < o->min || o->nranks > o->max)
            usage_error("-n %d must lie between --min %d and --max %d", o->nranks, o->min, o->max);
    } else if (o->min || o->max) {
        usage_error("--min and --max need --elastic");
    }
    if (o->nranks == 0)
        usage_error("-n N is required");
    if (optind >= argc)
        usage_error("no program given");
    o->prog_argv = &argv[optind];
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Rank 0's bootstrap binds this port a moment later. Another process could
 * take it in between; the kernel picks bind(0) ports at a random offset in
 * the ephemeral range, so that is rare, and the bootstrap reports it. */
static int free_loopback_port(unsigned *port)
{
    struct sockaddr_in addr;
    socklen_t len = sizeof(addr);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    memset(&addr, 0, sizeof(addr));
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    if (bind(fd, (struct sockaddr *)&addr, sizeof(addr)) != 0 ||
        getsockname(fd, (struct sockaddr *)&addr, &len) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    close(fd);
    *port = ntohs(addr.sin_port);
    return 0;
}

static int make_secret(char hex[2 * SECRET_BYTES + 1])
{
    unsigned char raw[SECRET_BYTES];
    size_t got = 0;
    while (got < sizeof(raw)) {
        ssize_t r = getrandom(raw + got, sizeof(raw) - got, 0);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        got += (size_t)r;
    }
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < sizeof(raw); i++) {
        hex[2 * i] = digits[raw[i] >> 4];
        hex[2 * i + 1] = digits[raw[i] & 0xf];
    }
    hex[2 * SECRET_BYTES] = '\0';
    return 0;
}

/* Everything the ranks share goes into the launcher's own environment; each
 * child then adds only its rank. -x comes first so that -x NCCL_COMM_ID=...
 * counts as "already set". */
static int set_job_env(const struct options *o)
{
    char buf[64];

    for (int i = 0; i < o->n_extra; i++) {
        const char *arg = o->extra_env[i];
        const char *eq = strchr(arg, '=');
        char *name = strndup(arg, (size_t)(eq - arg));
        if (name == NULL || setenv(name, eq + 1, 1) != 0) {
            fprintf(stderr, "collie-run: cannot set %s: %s\n", arg, strerror(errno));
            free(name);
            return -1;
        }
        free(name);
    }

    if (o->elastic) {
        /* Every epoch's rank 0 makes a fresh unique ID; a fixed root address
         * would be shared by consecutive epochs. */
        unsetenv("NCCL_COMM_ID");
        unsetenv("COLLIE_BOOTSTRAP_SECRET");
        return 0;
    }

    const char *comm_id = getenv("NCCL_COMM_ID");
    if (comm_id == NULL || comm_id[0] == '\0') {
        unsigned port;
        if (free_loopback_port(&port) != 0) {
            fprintf(stderr, "collie-run: cannot find a free port on 127.0.0.1: %s\n",
                    strerror(errno));
            return -1;
        }
        snprintf(buf, sizeof(buf), "127.0.0.1:%u", port);
        if (setenv("NCCL_COMM_ID", buf, 1) != 0)
            goto env_fail;
    }

    char secret[2 * SECRET_BYTES + 1];
    if (make_secret(secret) != 0) {
        fprintf(stderr, "collie-run: cannot get random bytes for the job secret: %s\n",
                strerror(errno));
        return -1;
    }
    snprintf(buf, sizeof(buf), "%d", o->nranks);
    if (setenv("COLLIE_BOOTSTRAP_SECRET", secret, 1) != 0 ||
        setenv("COLLIE_SIZE", buf, 1) != 0 || setenv("COLLIE_LOCAL_SIZE", buf, 1) != 0)
        goto env_fail;
    return 0;

env_fail:
    fprintf(stderr, "collie-run: cannot set the environment: %s\n", strerror(errno));
    return -1;
}

/* The pipes below must never land on 0, 1 or 2, and a rank must not inherit a
 * closed standard descriptor; /dev/null stands in for any that are missing. */
static void ensure_std_fds(void)
{
    for (int fd = 0; fd < 3; fd++) {
        if (fcntl(fd, F_GETFD) >= 0 || errno != EBADF)
            continue;
        int nfd = open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
        if (nfd >= 0 && nfd != fd) {
            dup2(nfd, fd);
            close(nfd);
        }
    }
}

/* ---- --tag-output ------------------------------------------------------ */

static void stream_close(struct stream *s)
{
    if (s->fd >= 0)
        close(s->fd);
    s->fd = -1;
    free(s->buf);
    s->buf = NULL;
    s->len = 0;
    s->cap = 0;
}

/* A destination we cannot write to any more (e.g. `collie-run ... | head`):
 * close the pipes that feed it, so the ranks get SIGPIPE/EPIPE just as they
 * would have writing there directly. */
static void dest_broken(struct job *job, int dest)
{
    job->dest_broken[dest] = true;
    for (int i = 0; i < job->nstreams; i++)
        if (job->streams[i].dest == dest)
            stream_close(&job->streams[i]);
}

/* Writes [prefix] data [newline] as one unit, so that lines of different ranks
 * never mix below the line level. */
static void stream_emit(struct job *job, struct stream *s, const char *data, size_t len,
                        bool newline)
{
    char prefix[24];
    struct iovec iov[3];
    int n = 0;

    if (job->dest_broken[s->dest])
        return;
    if (s->line_start) {
        int plen = snprintf(prefix, sizeof(prefix), "[%d] ", s->rank);
        iov[n++] = (struct iovec){.iov_base = prefix, .iov_len = (size_t)plen};
    }
    if (len > 0)
        iov[n++] = (struct iovec){.iov_base = (void *)data, .iov_len = len};
    if (newline)
        iov[n++] = (struct iovec){.iov_base = "\n", .iov_len = 1};

    struct iovec *v = iov;
    while (n > 0) {
        ssize_t w = writev(s->dest, v, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            dest_broken(job, s->dest);
            return;
        }
        while (n > 0 && (size_t)w >= v->iov_len) {
            w -= (ssize_t)v->iov_len;
            v++;
            n--;
        }
        if (n > 0) {
            v->iov_base = (char *)v->iov_base + w;
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
static void stream_flush_lines(struct job *job, struct stream *s)
{
    char *start = s->buf;
    size_t left = s->len;
    char *nl;

    while (left > 0 && (nl = memchr(start, '\n', left)) != NULL) {
        size_t n = (size_t)(nl - start) + 1;
        stream_emit(job, s, start, n, false);
        if (s->fd < 0)
            return;
        s->line_start = true;
        start += n;
        left -= n;
    }
    if (left == STREAM_BUF_MAX) {
        stream_emit(job, s, start, left, false);
        if (s->fd < 0)
            return;
        s->line_start = false;
        left = 0;
    }
    memmove(s->buf, start, left);
    s->len = left;
}

/* End of a stream: an unfinished last line is passed on with a newline added,
 * so that the next rank's line starts on a line of its own. */
static void stream_finish(struct job *job, struct stream *s)
{
    if (s->fd >= 0 && (s->len > 0 || !s->line_start))
        stream_emit(job, s, s->buf, s->len, true);
    stream_close(s);
}

/* One read. Returns true if the stream may have more data right now. */
static bool stream_read(struct job *job, struct stream *s)
{
    if (s->fd < 0)
        return false;
    if (s->len == s->cap) {
        /* stream_flush_lines leaves a full buffer only below the maximum. */
        size_t cap = s->cap == 0 ? STREAM_BUF_MIN : 2 * s->cap;
        char *buf = realloc(s->buf, cap);
        if (buf == NULL) {
            /* Dropping one rank's output is better than losing the job. */
            fprintf(stderr, "collie-run: out of memory; dropping output of rank %d\n",
                    s->rank);
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
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && errno == EAGAIN)
            return false;
        stream_finish(job, s); /* EOF, or an error that will not go away */
        return false;
    }
}

static void stream_drain(struct job *job, struct stream *s)
{
    for (int i = 0; i < DRAIN_READS && stream_read(job, s); i++)
        ;
}

/* ---- supervision ------------------------------------------------------- */

/* Signals go to each rank's process group, so helpers a rank started (the
 * `sleep` under `sh -c`, a wrapper script's real program) stop with it. A
 * group whose leader was reaped is still signalled: its pgid cannot be handed
 * to a new group while members remain, and once empty the kill fails with
 * ESRCH -- unless the pid wrapped around within these few seconds. */
static void signal_groups(struct job *job, int sig)
{
    for (int i = 0; i < job->launched; i++)
        if (job->pgid[i] > 0)
            kill(-job->pgid[i], sig);
}

static bool groups_alive(const struct job *job)
{
    for (int i = 0; i < job->launched; i++)
        if (job->pgid[i] > 0 && (kill(-job->pgid[i], 0) == 0 || errno == EPERM))
            return true;
    return false;
}

static void kill_job(struct job *job)
{
    signal_groups(job, SIGKILL);
    job->killed = true;
    job->kill_at_ms = now_ms() + REAP_GRACE_MS;
}

static void stop_job(struct job *job, int sig, int exit_code)
{
    if (job->stopping)
        return;
    job->stopping = true;
    job->exit_code = exit_code;
    job->kill_at_ms = now_ms() + KILL_GRACE_MS;
    signal_groups(job, sig);
}

static void report_rank(struct job *job, int rank, pid_t pid, int status)
{
    const char *tail = job->running_count > 0 ? "; stopping the other ranks" : "";
    if (WIFEXITED(status)) {
        fprintf(stderr, "collie-run: rank %d (pid %d) exited with status %d%s\n", rank,
                (int)pid, WEXITSTATUS(status), tail);
        stop_job(job, SIGTERM, EXIT_FAILED);
    } else {
        int sig = WTERMSIG(status);
        fprintf(stderr, "collie-run: rank %d (pid %d) killed by signal %d (%s)%s%s\n", rank,
                (int)pid, sig, strsignal(sig), WCOREDUMP(status) ? ", core dumped" : "",
                tail);
        stop_job(job, SIGTERM, 128 + sig);
    }
}

/* --elastic: a worker's exit is not the end of the job. Its slot is
 * restarted (the new worker joins the running job through the store) until
 * the slot has failed --slot-failures times, the store has failed the job,
 * or some worker has finished (exit 0), which means training is over. */
static void elastic_exited(struct job *job, int slot, pid_t pid, int status)
{
    const struct options *o = job->o;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
        job->clean_exits++;
        job->finishing = true;
        return;
    }
    if (job->stopping)
        return;
    char how[96];
    if (WIFEXITED(status))
        snprintf(how, sizeof(how), "exited with status %d", WEXITSTATUS(status));
    else
        snprintf(how, sizeof(how), "was killed by signal %d (%s)", WTERMSIG(status),
                 strsignal(WTERMSIG(status)));
    job->failures[slot]++;
    if (!job->store_failed && store_failed(job->store, NULL, 0))
        job->store_failed = true;
    const char *verdict;
    bool restart = false;
    if (job->store_failed)
        verdict = "the job has failed; not restarted";
    else if (job->finishing)
        verdict = "the job is finishing; not restarted";
    else if (o->slot_failures > 0 && job->failures[slot] >= o->slot_failures)
        verdict = "the slot is excluded (--slot-failures)";
    else {
        verdict = "restarting the slot";
        restart = true;
    }
    fprintf(stderr, "collie-run: worker in slot %d (pid %d) %s (failure %d of the slot); %s\n",
            slot, (int)pid, how, job->failures[slot], verdict);
    if (restart) {
        job->restarts[slot]++;
        launch_one(job, o, job->saved, slot);
    }
}

static int rank_of(const struct job *job, pid_t pid)
{
    for (int i = 0; i < job->launched; i++)
        if (job->pgid[i] == pid && job->running[i])
            return i;
    return -1;
}

static void reap(struct job *job)
{
    for (;;) {
        int status;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid <= 0)
            return; /* none ready, or ECHILD */
        int r = rank_of(job, pid);
        if (r < 0)
            continue; /* an orphaned grandchild: we are its subreaper */
        job->running[r] = false;
        job->running_count--;
        /* Its last words first, then ours about it. */
        if (job->streams != NULL) {
            stream_drain(job, &job->streams[2 * r]);
            stream_drain(job, &job->streams[2 * r + 1]);
        }
        if (job->o->elastic) {
            elastic_exited(job, r, pid, status);
            continue;
        }
        if (job->stopping || (WIFEXITED(status) && WEXITSTATUS(status) == 0))
            continue;
        report_rank(job, r, pid, status);
    }
}

static void handle_signals(struct job *job)
{
    struct signalfd_siginfo si;
    bool child = false;

    while (read(job->sfd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
        int sig = (int)si.ssi_signo;
        if (sig == SIGCHLD) {
            child = true;
        } else if (!job->stopping) {
            fprintf(stderr, "collie-run: got signal %d (%s); passing it on to the ranks\n",
                    sig, strsignal(sig));
            stop_job(job, sig, 128 + sig);
        }
        /* A repeat does not cut the grace period short: the same signal
         * often arrives twice (timeout(1) sends it to us and to our process
         * group), and the grace period is short anyway. */
    }
    if (child)
        reap(job);
}

static void check_timers(struct job *job, const struct options *o)
{
    int64_t now = now_ms();
    if (o->elastic && !job->stopping) {
        char msg[512];
        if (job->fail_stop_at_ms == 0 && store_failed(job->store, msg, sizeof(msg))) {
            fprintf(stderr, "collie-run: elastic job failed: %s\n", msg);
            job->store_failed = true;
            /* The workers learn it from the store and exit with their own
             * message; whoever is still there after a while is stopped. */
            job->fail_stop_at_ms = now + KILL_GRACE_MS * 5;
        }
        if (job->fail_stop_at_ms != 0 && now >= job->fail_stop_at_ms)
            stop_job(job, SIGTERM, EXIT_FAILED);
    }
    if (!job->stopping && job->timeout_at_ms != 0 && now >= job->timeout_at_ms) {
        fprintf(stderr, "collie-run: timeout: the job ran longer than %ld s; stopping the ranks\n",
                o->timeout_s);
        stop_job(job, SIGTERM, EXIT_TIMEOUT);
    }
    if (job->stopping && !job->killed && now >= job->kill_at_ms)
        kill_job(job);
}

/* Milliseconds until the next timer, or -1. */
static int next_timeout(const struct job *job)
{
    int64_t at = 0;
    if (!job->stopping && job->timeout_at_ms != 0)
        at = job->timeout_at_ms;
    else if (job->stopping && (!job->killed || job->running_count == 0))
        at = job->kill_at_ms;
    /* else: SIGKILL is out and ranks remain; they cannot refuse it, so wait
     * for their SIGCHLD however long the kernel takes. */
    if (at == 0)
        return -1;
    int64_t d = at - now_ms();
    return d < 0 ? 0 : d > INT32_MAX ? INT32_MAX : (int)d;
}

static bool job_done(const struct job *job)
{
    if (job->running_count > 0)
        return false;
    if (!job->stopping)
        return true;
    /* Every rank is gone; what is left of their groups gets the same grace
     * period, then SIGKILL (check_timers), then REAP_GRACE_MS to die.
     * Orphans are our children (subreaper), so their exits wake us up. */
    if (!groups_alive(job))
        return true;
    return job->killed && now_ms() >= job->kill_at_ms;
}

static void supervise(struct job *job, const struct options *o)
{
    while (!job_done(job)) {
        int n = 0;
        job->pfd[n++] = (struct pollfd){.fd = job->sfd, .events = POLLIN};
        for (int i = 0; i < job->nstreams; i++) {
            if (job->streams[i].fd >= 0) {
                job->pfd_stream[n] = i;
                job->pfd[n++] = (struct pollfd){.fd = job->streams[i].fd, .events = POLLIN};
            }
        }

        int tmo = next_timeout(job);
        /* --elastic: look at the store's verdict now and then. */
        if (o->elastic && (tmo < 0 || tmo > 100))
            tmo = 100;
        int r = poll(job->pfd, (nfds_t)n, tmo);
        if (r < 0 && errno != EINTR) {
            /* Cannot happen with valid arguments; stop rather than spin. */
            fprintf(stderr, "collie-run: poll: %s; stopping the ranks\n", strerror(errno));
            stop_job(job, SIGTERM, EXIT_FAILED);
            kill_job(job);
            while (job->running_count > 0 && wait(NULL) > 0)
                job->running_count--;
            return;
        }
        if (r > 0) {
            /* Output before signals, so a rank's last lines precede the
             * message about its exit. stream_read skips a stream that
             * dest_broken closed since the poll. */
            for (int k = 1; k < n; k++)
                if (job->pfd[k].revents != 0)
                    stream_read(job, &job->streams[job->pfd_stream[k]]);
            if (job->pfd[0].revents != 0)
                handle_signals(job);
        }
        check_timers(job, o);
    }
}

/* ---- launching --------------------------------------------------------- */

static void run_child(const struct options *o, const struct saved_state *saved, int rank,
                      int restarts, int out_fd, int err_fd)
{
    char buf[16];

    /* See signal_groups for why each rank leads its own group. Both parent
     * and child call setpgid, so it holds before either side goes on. A side
     * effect: a rank is not in the terminal's foreground group, so Ctrl-C
     * reaches only the launcher, which forwards it once. */
    setpgid(0, 0);
    /* If the launcher dies without cleaning up (SIGKILL, OOM), take the rank
     * down too instead of leaving it blocked in the bootstrap forever. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != saved->launcher)
        _exit(EXIT_FAILED);

    /* A background process group that reads the terminal is stopped by
     * SIGTTIN, so only rank 0 gets stdin, and only if it is not a terminal;
     * several ranks sharing a pipe would each get random pieces of it. */
    if (rank != 0 || isatty(0)) {
        int nfd = open("/dev/null", O_RDONLY);
        if (nfd >= 0) {
            dup2(nfd, 0);
            if (nfd != 0)
                close(nfd);
        }
    }
    if (out_fd >= 0) {
        dup2(out_fd, 1);
        dup2(err_fd, 2);
        /* The originals are O_CLOEXEC; the copies on 1 and 2 are not. */
    }

    snprintf(buf, sizeof(buf), "%d", rank);
    char rbuf[16];
    snprintf(rbuf, sizeof(rbuf), "%d", restarts);
    if (o->elastic ? setenv("COLLIE_ELASTIC_SLOT", buf, 1) != 0 ||
                         setenv("COLLIE_ELASTIC_RESTARTS", rbuf, 1) != 0
                   : setenv("COLLIE_RANK", buf, 1) != 0 || setenv("COLLIE_LOCAL_RANK", buf, 1) != 0) {
        dprintf(2, "collie-run: rank %d: cannot set the environment: %s\n", rank,
                strerror(errno));
        _exit(EXIT_FAILED);
    }

    sigaction(SIGPIPE, &saved->pipe_action, NULL);
    if (saved->nofile_changed)
        setrlimit(RLIMIT_NOFILE, &saved->nofile);
    sigprocmask(SIG_SETMASK, &saved->mask, NULL);

    execvp(o->prog_argv[0], o->prog_argv);
    dprintf(2, "collie-run: cannot execute '%s': %s\n", o->prog_argv[0], strerror(errno));
    _exit(EXIT_EXEC);
}

/* --tag-output needs two descriptors per rank, more than the usual soft limit
 * of 1024 allows at the top of the range; raise it as far as needed (the
 * ranks get the original back). */
static int reserve_fds(int nranks, struct saved_state *saved)
{
    struct rlimit rl = saved->nofile;
    rlim_t need = (rlim_t)nranks * 2 + 32;
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < need) {
        if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < need) {
            fprintf(stderr,
                    "collie-run: --tag-output with %d ranks needs %llu file descriptors, "
                    "but the limit is %llu (see ulimit -n)\n",
                    nranks, (unsigned long long)need, (unsigned long long)rl.rlim_max);
            return -1;
        }
        rl.rlim_cur = need;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0) {
            fprintf(stderr, "collie-run: cannot raise the file descriptor limit: %s\n",
                    strerror(errno));
            return -1;
        }
        saved->nofile_changed = true;
    }
    return 0;
}

static int make_pipe(int *rd, int *wr)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0)
        return -1;
    /* Only our end is non-blocking: a rank must not see EAGAIN on stdout. */
    fcntl(p[0], F_SETFL, fcntl(p[0], F_GETFL) | O_NONBLOCK);
    *rd = p[0];
    *wr = p[1];
    return 0;
}

/* Starts the worker of one rank (or, --elastic, one slot). 0 or -1 (the job is stopping). */
static int launch_one(struct job *job, const struct options *o, const struct saved_state *saved,
                      int rank)
{
    int out_w = -1, err_w = -1;
    if (job->streams != NULL) {
        struct stream *so = &job->streams[2 * rank], *se = &job->streams[2 * rank + 1];
        /* A restarted slot: whatever its predecessor left unread goes first. */
        stream_finish(job, so);
        stream_finish(job, se);
        so->line_start = se->line_start = true;
        if (make_pipe(&so->fd, &out_w) != 0) {
            fprintf(stderr, "collie-run: cannot create a pipe for rank %d: %s\n", rank,
                    strerror(errno));
            stop_job(job, SIGTERM, EXIT_FAILED);
            return -1;
        }
        if (make_pipe(&se->fd, &err_w) != 0) {
            fprintf(stderr, "collie-run: cannot create a pipe for rank %d: %s\n", rank,
                    strerror(errno));
            close(out_w);
            stop_job(job, SIGTERM, EXIT_FAILED);
            return -1;
        }
    }

    pid_t pid = fork();
    if (pid == 0)
        run_child(o, saved, rank, job->restarts ? job->restarts[rank] : 0, out_w, err_w);
    int fork_errno = errno;
    if (out_w >= 0) {
        close(out_w);
        close(err_w);
    }
    if (pid < 0) {
        fprintf(stderr, "collie-run: cannot start rank %d: %s\n", rank, strerror(fork_errno));
        stop_job(job, SIGTERM, EXIT_FAILED);
        return -1;
    }
    setpgid(pid, pid); /* EACCES once the child has exec'd: it did it itself */
    job->pgid[rank] = pid;
    job->running[rank] = true;
    job->running_count++;
    if (job->launched < rank + 1)
        job->launched = rank + 1;
    return 0;
}

static void launch(struct job *job, const struct options *o, const struct saved_state *saved)
{
    for (int rank = 0; rank < job->n; rank++)
        if (launch_one(job, o, saved, rank) != 0)
            return;
}

/* --elastic: the store runs on a thread of this process (started after the
 * signal mask is set, so it inherits it) on a loopback port; the workers
 * find it through COLLIE_RENDEZVOUS. */
static int start_store(struct job *job, const struct options *o)
{
    struct store_opts so;
    char secret[2 * SECRET_BYTES + 1], buf[64];

    memset(&so, 0, sizeof(so));
    so.min = o->min;
    so.max = o->max;
    so.expect = o->nranks;
    so.reset_limit = o->reset_limit;
    so.slot_fail_limit = o->slot_failures;
    so.settle_ms = 500;
    so.rdzv_timeout_ms = o->rdzv_timeout_s * 1000;
    so.hb_timeout_ms = o->hb_timeout_s * 1000;
    so.handshake_ms = 5000;
    so.log_prefix = "collie-run";
    so.bind.sin.sin_family = AF_INET;
    so.bind.sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (make_secret(secret) != 0 || eproto_parse_secret(secret, so.secret) != 0) {
        fprintf(stderr, "collie-run: cannot get random bytes for the job secret: %s\n",
                strerror(errno));
        return -1;
    }
    job->restarts = calloc((size_t)job->n, sizeof(int));
    job->failures = calloc((size_t)job->n, sizeof(int));
    if (job->restarts == NULL || job->failures == NULL) {
        fprintf(stderr, "collie-run: out of memory\n");
        return -1;
    }
    if (store_start(&so, &job->store) != ncclSuccess) {
        fprintf(stderr, "collie-run: cannot start the rendezvous store: %s\n",
                ncclGetLastError(NULL));
        return -1;
    }
    union sock_addr a;
    store_address(job->store, &a);
    snprintf(buf, sizeof(buf), "127.0.0.1:%u", (unsigned)ntohs(a.sin.sin_port));
    if (setenv("COLLIE_RENDEZVOUS", buf, 1) != 0 ||
        setenv("COLLIE_RENDEZVOUS_SECRET", secret, 1) != 0) {
        fprintf(stderr, "collie-run: cannot set the environment: %s\n", strerror(errno));
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    struct options o;
    struct saved_state saved;
    struct job job;
    sigset_t handled;

    parse_args(argc, argv, &o);
    ensure_std_fds();

    memset(&saved, 0, sizeof(saved));
    saved.launcher = getpid();
    getrlimit(RLIMIT_NOFILE, &saved.nofile);
    if (o.tag_output && reserve_fds(o.nranks, &saved) != 0)
        return EXIT_FAILED;

    if (set_job_env(&o) != 0)
        return EXIT_FAILED;

    /* A parent that ignores SIGCHLD would make the kernel reap our ranks
     * before we can see how they ended. */
    signal(SIGCHLD, SIG_DFL);
    /* A closed stdout/stderr must show up as EPIPE in stream_emit, not kill
     * the launcher and orphan the job. */
    struct sigaction ign = {.sa_handler = SIG_IGN};
    sigemptyset(&ign.sa_mask);
    sigaction(SIGPIPE, &ign, &saved.pipe_action);

    /* All signals we react to arrive through a signalfd in the poll loop: no
     * handlers, no races between a signal and going to sleep. Blocked before
     * the first fork, so no rank can exit unnoticed. */
    sigemptyset(&handled);
    sigaddset(&handled, SIGCHLD);
    static const int forwarded[] = {SIGINT, SIGTERM, SIGHUP};
    for (size_t i = 0; i < sizeof(forwarded) / sizeof(forwarded[0]); i++) {
        /* One we were started with ignored (nohup, `cmd &` in a script)
         * stays ignored, for the ranks too: a blocked signal would reach
         * the signalfd even while its disposition is SIG_IGN. */
        struct sigaction cur;
        if (sigaction(forwarded[i], NULL, &cur) == 0 && cur.sa_handler == SIG_IGN)
            continue;
        sigaddset(&handled, forwarded[i]);
    }
    sigprocmask(SIG_BLOCK, &handled, &saved.mask);

    memset(&job, 0, sizeof(job));
    job.n = o.nranks;
    job.sfd = signalfd(-1, &handled, SFD_NONBLOCK | SFD_CLOEXEC);
    if (job.sfd < 0) {
        fprintf(stderr, "collie-run: signalfd: %s\n", strerror(errno));
        return EXIT_FAILED;
    }
    /* Helpers that outlive their rank are re-parented to us rather than to
     * init, so their exits wake the poll loop while the job is stopping. */
    prctl(PR_SET_CHILD_SUBREAPER, 1);

    job.pgid = calloc((size_t)job.n, sizeof(pid_t));
    job.running = calloc((size_t)job.n, sizeof(bool));
    if (o.tag_output) {
        job.nstreams = 2 * job.n;
        job.streams = calloc((size_t)job.nstreams, sizeof(struct stream));
    }
    job.pfd = calloc((size_t)job.nstreams + 1, sizeof(struct pollfd));
    job.pfd_stream = calloc((size_t)job.nstreams + 1, sizeof(int));
    if (job.pgid == NULL || job.running == NULL || job.pfd == NULL || job.pfd_stream == NULL ||
        (o.tag_output && job.streams == NULL)) {
        fprintf(stderr, "collie-run: out of memory\n");
        return EXIT_FAILED;
    }
    for (int i = 0; i < job.nstreams; i++)
        job.streams[i] = (struct stream){
            .fd = -1, .dest = 1 + i % 2, .rank = i / 2, .line_start = true};

    job.o = &o;
    job.saved = &saved;
    if (o.elastic && start_store(&job, &o) != 0)
        return EXIT_FAILED;

    if (o.timeout_s > 0)
        job.timeout_at_ms = now_ms() + o.timeout_s * 1000;
    launch(&job, &o, &saved);
    supervise(&job, &o);
    if (o.elastic) {
        if (!job.store_failed && store_failed(job.store, NULL, 0))
            job.store_failed = true;
        if (job.exit_code == 0 && (job.clean_exits == 0 || job.store_failed)) {
            if (!job.stopping && job.fail_stop_at_ms == 0)
                fprintf(stderr, "collie-run: elastic job failed: %s\n",
                        job.store_failed ? "the store failed it (see above)"
                                         : "no worker finished (every slot failed)");
            job.exit_code = EXIT_FAILED;
        }
        uint32_t epoch = 0, resets = 0;
        store_progress(job.store, &epoch, &resets);
        fprintf(stderr, "collie-run: elastic job ended after %u epoch(s), %u reset(s)\n", epoch,
                resets);
        store_stop(job.store);
        free(job.restarts);
        free(job.failures);
    }

    /* The ranks are gone; what they wrote is already in the pipes. */
    for (int i = 0; i < job.nstreams; i++) {
        stream_drain(&job, &job.streams[i]);
        stream_finish(&job, &job.streams[i]);
    }

    free(job.streams);
    free(job.pfd);
    free(job.pfd_stream);
    free(job.running);
    free(job.pgid);
    free(o.extra_env);
    close(job.sfd);
    return job.exit_code;
}
