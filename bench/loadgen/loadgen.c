/*
 * loadgen: a low-CPU AMQP 1.0 load generator for the Understudy bench, on proton-C's proactor API.
 *
 *   loadgen send    --url HOST:PORT --address ADDR [--count N] [--window W] [--presettled] [--rate R] ...
 *   loadgen sync    --url HOST:PORT --address ADDR --count N ...      (one message in flight, latency per message)
 *   loadgen receive --url HOST:PORT --address ADDR [--count N] [--credit C] [--progress-ms MS] ...
 *   loadgen hop     [--count N]                                       (loopback TCP ping-pong, 1-byte messages)
 *   loadgen encode  [--size N] [--durable]   (write the encoded message to stdout; for tests)
 *   loadgen stamp                            (read one encoded message on stdin, print its send stamp; for tests)
 *
 * One connection, one session, one link, one thread. Every message is encoded once at start (an optional header
 * section with durable=true, then one data section of --size bytes); before each transfer the first 8 bytes of
 * the body are overwritten with the send time: CLOCK_MONOTONIC in nanoseconds, unsigned 64-bit little-endian.
 * A receiver finds the body (a data section, or an amqp-value section holding binary) and reports end-to-end
 * latency from that stamp (both ends on one machine: CLOCK_MONOTONIC is system-wide).
 *
 * Barrier (--barrier stdin|signal|none): after connecting and attaching (a sender also waits for its first
 * credit) the client prints "READY" on stdout and waits for a line on stdin (stdin) or for SIGUSR1 (signal);
 * the measurement starts when that arrives. A receiver grants its credit only then.
 *
 * Stopping: a sender stops after --count messages (0 = no limit), after --duration seconds, on SIGTERM/SIGINT,
 * or on a line "stop" (or end of file) on stdin once started; it then waits for its outstanding settlements.
 * A receiver stops after --count messages (0 = no limit) or on the same signals/stdin line. --timeout (seconds
 * from process start) gives up: exit 3 with the partial figures.
 *
 * Output: "READY" (with a barrier), "PROGRESS <received> <last receipt, monotonic s>" lines every
 * --progress-ms while it changes (receiver), then one JSON object on one line at the end (see bench/README.md).
 * Exit status: 0 ok, 1 usage, 2 connection/link error (message on stderr and in the JSON "error"), 3 gave up.
 */
#define _GNU_SOURCE
#include <proton/condition.h>
#include <proton/connection.h>
#include <proton/delivery.h>
#include <proton/event.h>
#include <proton/link.h>
#include <proton/message.h>
#include <proton/proactor.h>
#include <proton/sasl.h>
#include <proton/session.h>
#include <proton/terminus.h>
#include <proton/transport.h>

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum mode { MODE_SEND, MODE_SYNC, MODE_RECEIVE, MODE_HOP, MODE_ENCODE, MODE_STAMP };
enum barrier { BARRIER_NONE, BARRIER_STDIN, BARRIER_SIGNAL };
enum { EXIT_OK = 0, EXIT_USAGE = 1, EXIT_CONN = 2, EXIT_GAVE_UP = 3 };

/* ---------------------------------------------------------------------------------------------------------- */
/* options */

typedef struct {
  enum mode mode;
  char host[256], port[32];
  const char *address;
  long count;
  size_t size;
  bool durable, presettled, sasl;
  int window, credit;
  const char *user, *password;
  enum barrier barrier;
  double timeout, duration, rate;
  int progress_ms;
  const char *samples_file;
} options_t;

/* ---------------------------------------------------------------------------------------------------------- */
/* clocks, latency samples */

static inline uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline double ns_to_s(uint64_t ns) { return (double)ns / 1e9; }

static double cpu_seconds(double *utime, double *stime, long *maxrss_kb) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  double u = ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6, s = ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
  if (utime) *utime = u;
  if (stime) *stime = s;
  if (maxrss_kb) *maxrss_kb = ru.ru_maxrss;
  return u + s;
}

typedef struct {
  float *v; /* milliseconds */
  size_t n, cap;
} samples_t;

static void samples_add(samples_t *s, float ms) {
  if (s->n == s->cap) {
    size_t cap = s->cap ? s->cap * 2 : 65536;
    float *v = realloc(s->v, cap * sizeof(float));
    if (!v) return; /* out of memory: drop the sample rather than the run */
    s->v = v;
    s->cap = cap;
  }
  s->v[s->n++] = ms;
}

static int cmp_float(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return (x > y) - (x < y);
}

/* nearest-rank percentile of sorted values (p in 0..100), as bench/stats.py */
static double percentile_sorted(const float *v, size_t n, double p) {
  if (!n) return NAN;
  long k = (long)ceil(p / 100.0 * (double)n) - 1;
  if (k < 0) k = 0;
  if ((size_t)k >= n) k = (long)n - 1;
  return v[k];
}

/* ---------------------------------------------------------------------------------------------------------- */
/* JSON output */

static void json_string(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; ++s) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
    else if (c < 0x20) fprintf(f, "\\u%04x", c);
    else fputc(c, f);
  }
  fputc('"', f);
}

static void json_number(FILE *f, const char *key, double v) {
  if (isnan(v) || isinf(v)) fprintf(f, "\"%s\":null", key);
  else fprintf(f, "\"%s\":%.9g", key, v);
}

/* ---------------------------------------------------------------------------------------------------------- */
/* the message: encoded once, timestamp patched per transfer */

static size_t put_u32be(unsigned char *p, uint32_t v) {
  p[0] = (unsigned char)(v >> 24); p[1] = (unsigned char)(v >> 16); p[2] = (unsigned char)(v >> 8);
  p[3] = (unsigned char)v;
  return 4;
}

/* Encode [header(durable=true)] + data(body of `size` bytes). Returns the length; *stamp_at = offset of the
   body's first byte (where the 8-byte send time goes) or -1 if the body is shorter than 8 bytes. */
static size_t encode_message(unsigned char *out, size_t size, bool durable, long *stamp_at) {
  size_t n = 0;
  if (durable) {
    static const unsigned char header[] = {0x00, 0x53, 0x70, 0xc0, 0x02, 0x01, 0x41}; /* header: list8 [true] */
    memcpy(out, header, sizeof header);
    n += sizeof header;
  }
  out[n++] = 0x00; out[n++] = 0x53; out[n++] = 0x75; /* data section */
  if (size <= 255) {
    out[n++] = 0xa0; out[n++] = (unsigned char)size; /* vbin8 */
  } else {
    out[n++] = 0xb0; n += put_u32be(out + n, (uint32_t)size); /* vbin32 */
  }
  *stamp_at = size >= 8 ? (long)n : -1;
  memset(out + n, 'x', size);
  return n + size;
}

static inline void put_stamp(unsigned char *p, uint64_t t) {
  for (int i = 0; i < 8; ++i) p[i] = (unsigned char)(t >> (8 * i));
}

static inline uint64_t get_stamp(const unsigned char *p) {
  uint64_t t = 0;
  for (int i = 7; i >= 0; --i) t = (t << 8) | p[i];
  return t;
}

static inline uint32_t get_u32be(const unsigned char *p) {
  return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

/* Skip one AMQP-encoded value starting at p; NULL if malformed/truncated. */
static const unsigned char *skip_value(const unsigned char *p, const unsigned char *end) {
  if (p >= end) return NULL;
  unsigned char c = *p++;
  if (c == 0x00) { /* described: descriptor, then value */
    p = skip_value(p, end);
    return p ? skip_value(p, end) : NULL;
  }
  size_t len;
  switch (c >> 4) {
    case 0x4: len = 0; break;
    case 0x5: len = 1; break;
    case 0x6: len = 2; break;
    case 0x7: len = 4; break;
    case 0x8: len = 8; break;
    case 0x9: len = 16; break;
    case 0xa: case 0xc: case 0xe:
      if (p + 1 > end) return NULL;
      len = 1 + (size_t)p[0];
      break;
    case 0xb: case 0xd: case 0xf:
      if (p + 4 > end) return NULL;
      len = 4 + (size_t)get_u32be(p);
      break;
    default: return NULL;
  }
  return (size_t)(end - p) >= len ? p + len : NULL;
}

/* The send stamp of a received message: the first 8 bytes of its body (data section, or amqp-value binary).
   Returns false when there is no such body or it is shorter than 8 bytes. */
static bool find_stamp(const unsigned char *p, size_t n, uint64_t *stamp) {
  const unsigned char *end = p + n;
  while (p < end) {
    if (*p != 0x00) return false; /* every section is a described type */
    const unsigned char *d = p + 1, *v;
    uint64_t code;
    if (d < end && *d == 0x53 && d + 2 <= end) { code = d[1]; v = d + 2; }
    else if (d < end && *d == 0x80 && d + 9 <= end) { code = d[8]; v = d + 9; } /* ulong: low byte suffices */
    else { /* symbolic descriptor: not a section we use */
      v = skip_value(d, end);
      code = 0;
      if (!v) return false;
    }
    if ((code == 0x75 || code == 0x77) && v < end && (*v == 0xa0 || *v == 0xb0)) {
      size_t len, hdr = *v == 0xa0 ? 2 : 5;
      if (v + hdr > end) return false;
      len = *v == 0xa0 ? v[1] : get_u32be(v + 1);
      if (len < 8 || v + hdr + 8 > end) return false;
      *stamp = get_stamp(v + hdr);
      return true;
    }
    p = skip_value(v, end);
    if (!p) return false;
  }
  return false;
}

/* ---------------------------------------------------------------------------------------------------------- */
/* state */

static volatile sig_atomic_t g_stop_signal = 0, g_go_signal = 0;

static void on_stop_signal(int sig) { (void)sig; g_stop_signal = 1; }
static void on_go_signal(int sig) { (void)sig; g_go_signal = 1; }

typedef struct {
  options_t o;
  pn_proactor_t *proactor;
  pn_connection_t *conn;
  pn_link_t *link;
  unsigned char *msg;
  size_t msg_len;
  long stamp_at;
  unsigned char *rx;
  size_t rx_cap;
  /* counters */
  long sent, accepted, other, received, unstamped;
  int inflight;
  long limit; /* sender: stop sending at this many (count, or reduced by stop/duration); 0 = no limit */
  /* lifecycle */
  bool link_up, started, finished, closing, closed, stop_requested, stdin_eof;
  uint64_t t_proc, t_oldest_stamp, t_start, t_end, t_last, t_deadline, t_give_up, t_close_sent, t_sync_sent;
  double cpu0, cpu1, utime0, stime0, utime1, stime1;
  long maxrss_kb;
  long progress_reported;
  samples_t lat;
  const char *lat_kind; /* "settle" (send/sync: send to settlement) or "e2e" (receive: stamp to receipt) */
  char error[1024];
  int exit_code;
  bool quit;
} state_t;

static void set_error(state_t *s, int code, const char *fmt, ...) {
  if (s->error[0]) return; /* keep the first */
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(s->error, sizeof s->error, fmt, ap);
  va_end(ap);
  s->exit_code = code;
  fprintf(stderr, "loadgen: %s\n", s->error);
}

static void start_measuring(state_t *s) {
  s->started = true;
  s->t_start = now_ns();
  s->cpu0 = cpu_seconds(&s->utime0, &s->stime0, NULL);
  s->t_deadline = s->o.duration > 0 ? s->t_start + (uint64_t)(s->o.duration * 1e9) : 0;
}

static void stop_measuring(state_t *s, uint64_t t_end) {
  if (s->finished) return;
  s->finished = true;
  s->t_end = t_end;
  s->cpu1 = cpu_seconds(&s->utime1, &s->stime1, &s->maxrss_kb);
}

static void close_connection(state_t *s) {
  if (s->closing || !s->conn) return;
  s->closing = true;
  s->t_close_sent = now_ns();
  pn_connection_close(s->conn);
}

/* Wait for the go signal of the barrier. Blocking is fine: this process has nothing else to do meanwhile. */
static bool wait_for_go(state_t *s) {
  if (s->o.barrier == BARRIER_NONE) return true;
  printf("READY\n");
  fflush(stdout);
  if (s->o.barrier == BARRIER_SIGNAL) {
    while (!g_go_signal && !g_stop_signal) pause();
    return !g_stop_signal;
  }
  char line[256];
  if (!fgets(line, sizeof line, stdin)) {
    set_error(s, EXIT_CONN, "stdin closed before the go line");
    return false;
  }
  return strncmp(line, "stop", 4) != 0;
}

/* Called when the barrier has been passed (or failed). */
static void begin(state_t *s) {
  if (!wait_for_go(s)) {
    s->stop_requested = true;
    close_connection(s);
    return;
  }
  start_measuring(s);
  if (s->o.mode == MODE_RECEIVE) pn_link_flow(s->link, s->o.credit);
}

static void finish(state_t *s, uint64_t t_end) {
  stop_measuring(s, t_end);
  close_connection(s);
}

/* ---------------------------------------------------------------------------------------------------------- */
/* sender */

static void pump(state_t *s) {
  if (!s->started || s->finished || s->closing) return;
  pn_link_t *l = s->link;
  int window = s->o.mode == MODE_SYNC ? 1 : s->o.window;
  if (s->t_deadline && (s->limit == 0 || s->limit > s->sent) && now_ns() > s->t_deadline)
    s->limit = s->sent ? s->sent : -1;
  long allowed = s->limit;
  if (s->o.rate > 0) {
    long by_rate = (long)(s->o.rate * ns_to_s(now_ns() - s->t_start)) + 1;
    if (allowed == 0 || by_rate < allowed) allowed = by_rate;
  }
  while ((s->o.presettled || s->inflight < window) && (allowed == 0 || s->sent < allowed) && pn_link_credit(l) > 0) {
    if (s->t_deadline && (s->sent & 63) == 0 && now_ns() > s->t_deadline) {
      s->limit = s->sent ? s->sent : -1;
      break;
    }
    uint64_t tag = (uint64_t)s->sent, t = now_ns();
    pn_delivery_t *d = pn_delivery(l, pn_dtag((const char *)&tag, sizeof tag));
    if (s->stamp_at >= 0) put_stamp(s->msg + s->stamp_at, t);
    pn_link_send(l, (const char *)s->msg, s->msg_len);
    pn_link_advance(l);
    s->sent++;
    if (s->o.presettled) {
      pn_delivery_settle(d);
    } else {
      pn_delivery_set_context(d, (void *)(uintptr_t)t);
      s->inflight++;
    }
  }
  bool all_sent = s->limit != 0 && s->sent >= s->limit;
  if (all_sent && (s->o.presettled || s->inflight == 0)) {
    if (s->o.presettled) {
      close_connection(s); /* the broker has read every transfer once it answers the close: t_end then */
    } else {
      finish(s, now_ns());
    }
  }
}

static void on_sender_delivery(state_t *s, pn_delivery_t *d) {
  uint64_t state = pn_delivery_remote_state(d);
  if (!state && !pn_delivery_settled(d)) return;
  uint64_t t = now_ns(), t_sent = (uint64_t)(uintptr_t)pn_delivery_get_context(d);
  if (t_sent) samples_add(&s->lat, (float)((double)(t - t_sent) / 1e6));
  if (state == PN_ACCEPTED) s->accepted++;
  else s->other++;
  pn_delivery_settle(d);
  s->inflight--;
}

/* ---------------------------------------------------------------------------------------------------------- */
/* receiver */

static void on_receiver_delivery(state_t *s, pn_delivery_t *d) {
  if (!pn_delivery_readable(d) || pn_delivery_partial(d)) return;
  pn_link_t *l = pn_delivery_link(d);
  size_t n = pn_delivery_pending(d);
  if (n > s->rx_cap) {
    size_t cap = n * 2;
    unsigned char *rx = realloc(s->rx, cap);
    if (!rx) { set_error(s, EXIT_CONN, "out of memory for a %zu-byte message", n); return; }
    s->rx = rx;
    s->rx_cap = cap;
  }
  ssize_t got = pn_link_recv(l, (char *)s->rx, n);
  pn_link_advance(l);
  uint64_t t = now_ns(), stamp;
  if (got > 0 && find_stamp(s->rx, (size_t)got, &stamp) && stamp <= t && stamp >= s->t_oldest_stamp)
    samples_add(&s->lat, (float)((double)(t - stamp) / 1e6));
  else
    s->unstamped++;
  if (!pn_delivery_settled(d)) pn_delivery_update(d, PN_ACCEPTED);
  pn_delivery_settle(d);
  if (s->finished) return; /* stray deliveries after the stop are accepted but not counted */
  s->received++;
  s->t_last = t;
  if (s->o.count > 0 && s->received >= s->o.count) finish(s, t);
}

static void top_up_credit(state_t *s) {
  if (!s->started || s->finished || s->closing) return;
  int credit = pn_link_credit(s->link), want = s->o.credit;
  if (s->o.count > 0) { /* never ask for more than is left */
    long left = s->o.count - s->received;
    if (left < want) want = (int)left;
  }
  if (credit <= s->o.credit / 2 && want > credit) pn_link_flow(s->link, want - credit);
}

/* ---------------------------------------------------------------------------------------------------------- */
/* events */

static void check_condition(state_t *s, const char *what, pn_condition_t *cond) {
  if (cond && pn_condition_is_set(cond)) {
    const char *desc = pn_condition_get_description(cond);
    set_error(s, EXIT_CONN, "%s: %s%s%s", what, pn_condition_get_name(cond), desc ? ": " : "", desc ? desc : "");
  }
}

static void link_ready(state_t *s) {
  if (s->link_up) return;
  s->link_up = true;
  begin(s);
}

static void handle(state_t *s, pn_event_t *e) {
  switch (pn_event_type(e)) {
    case PN_CONNECTION_INIT: {
      pn_connection_t *c = pn_event_connection(e);
      pn_connection_open(c);
      pn_session_t *ssn = pn_session(c);
      pn_session_open(ssn);
      char name[64];
      snprintf(name, sizeof name, "loadgen-%d", (int)getpid());
      if (s->o.mode == MODE_RECEIVE) {
        s->link = pn_receiver(ssn, name);
        pn_terminus_set_address(pn_link_source(s->link), s->o.address);
      } else {
        s->link = pn_sender(ssn, name);
        pn_terminus_set_address(pn_link_target(s->link), s->o.address);
        if (s->o.presettled) pn_link_set_snd_settle_mode(s->link, PN_SND_SETTLED);
      }
      pn_link_open(s->link);
      break;
    }
    case PN_LINK_REMOTE_OPEN:
      if (s->o.mode == MODE_RECEIVE && pn_event_link(e) == s->link) link_ready(s);
      break;
    case PN_LINK_FLOW:
      if (s->o.mode != MODE_RECEIVE && pn_event_link(e) == s->link && pn_link_credit(s->link) > 0) link_ready(s);
      break;
    case PN_DELIVERY: {
      pn_delivery_t *d = pn_event_delivery(e);
      if (s->o.mode == MODE_RECEIVE) on_receiver_delivery(s, d);
      else on_sender_delivery(s, d);
      break;
    }
    case PN_LINK_REMOTE_CLOSE:
    case PN_LINK_REMOTE_DETACH:
      check_condition(s, "link closed by the peer", pn_link_remote_condition(pn_event_link(e)));
      if (!s->closing) {
        set_error(s, EXIT_CONN, "link closed by the peer");
        close_connection(s);
      }
      break;
    case PN_SESSION_REMOTE_CLOSE:
      check_condition(s, "session closed by the peer", pn_session_remote_condition(pn_event_session(e)));
      if (!s->closing) {
        set_error(s, EXIT_CONN, "session closed by the peer");
        close_connection(s);
      }
      break;
    case PN_CONNECTION_REMOTE_CLOSE:
      check_condition(s, "connection closed by the peer", pn_connection_remote_condition(pn_event_connection(e)));
      if (!s->closing) {
        set_error(s, EXIT_CONN, "connection closed by the peer");
        close_connection(s);
      } else if (s->o.presettled && s->started) {
        stop_measuring(s, now_ns()); /* presettled: the close answer follows every transfer */
      }
      break;
    case PN_TRANSPORT_CLOSED: {
      pn_condition_t *cond = pn_transport_condition(pn_event_transport(e));
      if (!s->finished || !s->closing) check_condition(s, "connection failed", cond);
      if (!s->finished && !s->error[0]) set_error(s, EXIT_CONN, "connection closed before the run finished");
      s->closed = true;
      s->quit = true;
      break;
    }
    default:
      break;
  }
}

/* After every batch of connection events: send what the window allows, top up credit, act on a stop. */
static void after_connection_batch(state_t *s) {
  if (s->stop_requested && s->started && !s->finished && !s->closing) {
    if (s->o.mode == MODE_RECEIVE) {
      finish(s, s->t_last ? s->t_last : now_ns());
    } else if (s->limit == 0 || s->limit > s->sent) {
      s->limit = s->sent ? s->sent : -1; /* send no more; -1: stop before the first */
      if (s->limit < 0) finish(s, now_ns());
    }
  }
  if (s->o.mode == MODE_RECEIVE) top_up_credit(s);
  else pump(s);
}

static void read_stdin_commands(state_t *s) {
  if (s->o.barrier != BARRIER_STDIN || s->stdin_eof || !s->started) return;
  struct pollfd pfd = {.fd = 0, .events = POLLIN};
  while (poll(&pfd, 1, 0) > 0 && (pfd.revents & (POLLIN | POLLHUP))) {
    char line[256];
    ssize_t n = read(0, line, sizeof line - 1);
    if (n <= 0) { s->stdin_eof = true; s->stop_requested = true; return; } /* parent gone: stop */
    line[n] = 0;
    if (strstr(line, "stop")) s->stop_requested = true;
  }
}

static int tick_ms(state_t *s) {
  if (s->o.rate > 0) return 2;
  if (s->o.progress_ms > 0) return s->o.progress_ms;
  return 20;
}

static void on_tick(state_t *s) {
  uint64_t t = now_ns();
  if (g_stop_signal) s->stop_requested = true;
  read_stdin_commands(s);
  if (s->o.progress_ms > 0 && s->received != s->progress_reported) {
    s->progress_reported = s->received;
    printf("PROGRESS %ld %.9f\n", s->received, ns_to_s(s->t_last));
    fflush(stdout);
  }
  if (s->closing && !s->closed && t - s->t_close_sent > 5000000000ull) {
    s->quit = true; /* the peer never answered our close: results are recorded, leave */
    return;
  }
  if (s->t_give_up && t > s->t_give_up) {
    if (!s->finished) stop_measuring(s, s->o.mode == MODE_RECEIVE && s->t_last ? s->t_last : t);
    s->error[0] = 0;
    set_error(s, EXIT_GAVE_UP, "gave up after %.0f s: sent %ld, settled %ld, received %ld%s", s->o.timeout,
              s->sent, s->accepted + s->other, s->received, s->started ? "" : " (never started)");
    s->quit = true;
    return;
  }
  /* let the connection's own batch act (a proactor timeout batch must not touch the connection) */
  if (s->conn && (s->stop_requested || s->o.rate > 0 || s->t_deadline)) pn_connection_wake(s->conn);
  pn_proactor_set_timeout(s->proactor, (pn_millis_t)tick_ms(s));
}

/* ---------------------------------------------------------------------------------------------------------- */
/* result */

static void print_result(state_t *s) {
  if (!s->finished) stop_measuring(s, now_ns());
  size_t nlat = s->lat.n;
  double mean = NAN, p50 = NAN, p99 = NAN, mx = NAN;
  if (nlat) {
    double sum = 0;
    for (size_t i = 0; i < nlat; ++i) sum += s->lat.v[i];
    mean = sum / (double)nlat;
    if (s->o.samples_file) {
      FILE *f = fopen(s->o.samples_file, "wb");
      if (f) { fwrite(s->lat.v, sizeof(float), nlat, f); fclose(f); }
      else fprintf(stderr, "loadgen: cannot write %s: %s\n", s->o.samples_file, strerror(errno));
    }
    qsort(s->lat.v, nlat, sizeof(float), cmp_float);
    p50 = percentile_sorted(s->lat.v, nlat, 50);
    p99 = percentile_sorted(s->lat.v, nlat, 99);
    mx = s->lat.v[nlat - 1];
  }
  static const char *names[] = {"send", "sync", "receive", "hop", "encode", "stamp"};
  FILE *f = stdout;
  fprintf(f, "{\"mode\":\"%s\",\"address\":", names[s->o.mode]);
  json_string(f, s->o.address ? s->o.address : "");
  fprintf(f, ",\"size\":%zu,\"message_bytes\":%zu,\"durable\":%s,\"presettled\":%s,\"window\":%d,\"credit\":%d",
          s->o.size, s->msg_len, s->o.durable ? "true" : "false", s->o.presettled ? "true" : "false",
          s->o.mode == MODE_SYNC ? 1 : s->o.window, s->o.credit);
  fprintf(f, ",\"sent\":%ld,\"accepted\":%ld,\"other_outcomes\":%ld,\"received\":%ld,\"unstamped\":%ld",
          s->sent, s->accepted, s->other, s->received, s->unstamped);
  fprintf(f, ",\"started\":%s,", s->started ? "true" : "false");
  json_number(f, "start", s->started ? ns_to_s(s->t_start) : NAN);
  fputc(',', f);
  json_number(f, "end", s->started ? ns_to_s(s->t_end) : NAN);
  fputc(',', f);
  json_number(f, "last_receive", s->t_last ? ns_to_s(s->t_last) : NAN);
  fputc(',', f);
  json_number(f, "cpu_seconds", s->started ? s->cpu1 - s->cpu0 : 0.0);
  fputc(',', f);
  json_number(f, "utime", s->started ? s->utime1 - s->utime0 : 0.0);
  fputc(',', f);
  json_number(f, "stime", s->started ? s->stime1 - s->stime0 : 0.0);
  fprintf(f, ",\"max_rss_kb\":%ld,\"latency\":\"%s\",\"latency_ms\":", s->maxrss_kb, s->lat_kind);
  if (nlat) {
    fputc('{', f);
    json_number(f, "p50", p50); fputc(',', f);
    json_number(f, "p99", p99); fputc(',', f);
    json_number(f, "mean", mean); fputc(',', f);
    json_number(f, "max", mx);
    fprintf(f, ",\"samples\":%zu}", nlat);
  } else {
    fputs("null", f);
  }
  fputs(",\"error\":", f);
  if (s->error[0]) json_string(f, s->error);
  else fputs("null", f);
  fputs("}\n", f);
  fflush(f);
}

/* ---------------------------------------------------------------------------------------------------------- */
/* hop: loopback TCP ping-pong of 1-byte messages between two processes */

static int run_hop(long count) {
  int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK), .sin_port = 0};
  socklen_t alen = sizeof a;
  if (ls < 0 || bind(ls, (struct sockaddr *)&a, sizeof a) || listen(ls, 1) ||
      getsockname(ls, (struct sockaddr *)&a, &alen)) {
    fprintf(stderr, "loadgen hop: socket: %s\n", strerror(errno));
    return EXIT_CONN;
  }
  fflush(stdout);
  pid_t child = fork();
  if (child < 0) { fprintf(stderr, "loadgen hop: fork: %s\n", strerror(errno)); return EXIT_CONN; }
  if (child == 0) { /* echo */
    close(ls);
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (c < 0 || connect(c, (struct sockaddr *)&a, sizeof a)) _exit(2);
    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    char b;
    while (read(c, &b, 1) == 1)
      if (write(c, &b, 1) != 1) break;
    _exit(0);
  }
  int c = accept(ls, NULL, NULL);
  close(ls);
  if (c < 0) { fprintf(stderr, "loadgen hop: accept: %s\n", strerror(errno)); return EXIT_CONN; }
  setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  samples_t rtt = {0};
  long warmup = count / 10 < 100 ? 100 : count / 10;
  char b = 'x';
  int rc = EXIT_OK;
  double cpu0 = cpu_seconds(NULL, NULL, NULL);
  for (long i = 0; i < warmup + count; ++i) {
    uint64_t t0 = now_ns();
    if (write(c, &b, 1) != 1 || read(c, &b, 1) != 1) {
      fprintf(stderr, "loadgen hop: ping-pong broke after %ld: %s\n", i, strerror(errno));
      rc = EXIT_CONN;
      break;
    }
    if (i >= warmup) samples_add(&rtt, (float)((double)(now_ns() - t0) / 1e3)); /* microseconds */
  }
  double cpu = cpu_seconds(NULL, NULL, NULL) - cpu0;
  close(c);
  waitpid(child, NULL, 0);
  double sum = 0;
  for (size_t i = 0; i < rtt.n; ++i) sum += rtt.v[i];
  qsort(rtt.v, rtt.n, sizeof(float), cmp_float);
  double p50 = percentile_sorted(rtt.v, rtt.n, 50);
  printf("{\"mode\":\"hop\",\"samples\":%zu,\"rtt_us\":{", rtt.n);
  json_number(stdout, "p50", p50); fputc(',', stdout);
  json_number(stdout, "p99", percentile_sorted(rtt.v, rtt.n, 99)); fputc(',', stdout);
  json_number(stdout, "min", rtt.n ? rtt.v[0] : NAN); fputc(',', stdout);
  json_number(stdout, "mean", rtt.n ? sum / (double)rtt.n : NAN);
  fputs("},", stdout);
  json_number(stdout, "hop_us", p50 / 2);
  fputc(',', stdout);
  json_number(stdout, "cpu_seconds", cpu);
  printf(",\"error\":%s}\n", rc ? "\"ping-pong broke\"" : "null");
  free(rtt.v);
  return rc;
}

/* ---------------------------------------------------------------------------------------------------------- */
/* encode / stamp: the message format, exposed for the unit tests */

static int run_encode(const options_t *o) {
  unsigned char *m = malloc(o->size + 32);
  long at;
  if (!m) return EXIT_USAGE;
  size_t n = encode_message(m, o->size, o->durable, &at);
  if (at >= 0) put_stamp(m + at, now_ns());
  fwrite(m, 1, n, stdout);
  free(m);
  return EXIT_OK;
}

static int run_stamp(void) {
  size_t cap = 1 << 16, n = 0;
  unsigned char *b = malloc(cap);
  size_t got;
  while (b && (got = fread(b + n, 1, cap - n, stdin)) > 0) {
    n += got;
    if (n == cap) b = realloc(b, cap *= 2);
  }
  if (!b) return EXIT_USAGE;
  uint64_t stamp;
  if (find_stamp(b, n, &stamp)) printf("{\"stamp\":%llu,\"now\":%llu}\n", (unsigned long long)stamp,
                                       (unsigned long long)now_ns());
  else printf("{\"stamp\":null}\n");
  free(b);
  return EXIT_OK;
}

/* ---------------------------------------------------------------------------------------------------------- */
/* main */

static void usage(FILE *f) {
  fputs(
      "usage: loadgen send|sync|receive|hop|encode|stamp [options]\n"
      "  --url HOST:PORT        broker address [127.0.0.1:5672]\n"
      "  --address ADDR         link target (send, sync) or source (receive)\n"
      "  --count N              messages to send / receive; 0 = until stopped [send/sync 10000, receive 0]\n"
      "  --size BYTES           message body size; the first 8 bytes carry the send time [128]\n"
      "  --durable              header durable=true\n"
      "  --window W             unsettled deliveries in flight (send) [200]\n"
      "  --presettled           send pre-settled (no confirmation; ends when the broker answers the close)\n"
      "  --rate R               at most R messages per second (send) [unlimited]\n"
      "  --duration S           stop sending after S seconds (count still caps)\n"
      "  --credit C             receiver credit window, topped up at half [200]\n"
      "  --user U --password P  SASL PLAIN (otherwise SASL ANONYMOUS)\n"
      "  --no-sasl              no SASL layer at all\n"
      "  --barrier stdin|signal|none  print READY once attached, start on a stdin line / SIGUSR1 [none]\n"
      "  --timeout S            give up S seconds after start: exit 3 with partial figures [600]\n"
      "  --progress-ms MS       receiver: print PROGRESS <received> <last receipt> every MS ms [0 = never]\n"
      "  --samples-file PATH    write the latency samples (float32 ms, native order) to PATH\n",
      f);
}

static bool parse_url(const char *url, char *host, size_t hl, char *port, size_t pl) {
  const char *u = strstr(url, "://");
  u = u ? u + 3 : url;
  const char *at = strrchr(u, '@');
  if (at) u = at + 1;
  const char *colon = strrchr(u, ':');
  if (!colon) {
    snprintf(host, hl, "%s", u);
    snprintf(port, pl, "5672");
  } else {
    snprintf(host, hl, "%.*s", (int)(colon - u), u);
    snprintf(port, pl, "%s", colon + 1);
  }
  return host[0] && port[0];
}

static int parse_options(int argc, char **argv, options_t *o) {
  memset(o, 0, sizeof *o);
  o->count = -1;
  o->size = 128;
  o->window = 200;
  o->credit = 200;
  o->sasl = true;
  o->timeout = 600;
  snprintf(o->host, sizeof o->host, "127.0.0.1");
  snprintf(o->port, sizeof o->port, "5672");
  if (argc < 2) { usage(stderr); return EXIT_USAGE; }
  const char *m = argv[1];
  if (!strcmp(m, "send")) o->mode = MODE_SEND;
  else if (!strcmp(m, "sync")) o->mode = MODE_SYNC;
  else if (!strcmp(m, "receive")) o->mode = MODE_RECEIVE;
  else if (!strcmp(m, "hop")) o->mode = MODE_HOP;
  else if (!strcmp(m, "encode")) o->mode = MODE_ENCODE;
  else if (!strcmp(m, "stamp")) o->mode = MODE_STAMP;
  else if (!strcmp(m, "-h") || !strcmp(m, "--help")) { usage(stdout); exit(0); }
  else { fprintf(stderr, "loadgen: unknown mode %s\n", m); usage(stderr); return EXIT_USAGE; }
  static const struct option longopts[] = {
      {"url", required_argument, 0, 'u'},        {"address", required_argument, 0, 'a'},
      {"count", required_argument, 0, 'n'},      {"size", required_argument, 0, 's'},
      {"durable", no_argument, 0, 'd'},          {"window", required_argument, 0, 'w'},
      {"presettled", no_argument, 0, 'P'},       {"rate", required_argument, 0, 'r'},
      {"duration", required_argument, 0, 'D'},   {"credit", required_argument, 0, 'c'},
      {"user", required_argument, 0, 'U'},       {"password", required_argument, 0, 'p'},
      {"no-sasl", no_argument, 0, 'N'},          {"barrier", required_argument, 0, 'b'},
      {"timeout", required_argument, 0, 't'},    {"progress-ms", required_argument, 0, 'g'},
      {"samples-file", required_argument, 0, 'f'}, {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0}};
  int c;
  optind = 2;
  while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
    char *end = NULL;
    switch (c) {
      case 'u':
        if (!parse_url(optarg, o->host, sizeof o->host, o->port, sizeof o->port)) {
          fprintf(stderr, "loadgen: bad --url %s\n", optarg);
          return EXIT_USAGE;
        }
        break;
      case 'a': o->address = optarg; break;
      case 'n': o->count = strtol(optarg, &end, 10); break;
      case 's': o->size = (size_t)strtoul(optarg, &end, 10); break;
      case 'd': o->durable = true; break;
      case 'w': o->window = (int)strtol(optarg, &end, 10); break;
      case 'P': o->presettled = true; break;
      case 'r': o->rate = strtod(optarg, &end); break;
      case 'D': o->duration = strtod(optarg, &end); break;
      case 'c': o->credit = (int)strtol(optarg, &end, 10); break;
      case 'U': o->user = optarg; break;
      case 'p': o->password = optarg; break;
      case 'N': o->sasl = false; break;
      case 'b':
        if (!strcmp(optarg, "stdin")) o->barrier = BARRIER_STDIN;
        else if (!strcmp(optarg, "signal")) o->barrier = BARRIER_SIGNAL;
        else if (!strcmp(optarg, "none")) o->barrier = BARRIER_NONE;
        else { fprintf(stderr, "loadgen: --barrier stdin|signal|none\n"); return EXIT_USAGE; }
        break;
      case 't': o->timeout = strtod(optarg, &end); break;
      case 'g': o->progress_ms = (int)strtol(optarg, &end, 10); break;
      case 'f': o->samples_file = optarg; break;
      case 'h': usage(stdout); exit(0);
      default: usage(stderr); return EXIT_USAGE;
    }
    if (end && *end) { fprintf(stderr, "loadgen: bad number %s\n", optarg); return EXIT_USAGE; }
  }
  if (optind < argc) { fprintf(stderr, "loadgen: unexpected argument %s\n", argv[optind]); return EXIT_USAGE; }
  if (o->count < 0) o->count = o->mode == MODE_RECEIVE ? 0 : 10000;
  if (o->mode <= MODE_RECEIVE && !o->address) { fprintf(stderr, "loadgen: --address is required\n"); return EXIT_USAGE; }
  if (o->window < 1 || o->credit < 1 || o->size > 100000000) {
    fprintf(stderr, "loadgen: --window and --credit must be >= 1, --size <= 1e8\n");
    return EXIT_USAGE;
  }
  if (o->user && !o->password) o->password = "";
  return EXIT_OK;
}

int main(int argc, char **argv) {
  static state_t st;
  state_t *s = &st;
  int rc = parse_options(argc, argv, &s->o);
  if (rc) return rc;
  if (s->o.mode == MODE_HOP) return run_hop(s->o.count > 0 ? s->o.count : 10000);
  if (s->o.mode == MODE_ENCODE) return run_encode(&s->o);
  if (s->o.mode == MODE_STAMP) return run_stamp();

  struct sigaction sa = {0};
  sa.sa_flags = SA_RESTART;
  sa.sa_handler = on_stop_signal;
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGUSR2, &sa, NULL);
  sa.sa_handler = on_go_signal;
  sigaction(SIGUSR1, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);

  s->t_proc = now_ns();
  /* a stamp older than an hour before this process is not one of the bench's (CLOCK_MONOTONIC counts from boot:
     on a machine up for less than an hour, any stamp since boot) */
  s->t_oldest_stamp = s->t_proc > 3600000000000ull ? s->t_proc - 3600000000000ull : 0;
  s->t_give_up = s->o.timeout > 0 ? s->t_proc + (uint64_t)(s->o.timeout * 1e9) : 0;
  s->limit = s->o.mode == MODE_RECEIVE ? 0 : s->o.count;
  s->lat_kind = s->o.mode == MODE_RECEIVE ? "e2e" : "settle";
  s->msg = malloc(s->o.size + 32);
  if (!s->msg) { fprintf(stderr, "loadgen: out of memory\n"); return EXIT_USAGE; }
  s->msg_len = encode_message(s->msg, s->o.size, s->o.durable, &s->stamp_at);

  s->proactor = pn_proactor();
  s->conn = pn_connection();
  pn_connection_set_container(s->conn, "understudy-loadgen");
  pn_transport_t *t = pn_transport();
  if (s->o.sasl) {
    pn_sasl_t *sasl = pn_sasl(t);
    if (s->o.user) {
      pn_connection_set_user(s->conn, s->o.user);
      pn_connection_set_password(s->conn, s->o.password);
      pn_sasl_allowed_mechs(sasl, "PLAIN");
      pn_sasl_set_allow_insecure_mechs(sasl, true);
    } else {
      pn_sasl_allowed_mechs(sasl, "ANONYMOUS");
    }
  }
  char addr[PN_MAX_ADDR];
  pn_proactor_addr(addr, sizeof addr, s->o.host, s->o.port);
  pn_proactor_connect2(s->proactor, s->conn, t, addr);
  pn_proactor_set_timeout(s->proactor, (pn_millis_t)tick_ms(s));

  while (!s->quit) {
    pn_event_batch_t *batch = pn_proactor_wait(s->proactor);
    pn_event_t *e;
    bool connection_batch = false, tick = false;
    while ((e = pn_event_batch_next(batch))) {
      if (pn_event_type(e) == PN_PROACTOR_TIMEOUT) { tick = true; continue; }
      if (pn_event_connection(e)) connection_batch = true;
      handle(s, e);
    }
    if (connection_batch && !s->closed) after_connection_batch(s);
    if (tick && !s->quit) on_tick(s);
    pn_proactor_done(s->proactor, batch);
  }
  print_result(s);
  /* no pn_proactor_free: the process ends here (freeing a proactor with a half-closed connection can block) */
  return s->exit_code;
}
