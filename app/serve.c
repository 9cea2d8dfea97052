/* serve.c — `cllm serve`: the listening socket, one thread per connection
 * (at most --max-connections; one more gets 503 at once), the routes, and
 * the answers: whole JSON bodies, or server-sent events for "stream": true.
 * Generation runs on the engine thread (serve_engine.c); a connection
 * parses, tokenizes, queues its job and then only waits for text. A client
 * that goes away cancels its job: the scheduler ends those sequences at
 * their next token and frees their blocks.
 *
 * SIGTERM / SIGINT: the socket closes, new requests on open connections
 * get 503, running ones finish (after --grace seconds they are cut short),
 * then the process exits 0. */
#include "app/serve.h"

#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "app/http.h"
#include "app/models.h"
#include "app/serve_engine.h"
#include "base/clock.h"

void serve_options_default(ServeOptions *s) {
    memset(s, 0, sizeof *s);
    s->host = "127.0.0.1";
    s->port = 8080;
    s->max_request_bytes = 1 << 20;
    s->max_connections = 256;
    s->max_seqs = 0;           /* from the KV cache (engine_auto_max_seqs) */
    s->max_batched_tokens = 0; /* engine_auto_max_batched_tokens */
    s->grace_seconds = 30;
}

/* Set by the SIGTERM/SIGINT handler, read by the accept loop: a handler
 * can reach nothing but a global. */
static volatile sig_atomic_t serve_signalled;
static void serve_on_signal(int sig) {
    (void)sig;
    serve_signalled = 1;
}

typedef struct {
    Server *s;
    int fd;
    TextBuf in;                   /* bytes read and not yet consumed */
} Conn;

/* ------------------------------------------------------------ socket I/O */

static int send_all(int fd, const char *p, size_t n) {
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Whether the peer has closed its side (or the connection broke); bytes it
 * sent ahead (a pipelined request) do not count. */
static bool peer_gone(int fd) {
    struct pollfd p = {.fd = fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return false;
    if (p.revents & (POLLERR | POLLHUP | POLLRDHUP)) return true;
    char c;
    return recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

/* Closes after an answer: the client's unread bytes (a body never read, a
 * request sent to a full server) would make close() send a reset, which can
 * destroy the answer before the client reads it; so the write side shuts
 * first and what the client still sends is read and dropped for a moment. */
static void close_gently(int fd) {
    shutdown(fd, SHUT_WR);
    char buf[4096];
    double t0 = now_seconds();
    struct pollfd p = {.fd = fd, .events = POLLIN};
    while (now_seconds() - t0 < 0.5 && poll(&p, 1, 100) > 0 && recv(fd, buf, sizeof buf, MSG_DONTWAIT) > 0) {}
    close(fd);
}

static bool server_stopping(Server *s) {
    pthread_mutex_lock(&s->mu);
    bool st = s->stopping;
    pthread_mutex_unlock(&s->mu);
    return st;
}

/* Writes a whole response: head and body. -1 when the client is gone. */
static int respond(Conn *c, int status, const char *type, const char *body, size_t len, bool keep_alive,
                   const char *extra) {
    TextBuf out = {0};
    int rc = http_put_head(&out, status, type, (long long)len, keep_alive, extra) || textbuf_append(&out, body, len);
    if (!rc) rc = send_all(c->fd, out.data, out.len);
    textbuf_free(&out);
    return rc ? -1 : 0;
}

/* An OpenAI error body with its status. */
static int respond_error(Conn *c, int status, const char *msg, const char *type, const char *param, bool keep_alive) {
    JsonBuf b = {0};
    const char *code = status == 401 ? "invalid_api_key" : status == 404 ? "not_found" : NULL;
    int rc = api_put_error(&b, msg, type, param, code) ? -1
             : respond(c, status, "application/json", b.data, b.len, keep_alive,
                       status == 401 ? "WWW-Authenticate: Bearer\r\n" : NULL);
    jsonbuf_free(&b);
    return rc;
}

/* ------------------------------------------------------------ generation */

static void job_meta(Server *s, const ServeJob *j, char *id, size_t cap, ApiMeta *m) {
    pthread_mutex_lock(&s->mu);
    unsigned long long n = ++s->next_id;
    pthread_mutex_unlock(&s->mu);
    snprintf(id, cap, "%s-%llu", j->req.kind == API_CHAT ? "chatcmpl" : "cmpl", n);
    *m = (ApiMeta){id, s->model_id, (long long)time(NULL), s->rt.model.tok};
}

/* Waits (under mu) up to 250 ms on j; true when its client went away. */
static bool wait_job(Conn *c, ServeJob *j) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 250 * 1000000L;
    if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
    pthread_cond_timedwait(&j->cv, &c->s->mu, &ts);
    return peer_gone(c->fd);
}

/* Sends one "data: ..." event. */
static int send_event(Conn *c, JsonBuf *b) {
    int rc = textbuf_append(b, "\n\n", 2) || send_all(c->fd, "data: ", 6) || send_all(c->fd, b->data, b->len);
    b->len = 0;
    return rc ? -1 : 0;
}

/* A streamed answer: every choice's text as it comes, a last chunk with
 * its finish reason each, usage when asked, then [DONE]. -1 when the
 * client went away (the job is then cancelled by its release). */
static int stream_job(Conn *c, ServeJob *j) {
    Server *s = c->s;
    char id[64];
    ApiMeta m;
    job_meta(s, j, id, sizeof id, &m);
    TextBuf head = {0};
    int rc = http_put_head(&head, 200, "text/event-stream", -1, false, NULL) || send_all(c->fd, head.data, head.len);
    textbuf_free(&head);
    bool first[API_MAX_N], ended[API_MAX_N];
    for (int i = 0; i < j->req.n; i++) first[i] = true, ended[i] = false;
    TextBuf piece[API_MAX_N] = {{0}};
    TokenLogprobs lp[API_MAX_N] = {{0}}; /* each choice's entries taken with its piece */
    JsonBuf b = {0};
    int n_ended = 0, completion = 0;
    while (!rc && n_ended < j->req.n) {
        pthread_mutex_lock(&s->mu);
        bool any = false;
        for (int i = 0; i < j->req.n; i++) any |= j->ch[i].pending.len > 0 || (j->ch[i].done && !ended[i]);
        bool gone = !any && wait_job(c, j);
        bool done[API_MAX_N];
        for (int i = 0; i < j->req.n; i++) { /* take the pending text: the engine appends to an empty buffer */
            TextBuf t = piece[i];
            piece[i] = j->ch[i].pending;
            j->ch[i].pending = t;
            j->ch[i].pending.len = 0;
            for (ServeChoice *ch = &j->ch[i]; !rc && ch->lp_taken < ch->lp.n; ch->lp_taken++) {
                TokenLogprob *e = token_logprobs_push(&lp[i]);
                if (e) *e = ch->lp.v[ch->lp_taken];
                else rc = -1;
            }
            done[i] = j->ch[i].done;
        }
        pthread_mutex_unlock(&s->mu);
        if (gone) { rc = -1; break; }
        for (int i = 0; i < j->req.n && !rc; i++) {
            if (ended[i]) continue;
            /* chat's first chunk names the role even before any text; completions send text only */
            if (piece[i].len > 0 || (first[i] && j->req.kind == API_CHAT)) {
                rc = api_put_chunk(&b, &j->req, &m, i, piece[i].data, piece[i].len, first[i], NULL, lp[i].v, lp[i].n) ||
                     send_event(c, &b);
                first[i] = false;
                lp[i].n = 0;
            }
            if (!rc && done[i]) {
                /* entries whose text the stop matcher held back or cut come with the last chunk */
                rc = api_put_chunk(&b, &j->req, &m, i, "", 0, false, j->ch[i].finish_reason, lp[i].v, lp[i].n) ||
                     send_event(c, &b);
                lp[i].n = 0;
                ended[i] = true;
                n_ended++;
                completion += j->ch[i].completion_tokens;
            }
        }
    }
    if (!rc && j->req.include_usage)
        rc = api_put_usage_chunk(&b, &j->req, &m, (int)j->ids.n, completion) || send_event(c, &b);
    if (!rc) rc = send_all(c->fd, "data: [DONE]\n\n", 14);
    for (int i = 0; i < API_MAX_N; i++) textbuf_free(&piece[i]), token_logprobs_free(&lp[i]);
    jsonbuf_free(&b);
    return rc ? -1 : 0;
}

/* A whole answer once every choice is done. */
static int answer_job(Conn *c, ServeJob *j, bool keep_alive) {
    Server *s = c->s;
    pthread_mutex_lock(&s->mu);
    bool gone = false;
    while (j->n_done < j->req.n && !gone) gone = wait_job(c, j);
    pthread_mutex_unlock(&s->mu);
    if (gone) return -1;
    for (int i = 0; i < j->req.n; i++)
        if (j->ch[i].error[0]) return respond_error(c, 500, j->ch[i].error, "server_error", "", false);
    char id[64];
    ApiMeta m;
    job_meta(s, j, id, sizeof id, &m);
    ApiChoice ch[API_MAX_N];
    int completion = 0;
    for (int i = 0; i < j->req.n; i++) {
        ch[i] = (ApiChoice){j->ch[i].pending.data, j->ch[i].pending.len, j->ch[i].finish_reason, j->ch[i].lp.v,
                            j->ch[i].lp.n};
        completion += j->ch[i].completion_tokens;
    }
    JsonBuf b = {0};
    int rc = api_put_response(&b, &j->req, &m, ch, j->req.n, (int)j->ids.n, completion)
                 ? respond_error(c, 500, "out of memory", "server_error", "", false)
                 : respond(c, 200, "application/json", b.data, b.len, keep_alive, NULL);
    jsonbuf_free(&b);
    return rc;
}

/* POST /v1/chat/completions and /v1/completions. Returns -1 when the
 * connection must close. */
static int handle_generate(Conn *c, const HttpRequest *h, const char *body, ApiKind kind) {
    Server *s = c->s;
    ApiRequest req;
    ApiError ae;
    if (api_parse(body, h->content_length, kind, &req, &ae))
        return respond_error(c, 400, ae.message, "invalid_request_error", ae.param, h->keep_alive);
    TokenIds ids = {0};
    Err err = {{0}};
    if (api_prompt_ids(&req, s->rt.model.tok, &s->tmpl, &ids, &err) || ids.n == 0) {
        api_request_free(&req);
        token_ids_free(&ids);
        return respond_error(c, 400, err.msg[0] ? err.msg : "the prompt is empty after tokenization",
                             "invalid_request_error", kind == API_CHAT ? "messages" : "prompt", h->keep_alive);
    }
    ServeJob *j = serve_job_new(&req, &ids);
    if (!j) {
        api_request_free(&req);
        token_ids_free(&ids);
        return respond_error(c, 500, "out of memory", "server_error", "", false);
    }
    pthread_mutex_lock(&s->mu);
    uint64_t seed = s->so->seed_given ? s->dflt.sampling.seed : s->seed_counter++;
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < j->req.n; i++) api_gen_params(&j->req, &s->dflt, seed, i, &j->params[i]);
    if (serve_job_enqueue(s, j)) {
        serve_job_release(s, j); /* never queued: frees it */
        return respond_error(c, 503, "the server is shutting down", "server_error", "", false);
    }
    pthread_mutex_lock(&s->mu);
    bool gone = false;
    while (!j->submitted && !gone) gone = wait_job(c, j);
    pthread_mutex_unlock(&s->mu);
    int rc = -1;
    if (gone) rc = -1;
    else if (j->submit_error[0])
        rc = respond_error(c, 400, j->submit_error, "invalid_request_error", kind == API_CHAT ? "messages" : "prompt",
                           h->keep_alive);
    else if (j->req.stream) stream_job(c, j); /* an event stream ends with the connection: rc stays -1 */
    else rc = answer_job(c, j, h->keep_alive);
    serve_job_release(s, j);
    return rc;
}

/* ---------------------------------------------------------------- routes */

static bool authorized(const Server *s, const HttpRequest *h) {
    if (!s->so->api_key) return true;
    size_t n, k = strlen(s->so->api_key);
    const char *v = http_header(h, "authorization", &n);
    return v && n == 7 + k && !strncasecmp(v, "Bearer ", 7) && !memcmp(v + 7, s->so->api_key, k);
}

static int handle_models(Conn *c, const HttpRequest *h) {
    JsonBuf b = {0};
    int rc = jsonbuf_printf(&b, "{\"object\":\"list\",\"data\":[{\"id\":") ||
             jsonbuf_put_string(&b, c->s->model_id, strlen(c->s->model_id)) ||
             jsonbuf_printf(&b, ",\"object\":\"model\",\"created\":%lld,\"owned_by\":\"cllm\"}]}", (long long)time(NULL));
    rc = rc ? -1 : respond(c, 200, "application/json", b.data, b.len, h->keep_alive, NULL);
    jsonbuf_free(&b);
    return rc;
}

typedef struct {
    const char *path, *method;
} Route;

static const Route ROUTES[] = {
    {"/v1/chat/completions", "POST"}, {"/v1/completions", "POST"}, {"/v1/models", "GET"},
    {"/health", "GET"}, {"/metrics", "GET"},
};
#define N_ROUTES (int)(sizeof ROUTES / sizeof *ROUTES)

/* Answers one request; -1 when the connection must close. */
static int handle(Conn *c, const HttpRequest *h, const char *body) {
    Server *s = c->s;
    int r = 0;
    while (r < N_ROUTES && !http_path_is(h, ROUTES[r].path)) r++;
    if (r == N_ROUTES) return respond_error(c, 404, "no such endpoint", "invalid_request_error", "", h->keep_alive);
    if (!http_method_is(h, ROUTES[r].method)) {
        char allow[64];
        snprintf(allow, sizeof allow, "Allow: %s\r\n", ROUTES[r].method);
        JsonBuf b = {0};
        int rc = api_put_error(&b, "method not allowed", "invalid_request_error", "", NULL)
                     ? -1 : respond(c, 405, "application/json", b.data, b.len, h->keep_alive, allow);
        jsonbuf_free(&b);
        return rc;
    }
    if (r <= 2 && !authorized(s, h))
        return respond_error(c, 401, "missing or wrong API key (Authorization: Bearer KEY)", "invalid_request_error",
                             "", h->keep_alive);
    if (r == 3) return respond(c, 200, "application/json", "{\"status\":\"ok\"}", 15, h->keep_alive, NULL);
    if (r == 4) {
        TextBuf t = {0};
        int rc = serve_metrics_text(s, &t) ? -1
                 : respond(c, 200, "text/plain; version=0.0.4", t.data, t.len, h->keep_alive, NULL);
        textbuf_free(&t);
        return rc;
    }
    if (r == 2) return handle_models(c, h);
    if (server_stopping(s)) return respond_error(c, 503, "the server is shutting down", "server_error", "", false);
    return handle_generate(c, h, body, r == 0 ? API_CHAT : API_COMPLETIONS);
}

/* Reads until a whole request is in c->in. 1: parsed into *h; 0: the
 * connection ends (closed, idle, stopping); -1: answered with an error. */
static int read_request(Conn *c, HttpRequest *h) {
    Server *s = c->s;
    double t0 = now_seconds();
    char buf[16384];
    bool continued = false;
    for (;;) {
        int status;
        Err err = {{0}};
        if (!c->in.len) memset(h, 0, sizeof *h);
        HttpParse p = c->in.len ? http_parse_request(c->in.data, c->in.len, s->so->max_request_bytes, h, &status, &err)
                                : HTTP_INCOMPLETE;
        if (p == HTTP_COMPLETE) return 1;
        if (p == HTTP_BAD) {
            respond_error(c, status, err.msg, "invalid_request_error", "", false);
            return -1;
        }
        /* curl asks before sending a body over 1 KiB, and waits a second for the answer */
        size_t en;
        const char *ex = p == HTTP_INCOMPLETE && h->header_bytes ? http_header(h, "expect", &en) : NULL;
        if (ex && !continued && en == 12 && !strncasecmp(ex, "100-continue", 12)) {
            continued = true;
            if (send_all(c->fd, "HTTP/1.1 100 Continue\r\n\r\n", 25)) return 0;
        }
        /* idle keep-alive connections and slow senders are let go */
        if (now_seconds() - t0 > (c->in.len ? 30 : 60)) return 0;
        if (c->in.len == 0 && server_stopping(s)) return 0;
        struct pollfd pf = {.fd = c->fd, .events = POLLIN};
        int pr = poll(&pf, 1, 250);
        if (pr < 0 && errno != EINTR) return 0;
        if (pr <= 0) continue;
        ssize_t n = recv(c->fd, buf, sizeof buf, 0);
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (n <= 0 || textbuf_append(&c->in, buf, (size_t)n)) return 0;
    }
}

static void *conn_main(void *arg) {
    Conn *c = arg;
    Server *s = c->s;
    for (;;) {
        HttpRequest h;
        if (read_request(c, &h) <= 0) break;
        const char *body = c->in.data + h.header_bytes;
        if (handle(c, &h, body) || !h.keep_alive) break;
        size_t used = h.header_bytes + h.content_length;
        memmove(c->in.data, c->in.data + used, c->in.len - used);
        c->in.len -= used;
    }
    /* The slot goes back before the client can see the end of its answer
     * (close_gently's FIN), not after its linger: a client that reconnects
     * at once was refused with 503 under a full load. */
    pthread_mutex_lock(&s->mu);
    s->n_conns--;
    pthread_cond_broadcast(&s->conns_cv);
    pthread_mutex_unlock(&s->mu);
    close_gently(c->fd);
    textbuf_free(&c->in);
    free(c);
    return NULL;
}

/* ----------------------------------------------------------------- start */

/* The listening socket on host:port; the port bound in *bound. */
static int listen_on(const char *host, int port, int *bound, Err *err) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    int g = getaddrinfo(host, ps, &hints, &ai);
    if (g) return err_set(err, "--host %s: %s", host, gai_strerror(g));
    int fd = -1, e = 0;
    for (struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        int one = 1;
        if (fd >= 0 && (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) ||
                        bind(fd, a->ai_addr, a->ai_addrlen) || listen(fd, 128))) {
            e = errno;
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(ai);
    if (fd < 0) return err_set(err, "cannot listen on %s:%d: %s", host, port, strerror(e ? e : EINVAL));
    struct sockaddr_storage sa;
    socklen_t len = sizeof sa;
    getsockname(fd, (struct sockaddr *)&sa, &len);
    *bound = ntohs(sa.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&sa)->sin6_port
                                            : ((struct sockaddr_in *)&sa)->sin_port);
    return fd;
}

/* A new connection: its own thread, or 503 when --max-connections are open. */
static void accept_one(Server *s, int lfd) {
    int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0) return;
    struct timeval tv = {.tv_sec = 30}; /* a client that stops reading cannot hold a thread forever */
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    pthread_mutex_lock(&s->mu);
    bool full = s->n_conns >= s->so->max_connections;
    if (!full) s->n_conns++;
    pthread_mutex_unlock(&s->mu);
    Conn *c = full ? NULL : calloc(1, sizeof *c);
    pthread_t t;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    if (c) *c = (Conn){.s = s, .fd = fd};
    if (c && pthread_create(&t, &at, conn_main, c) == 0) { pthread_attr_destroy(&at); return; }
    pthread_attr_destroy(&at);
    Conn tmp = {.s = s, .fd = fd};
    respond_error(&tmp, 503, "too many connections (--max-connections)", "server_error", "", false);
    close_gently(fd);
    if (c) {
        free(c);
        pthread_mutex_lock(&s->mu);
        s->n_conns--;
        pthread_mutex_unlock(&s->mu);
    }
}

/* Accepts until a signal; then stops: the engine finishes (or, after the
 * grace period, cuts short) what runs, the connections write their answers. */
static void serve_loop(Server *s, int lfd) {
    while (!serve_signalled) {
        struct pollfd p = {.fd = lfd, .events = POLLIN};
        if (poll(&p, 1, 200) > 0) accept_one(s, lfd);
    }
    close(lfd);
    fprintf(stderr, "cllm serve: stopping: no new requests; running ones get %d s to finish\n", s->so->grace_seconds);
    pthread_mutex_lock(&s->mu);
    s->stopping = true;
    s->t_stop = now_seconds();
    pthread_cond_broadcast(&s->engine_cv);
    pthread_mutex_unlock(&s->mu);
}

/* The id /v1/models gives: --model-name, else the model file's name
 * without its extension (a folder's own name). */
static void model_id(const ServeOptions *so, const char *path, char *out, size_t cap) {
    if (so->model_name) { snprintf(out, cap, "%s", so->model_name); return; }
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--;
    size_t b = n;
    while (b > 0 && path[b - 1] != '/') b--;
    const char *dot = memchr(path + b, '.', n - b);
    size_t e = dot && dot > path + b ? (size_t)(dot - path) : n;
    snprintf(out, cap, "%.*s", (int)(e - b), path + b);
}

/* Model, template, sampling defaults and schedulers; on failure nothing
 * stays open. */
static int server_open(Server *s, RunOptions *ro, Err *err) {
    if (runtime_open(&s->rt, ro, err)) return -1;
    SchedOptions so = {.max_seqs = s->so->max_seqs, .max_batched_tokens = s->so->max_batched_tokens,
                       .sample_threads = ro->threads, .host_sampling = ro->host_sampling};
    if (app_model_sampling("serve", &s->rt.model, s->so->sampling_given, &ro->sampling, err) ||
        runtime_chat_template(&s->rt, ro->chat_template, &s->tmpl, err)) {
        runtime_close(&s->rt);
        return -1;
    }
    s->dflt = (GenParams){.sampling = ro->sampling, .max_tokens = ro->max_tokens > 0 ? ro->max_tokens : 0,
                           .ignore_eos = ro->ignore_eos};
    if (vengines_init(&s->ve, &s->rt.engine, &so, 0, err)) {
        runtime_close(&s->rt);
        return -1;
    }
    if (ro->verbose) runtime_print_limits("serve", &s->rt, &so, &s->ve.ve[0].o, s->ve.n);
    return 0;
}

int serve_main(const RunOptions *o, const ServeOptions *so) {
    RunOptions ro = *o;
    /* every step holds up to max_batched_tokens rows (the default's largest: the scheduler takes less where the
     * KV cache holds less) */
    ro.prefill_chunk = so->max_batched_tokens > 0 ? so->max_batched_tokens : ENGINE_AUTO_BATCHED_TOKENS;
    if (run_options_serves_stage(&ro)) return runtime_serve_main(&ro, "serve");
    Server *s = calloc(1, sizeof *s);
    if (!s) { fprintf(stderr, "cllm serve: out of memory\n"); return 2; }
    s->o = &ro;
    s->so = so;
    s->seed_counter = (uint64_t)time(NULL) * 1000003u;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->engine_cv, NULL);
    pthread_cond_init(&s->conns_cv, NULL);
    Err err = {{0}};
    int port = 0, lfd = -1, rc = 2;
    bool opened = false;
    pthread_t engine;
    if ((lfd = listen_on(so->host, so->port, &port, &err)) < 0 || server_open(s, &ro, &err)) {
        fprintf(stderr, "cllm serve: %s\n", err.msg);
        if (lfd >= 0) close(lfd);
        goto out;
    }
    opened = true;
    model_id(so, ro.model, s->model_id, sizeof s->model_id);
    /* The signals go to this thread alone (the others block them), so its poll wakes. */
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &block, &old);
    bool started = pthread_create(&engine, NULL, serve_engine_main, s) == 0;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    /* SA_RESETHAND: a second signal ends the process at once (a client that never reads cannot hold it) */
    struct sigaction sa = {.sa_handler = serve_on_signal, .sa_flags = SA_RESETHAND}, old_int, old_term;
    sigemptyset(&sa.sa_mask);
    serve_signalled = 0;
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    if (!started) { fprintf(stderr, "cllm serve: cannot start the engine thread\n"); close(lfd); goto out; }
    fprintf(stderr, "cllm serve: listening on http://%s:%d (model %s; %lld KV tokens, %d sequences at most per step)\n",
            so->host, port, s->model_id, (long long)s->rt.kv_tokens, s->ve.ve[0].o.max_seqs);
    serve_loop(s, lfd);
    pthread_join(engine, NULL);
    /* the connections end once their answers are written (an idle one within 250 ms) */
    pthread_mutex_lock(&s->mu);
    while (s->n_conns > 0) pthread_cond_wait(&s->conns_cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    fprintf(stderr, "cllm serve: stopped\n");
    rc = 0;
out:
    if (opened) {
        vengines_free(&s->ve);
        runtime_close(&s->rt);
    }
    pthread_cond_destroy(&s->conns_cv);
    pthread_cond_destroy(&s->engine_cv);
    pthread_mutex_destroy(&s->mu);
    free(s);
    return rc;
}
