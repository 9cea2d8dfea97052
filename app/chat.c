/* chat.c — the chat loop: read a turn, render the whole conversation with the
 * model's chat template, run it as one request through the scheduler (the
 * same engine as `cllm generate`), stream the reply, print statistics. The
 * prefix cache keeps every full block of earlier turns, so a new turn (or a
 * /regen) prefills only the tokens past the last full block it shares with
 * the conversation so far.
 *
 * Ctrl-C while a reply streams stops that reply (SIGINT only sets a flag the
 * generation loop reads: the one process-wide variable here, as a signal
 * handler needs); Ctrl-C at the prompt discards the line; Ctrl-D or /exit
 * leaves. With stdin not a terminal, each line is one user turn. */
#include "app/chat.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "app/line_edit.h"
#include "app/models.h"
#include "engine/request.h"
#include "engine/scheduler.h"
#include "tokenizer/chat_template.h"

static volatile sig_atomic_t chat_interrupted;

static void chat_on_sigint(int sig) { chat_interrupted = 1; }

typedef struct {
    Runtime rt;
    const RunOptions *o;
    ChatTemplate tmpl;
    ChatMessage *msgs;           /* the conversation; role/content strings owned */
    int n_msgs, cap_msgs;
    bool rt_ready, sched_ready;
    Scheduler sched;
    GenStats last;               /* statistics of the last reply */
    int last_prefilled;          /* prompt tokens the last reply computed (not from the cache) */
    int context_used;            /* tokens of the conversation after the last reply */
    bool tty_out;
    SamplerParams sampling;      /* the command line's, the model's, then cllm's defaults */
    bool seed_given;             /* --seed: reply k uses seed + k (reproducible) */
    uint64_t n_replies;
    unsigned given;              /* SAMPLING_GIVEN_* bits the command line set */
} Chat;

/* A fresh seed for a reply: /dev/urandom, or the clock where it cannot be read. */
static uint64_t chat_fresh_seed(void) {
    uint64_t s = 0;
    FILE *f = fopen("/dev/urandom", "rb");
    if (!f || fread(&s, sizeof s, 1, f) != 1) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        s = (uint64_t)ts.tv_sec * 1000000007u ^ (uint64_t)ts.tv_nsec ^ (uint64_t)getpid() << 32;
    }
    if (f) fclose(f);
    return s;
}

/* While a reply streams, keys typed at a terminal are neither echoed into it
 * nor left for the next prompt; ISIG stays on, so Ctrl-C still stops it. */
typedef struct {
    bool active;
    struct termios saved;
} QuietInput;

static void quiet_input_begin(QuietInput *q) {
    q->active = false;
    if (!isatty(STDIN_FILENO) || tcgetattr(STDIN_FILENO, &q->saved)) return;
    struct termios t = q->saved;
    t.c_lflag &= ~(tcflag_t)(ECHO | ICANON);
    q->active = tcsetattr(STDIN_FILENO, TCSANOW, &t) == 0;
}

static void quiet_input_end(QuietInput *q) {
    if (!q->active) return;
    tcflush(STDIN_FILENO, TCIFLUSH); /* drop what was typed during the reply */
    tcsetattr(STDIN_FILENO, TCSANOW, &q->saved);
}

static int chat_add_message(Chat *c, const char *role, const char *content, size_t len) {
    if (c->n_msgs == c->cap_msgs) {
        int cap = c->cap_msgs ? 2 * c->cap_msgs : 16;
        ChatMessage *m = realloc(c->msgs, cap * sizeof *m);
        if (!m) return -1;
        c->msgs = m;
        c->cap_msgs = cap;
    }
    char *r = strdup(role), *t = strndup(content, len);
    if (!r || !t) { free(r); free(t); return -1; }
    c->msgs[c->n_msgs++] = (ChatMessage){r, t};
    return 0;
}

static void chat_pop_message(Chat *c) {
    c->n_msgs--;
    free((char *)c->msgs[c->n_msgs].role);
    free((char *)c->msgs[c->n_msgs].content);
}

/* Drops every message; keeps (or sets) the system prompt. */
static void chat_reset(Chat *c, const char *system) {
    char *keep = system ? strdup(system) : NULL;
    if (!system && c->n_msgs > 0 && !strcmp(c->msgs[0].role, "system")) keep = strdup(c->msgs[0].content);
    while (c->n_msgs > 0) chat_pop_message(c);
    if (keep && keep[0]) chat_add_message(c, "system", keep, strlen(keep));
    free(keep);
}

static int chat_emit(void *ctx, const char *text, size_t len) {
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return 0;
}

/* Renders messages and tokenizes them: the full prompt for a reply to them. */
static int chat_render_ids(Chat *c, const ChatMessage *msgs, int n, TokenIds *ids, Err *err) {
    const Tokenizer *tok = c->rt.model.tok;
    TextBuf out = {0};
    if (chat_render(&c->tmpl, msgs, n, true, &out, err)) { textbuf_free(&out); return -1; }
    /* The template writes BOS itself where the model wants it. */
    int rc = tokenizer_encode(tok, out.data, out.len, true, false, ids, err);
    textbuf_free(&out);
    return rc;
}

static int chat_prompt_ids(Chat *c, TokenIds *ids, Err *err) { return chat_render_ids(c, c->msgs, c->n_msgs, ids, err); }

/* Tokens a conversation of only this system prompt takes (rendered, with the
 * reply's header): what every turn after /clear starts from. -1 on error. */
static long chat_system_tokens(Chat *c, const char *system, Err *err) {
    ChatMessage m = {"system", system};
    TokenIds ids = {0};
    if (chat_render_ids(c, &m, 1, &ids, err)) { token_ids_free(&ids); return -1; }
    long n = (long)ids.n;
    token_ids_free(&ids);
    return n;
}

/* The system prompt leaves no room for a turn: every turn would fail, and
 * /clear keeps it, so it is refused at once. Returns 0 when it fits. */
static int chat_system_fits(Chat *c, const char *system, const char *source) {
    Err err = {{0}};
    long n = chat_system_tokens(c, system, &err);
    if (n < 0) { fprintf(stderr, "error: %s: %s\n", source, err.msg); return -1; }
    if (n >= c->rt.engine.ctx_limit) {
        fprintf(stderr, "error: %s takes %ld tokens with the chat template, the context holds %d; "
                        "use a shorter system prompt or a larger context (-c)\n", source, n, c->rt.engine.ctx_limit);
        return -1;
    }
    return 0;
}

/* Runs the conversation's prompt as one request until it finishes. */
static SchedRequest *chat_run(Chat *c, const TokenIds *ids, Err *err) {
    GenParams gp = {.sampling = c->sampling, .max_tokens = c->o->max_tokens, .ignore_eos = c->o->ignore_eos};
    gp.sampling.seed = c->seed_given ? c->o->sampling.seed + c->n_replies : chat_fresh_seed();
    c->n_replies++;
    SchedRequest *r = scheduler_submit(&c->sched, ids->ids, (int)ids->n, &gp, NULL, err);
    if (!r) return NULL;
    r->emit = chat_emit;
    r->emit_ctx = c;
    r->interrupt = &chat_interrupted;
    while (!scheduler_idle(&c->sched))
        if (scheduler_step(&c->sched, err)) return NULL; /* the scheduler frees r */
    return scheduler_pop_finished(&c->sched);
}

/* The reply's text (every generated token up to end-of-generation), for the
 * next rendering of the conversation. */
static void chat_keep_reply(Chat *c, const SchedRequest *r) {
    TextBuf text = {0};
    Detok dt;
    detok_init(&dt);
    for (size_t i = r->n_prompt; i < r->tokens.n; i++) {
        char piece[512];
        int32_t id = r->tokens.ids[i];
        if (tokenizer_is_eog(c->rt.model.tok, id)) break;
        int n = detok_push(c->rt.model.tok, &dt, id, piece, sizeof piece);
        textbuf_append(&text, piece, n);
    }
    chat_add_message(c, "assistant", text.data ? text.data : "", text.len);
    textbuf_free(&text);
}

/* One reply to the conversation as it stands. */
static int chat_reply(Chat *c) {
    Engine *e = &c->rt.engine;
    TokenIds ids = {0};
    Err err = {{0}};
    if (chat_prompt_ids(c, &ids, &err)) {
        fprintf(stderr, "error: %s\n", err.msg);
        return -1;
    }
    if ((int)ids.n >= e->ctx_limit) {
        fprintf(stderr, "\n[context full: the conversation needs %zu tokens, the context holds %d; ", ids.n, e->ctx_limit);
        long sys = c->n_msgs > 0 && !strcmp(c->msgs[0].role, "system") ? chat_system_tokens(c, c->msgs[0].content, &err) : -1;
        /* /clear keeps the system prompt: name it when it is a large share. */
        if (sys >= 0) fprintf(stderr, "the system prompt alone takes %ld; /clear starts over keeping it, "
                                      "/system TEXT replaces it, /system alone removes it", sys);
        else fprintf(stderr, "/clear starts over");
        fprintf(stderr, ", -c sets a larger context]\n");
        token_ids_free(&ids);
        return -1;
    }
    chat_interrupted = 0;
    QuietInput q;
    quiet_input_begin(&q);
    SchedRequest *r = chat_run(c, &ids, &err);
    quiet_input_end(&q);
    token_ids_free(&ids);
    if (!r || !strcmp(r->finish_reason, "error")) {
        fprintf(stderr, "\nerror: %s\n", r ? r->error : err.msg);
        sched_request_free(r);
        return -1;
    }
    c->last = (GenStats){r->n_prompt, r->n_generated, 0, r->n_generated ? r->t_first - r->t_submit : 0,
                         r->t_done - r->t_submit, r->finish_reason};
    c->last_prefilled = r->n_prompt - r->cached_tokens;
    c->context_used = (int)r->tokens.n;
    chat_keep_reply(c, r);
    sched_request_free(r);
    printf("\n");
    fflush(stdout); /* before the stats on stderr: the reply ends its line first */
    if (!strcmp(c->last.finish_reason, "interrupted")) fprintf(stderr, "[stopped]\n");
    if (!strcmp(c->last.finish_reason, "context"))
        fprintf(stderr, "[context full (%d tokens): /clear starts over]\n", e->ctx_limit);
    return 0;
}

static void chat_print_stats(const Chat *c, FILE *out) {
    const GenStats *s = &c->last;
    double decode_s = s->total_s - s->ttft_s;
    fprintf(out, "[prompt %d tokens, reply %d tokens, first token %.0f ms, %.1f tokens/s, context %d/%d]\n",
            c->last_prefilled, s->completion_tokens, s->ttft_s * 1e3,
            s->completion_tokens > 1 && decode_s > 0 ? (s->completion_tokens - 1) / decode_s : 0.0,
            c->context_used, c->rt.engine.ctx_limit);
}

static char *read_text_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    size_t cap = 0, n;
    *len = 0;
    char chunk[65536];
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) {
        if (*len + n + 1 > cap) {
            cap = 2 * (*len + n + 1);
            char *b = realloc(buf, cap);
            if (!b) { free(buf); fclose(f); return NULL; }
            buf = b;
        }
        memcpy(buf + *len, chunk, n);
        *len += n;
    }
    fclose(f);
    if (!buf) buf = calloc(1, 1);
    else buf[*len] = 0;
    return buf;
}

static void chat_help(void) {
    printf("commands: /clear (forget the conversation, keep the system prompt),\n"
           "          /system TEXT (set the system prompt and clear; /system alone removes it),\n"
           "          /regen (redo the last reply), /read FILE (send a file as your turn), /stats, /exit\n"
           "keys: Ctrl-C stops a reply, Ctrl-D exits; end a line with \\ to continue it\n");
}

/* Handles a /command; returns 1 to leave the chat, 0 otherwise. */
static int chat_command(Chat *c, const char *line) {
    if (!strcmp(line, "/exit") || !strcmp(line, "/quit")) return 1;
    if (!strcmp(line, "/clear")) { chat_reset(c, NULL); c->context_used = 0; printf("[cleared]\n"); return 0; }
    if (!strncmp(line, "/system", 7) && (line[7] == ' ' || line[7] == 0)) {
        const char *text = line[7] ? line + 8 : "";
        if (text[0] && chat_system_fits(c, text, "the /system prompt")) {
            fprintf(stderr, "[system prompt not changed]\n");
            return 0;
        }
        chat_reset(c, text);
        c->context_used = 0;
        printf(text[0] ? "[system prompt set; conversation cleared]\n" : "[system prompt removed; conversation cleared]\n");
        return 0;
    }
    if (!strcmp(line, "/stats")) { chat_print_stats(c, stdout); return 0; }
    if (!strcmp(line, "/regen")) {
        if (c->n_msgs == 0 || strcmp(c->msgs[c->n_msgs - 1].role, "assistant")) { printf("[nothing to redo]\n"); return 0; }
        chat_pop_message(c);
        if (chat_reply(c) == 0 && (c->tty_out || c->o->verbose)) chat_print_stats(c, stderr);
        return 0;
    }
    if (!strncmp(line, "/read ", 6)) {
        size_t len;
        char *text = read_text_file(line + 6, &len);
        if (!text) { fprintf(stderr, "error: cannot read %s: %s\n", line + 6, strerror(errno)); return 0; }
        const char *nul = memchr(text, 0, len);
        if (nul) { /* a turn is text: a NUL would end it there, silently */
            fprintf(stderr, "error: %s has a NUL byte at offset %zu: not sent (a turn must be text)\n", line + 6,
                    (size_t)(nul - text));
            free(text);
            return 0;
        }
        chat_add_message(c, "user", text, len);
        free(text);
        if (chat_reply(c)) chat_pop_message(c);
        else if (c->tty_out || c->o->verbose) chat_print_stats(c, stderr);
        return 0;
    }
    if (strcmp(line, "/help") && strcmp(line, "/?")) {
        const char *sp = strchr(line, ' ');
        fprintf(stderr, "unknown command %.*s (try /help)\n", sp ? (int)(sp - line) : (int)strlen(line), line);
        return 0;
    }
    chat_help();
    return 0;
}

/* The banner's model name: the file's (or folder's) base name without its
 * extension, which names the model as the user got it, where general.name is
 * often a raw training-run string. */
static void chat_model_name(const Model *m, char *out, size_t cap) {
    size_t n = strlen(m->path);
    while (n > 1 && m->path[n - 1] == '/') n--;
    size_t start = n;
    while (start > 0 && m->path[start - 1] != '/') start--;
    size_t end = n;
    for (size_t i = start; i < n; i++)
        if (m->path[i] == '.') end = i;
    if (end == start) end = n;
    snprintf(out, cap, "%.*s", (int)(end - start), m->path + start);
}

/* "135 M" / "1.2 B" / "52 K" parameters. */
static void chat_param_count(uint64_t n, char *out, size_t cap) {
    if (n >= 1000000000ull) snprintf(out, cap, "%.1f B", n / 1e9);
    else if (n >= 1000000ull) snprintf(out, cap, "%.0f M", n / 1e6);
    else snprintf(out, cap, "%.0f K", n / 1e3);
}

static int chat_setup(Chat *c, const RunOptions *o) {
    Err err = {{0}};
    if (runtime_open(&c->rt, o, &err)) { fprintf(stderr, "cllm chat: %s\n", err.msg); return 2; }
    c->rt_ready = true;
    SchedOptions so = {.max_seqs = 1, .host_sampling = o->host_sampling};
    if (scheduler_init(&c->sched, &c->rt.engine, &so, &err)) { fprintf(stderr, "cllm chat: %s\n", err.msg); return 2; }
    c->sched_ready = true;
    const char *tmpl = tokenizer_chat_template(c->rt.model.tok);
    Err err2 = {{0}};
    if (runtime_chat_template(&c->rt, o->chat_template, &c->tmpl, &err2)) {
        fprintf(stderr, "cllm chat: %s\n", err2.msg);
        return 2;
    }
    if (o->system && o->system[0]) {
        if (chat_system_fits(c, o->system, "the --system prompt")) return 2;
        chat_add_message(c, "system", o->system, strlen(o->system));
    }
    c->tty_out = isatty(STDOUT_FILENO);
    const Model *m = &c->rt.model;
    char name[256], params[32];
    chat_model_name(m, name, sizeof name);
    chat_param_count(m->n_params, params, sizeof params);
    const DTypeInfo *wt = m->w.layers && m->w.layers[0].wq.data ? dtype_info((uint32_t)m->w.layers[0].wq.type) : NULL;
    fprintf(stderr, "cllm: %s (%s parameters%s%s, %s, %d layers) on %s, context %d tokens, chat template %s%s\n", name,
            params, wt ? ", " : "", wt ? wt->name : "", arch_name(m->cfg.arch), m->cfg.n_layers, c->rt.be->name,
            c->rt.engine.ctx_limit, chat_family_name(c->tmpl.family),
            tmpl || o->chat_template ? "" : " (model has none; guessed)");
    if (!tmpl && !o->chat_template)
        fprintf(stderr, "cllm: note: this model has no chat template, so it is likely a base model: it continues "
                        "text rather than answering, and may ramble or repeat. For a conversation use an instruct "
                        "model (e.g. smollm2-135m-instruct).\n");
    c->sampling = o->sampling;
    if (app_model_sampling("chat", m, c->given, &c->sampling, &err)) {
        fprintf(stderr, "cllm chat: %s\n", err.msg);
        return 2;
    }
    return 0;
}

static void chat_teardown(Chat *c) {
    while (c->n_msgs > 0) chat_pop_message(c);
    free(c->msgs);
    if (c->sched_ready) scheduler_free(&c->sched);
    if (c->rt_ready) runtime_close(&c->rt);
}

int chat_main(const RunOptions *o, unsigned given, bool seed_given) {
    if (run_options_serves_stage(o)) return runtime_serve_main(o, "chat"); /* the last rank talks to the user */
    Chat c = {0};
    c.o = o;
    c.given = given;
    c.seed_given = seed_given;
    int rc = chat_setup(&c, o);
    if (rc) { chat_teardown(&c); return rc; }
    char hist[4096];
    const char *home = getenv("HOME");
    snprintf(hist, sizeof hist, "%s/.cllm_history", home ? home : ".");
    Err err = {{0}};
    LineEditor *le = line_editor_create(STDIN_FILENO, STDOUT_FILENO, isatty(STDIN_FILENO) ? hist : NULL, 1000, &err);
    if (!le) { fprintf(stderr, "cllm chat: %s\n", err.msg); chat_teardown(&c); return 2; }
    struct sigaction sa = {0};
    sa.sa_handler = chat_on_sigint;
    sigaction(SIGINT, &sa, NULL);
    if (isatty(STDIN_FILENO)) printf("Type a message; /help lists commands, Ctrl-D exits.\n");
    for (;;) {
        char *line = NULL;
        LineResult r = line_editor_read(le, "> ", "… ", &line, &err);
        if (r == LINE_EOF) break;
        if (r == LINE_INTERRUPT) continue;
        if (r == LINE_ERROR) { fprintf(stderr, "cllm chat: %s\n", err.msg); break; }
        size_t nuls = line_editor_nul_bytes(le);
        if (nuls) { /* dropped by the editor: the line is not what was sent */
            fprintf(stderr, "error: the input line had %zu NUL byte%s: not sent (a turn must be text)\n", nuls,
                    nuls == 1 ? "" : "s");
            free(line);
            continue;
        }
        if (line[0] == 0) { free(line); continue; }
        line_editor_add_history(le, line);
        if (line[0] == '/') {
            int quit = chat_command(&c, line);
            free(line);
            if (quit) break;
            continue;
        }
        chat_add_message(&c, "user", line, strlen(line));
        free(line);
        if (chat_reply(&c)) { chat_pop_message(&c); continue; }
        if (c.tty_out || o->verbose) chat_print_stats(&c, stderr);
    }
    line_editor_destroy(le);
    chat_teardown(&c);
    return 0;
}
