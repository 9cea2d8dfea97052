/* http.c — the HTTP/1.1 request parser and response heads of `cllm serve`
 * (http.h says what is accepted and what is refused). Every byte is checked
 * against the grammar before it is used: a hostile client can make a request
 * fail, never read past the buffer. */
#include "app/http.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

/* RFC 9110 tchar: the characters of a method or a header name. */
static bool is_tchar(unsigned char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           (c && strchr("!#$%&'*+-.^_`|~", c));
}

/* A header value's bytes: visible ASCII, space, tab and obs-text (>= 0x80). */
static bool is_vchar(unsigned char c) { return c == '\t' || (c >= 0x20 && c != 0x7f); }

static HttpParse bad(int *status, int code, Err *err, const char *why) {
    *status = code;
    err_set(err, "%s", why);
    return HTTP_BAD;
}

/* The end of the head: the offset just past "\r\n\r\n", or 0 when absent. */
static size_t head_end(const char *buf, size_t len) {
    for (size_t i = 0; i + 3 < len; i++)
        if (buf[i] == '\r' && buf[i + 1] == '\n' && buf[i + 2] == '\r' && buf[i + 3] == '\n') return i + 4;
    return 0;
}

/* METHOD SP target SP HTTP/1.x, in line[0..n) (no CRLF). */
static HttpParse parse_request_line(const char *line, size_t n, HttpRequest *req, int *status, Err *err) {
    size_t i = 0;
    while (i < n && line[i] >= 'A' && line[i] <= 'Z') i++;
    if (i == 0 || i > 16 || i >= n || line[i] != ' ') return bad(status, 400, err, "malformed request line (method)");
    req->method = line;
    req->method_len = i;
    size_t t = ++i;
    while (i < n && (unsigned char)line[i] > 0x20 && (unsigned char)line[i] < 0x7f) i++;
    if (i == t || i >= n || line[i] != ' ' || line[t] != '/')
        return bad(status, 400, err, "malformed request line (target: must start with '/')");
    req->target = line + t;
    req->target_len = i - t;
    const char *v = line + i + 1;
    size_t vn = n - i - 1;
    if (vn != 8 || memcmp(v, "HTTP/", 5) || v[6] != '.' || v[5] < '0' || v[5] > '9' || v[7] < '0' || v[7] > '9')
        return bad(status, 400, err, "malformed request line (version)");
    if (v[5] != '1' || (v[7] != '0' && v[7] != '1')) return bad(status, 505, err, "HTTP version not supported");
    req->minor = v[7] - '0';
    return HTTP_COMPLETE;
}

/* name ":" OWS value OWS, in line[0..n). */
static HttpParse parse_header(const char *line, size_t n, HttpHeader *h, int *status, Err *err) {
    size_t i = 0;
    while (i < n && is_tchar((unsigned char)line[i])) i++;
    if (i == 0 || i >= n || line[i] != ':') return bad(status, 400, err, "malformed header field");
    h->name = line;
    h->name_len = i;
    size_t s = i + 1, e = n;
    for (size_t k = s; k < n; k++)
        if (!is_vchar((unsigned char)line[k])) return bad(status, 400, err, "control character in a header value");
    while (s < e && (line[s] == ' ' || line[s] == '\t')) s++;
    while (e > s && (line[e - 1] == ' ' || line[e - 1] == '\t')) e--;
    h->value = line + s;
    h->value_len = e - s;
    return HTTP_COMPLETE;
}

static bool token_is(const char *s, size_t n, const char *word) { return strlen(word) == n && !strncasecmp(s, word, n); }

/* Content-Length, Transfer-Encoding and Connection: the body's framing. */
static HttpParse parse_framing(HttpRequest *req, size_t max_body, int *status, Err *err) {
    bool have_length = false;
    req->keep_alive = req->minor == 1;
    for (int k = 0; k < req->n_headers; k++) {
        const HttpHeader *h = &req->headers[k];
        if (token_is(h->name, h->name_len, "transfer-encoding")) {
            if (token_is(h->value, h->value_len, "chunked"))
                return bad(status, 411, err, "chunked request bodies are not read; send Content-Length");
            return bad(status, 501, err, "Transfer-Encoding not supported; send Content-Length");
        }
        if (token_is(h->name, h->name_len, "connection")) {
            if (token_is(h->value, h->value_len, "close")) req->keep_alive = false;
            else if (token_is(h->value, h->value_len, "keep-alive")) req->keep_alive = true;
        }
        if (!token_is(h->name, h->name_len, "content-length")) continue;
        if (have_length) return bad(status, 400, err, "Content-Length given twice");
        if (h->value_len == 0) return bad(status, 400, err, "empty Content-Length");
        size_t v = 0;
        for (size_t i = 0; i < h->value_len; i++) {
            char c = h->value[i];
            if (c < '0' || c > '9') return bad(status, 400, err, "Content-Length is not a number");
            size_t d = (size_t)(c - '0');
            if (v > max_body / 10 || v * 10 + d > max_body) { /* past the limit, before it can overflow */
                *status = 413;
                err_set(err, "request body over the limit of %zu bytes (--max-request-bytes)", max_body);
                return HTTP_BAD;
            }
            v = v * 10 + d;
        }
        req->content_length = v;
        have_length = true;
    }
    return HTTP_COMPLETE;
}

HttpParse http_parse_request(const char *buf, size_t len, size_t max_body, HttpRequest *req, int *status, Err *err) {
    memset(req, 0, sizeof *req);
    *status = 0;
    size_t scan = len < HTTP_MAX_HEADER_BYTES ? len : HTTP_MAX_HEADER_BYTES;
    size_t end = head_end(buf, scan);
    /* A NUL anywhere in the head is refused, also before the head is whole. */
    if (memchr(buf, 0, end ? end : scan)) return bad(status, 400, err, "NUL byte in the request head");
    if (!end) {
        if (len >= HTTP_MAX_HEADER_BYTES) return bad(status, 431, err, "request head over 16 KiB");
        return HTTP_INCOMPLETE;
    }
    size_t pos = 0, line_no = 0;
    while (pos < end - 2) { /* the last CRLF is the blank line */
        const char *cr = memchr(buf + pos, '\r', end - pos);
        size_t n = (size_t)(cr - (buf + pos));
        if (cr[1] != '\n') return bad(status, 400, err, "bare CR in the request head");
        if (memchr(buf + pos, '\n', n)) return bad(status, 400, err, "bare LF in the request head");
        const char *line = buf + pos;
        HttpParse rc;
        if (line_no == 0) {
            rc = parse_request_line(line, n, req, status, err);
        } else {
            if (n > 0 && (line[0] == ' ' || line[0] == '\t')) return bad(status, 400, err, "obsolete line folding");
            if (req->n_headers == HTTP_MAX_HEADERS) return bad(status, 431, err, "more than 64 header fields");
            rc = parse_header(line, n, &req->headers[req->n_headers++], status, err);
        }
        if (rc != HTTP_COMPLETE) return rc;
        pos += n + 2;
        line_no++;
    }
    if (line_no == 0) return bad(status, 400, err, "empty request line");
    req->header_bytes = end;
    HttpParse rc = parse_framing(req, max_body, status, err);
    if (rc != HTTP_COMPLETE) return rc;
    return len - end >= req->content_length ? HTTP_COMPLETE : HTTP_INCOMPLETE;
}

const char *http_header(const HttpRequest *req, const char *name, size_t *len) {
    for (int k = 0; k < req->n_headers; k++)
        if (token_is(req->headers[k].name, req->headers[k].name_len, name)) {
            if (len) *len = req->headers[k].value_len;
            return req->headers[k].value;
        }
    return NULL;
}

bool http_path_is(const HttpRequest *req, const char *path) {
    const char *q = memchr(req->target, '?', req->target_len);
    size_t n = q ? (size_t)(q - req->target) : req->target_len;
    return strlen(path) == n && !memcmp(req->target, path, n);
}

bool http_method_is(const HttpRequest *req, const char *method) {
    return strlen(method) == req->method_len && !memcmp(req->method, method, req->method_len);
}

const char *http_reason(int status) {
    switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Content Too Large";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Error";
    }
}

int http_put_head(TextBuf *out, int status, const char *content_type, long long content_length, bool keep_alive,
                  const char *extra) {
    char head[512];
    int n;
    if (content_length >= 0)
        n = snprintf(head, sizeof head, "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %lld\r\nConnection: %s\r\n",
                     status, http_reason(status), content_type, content_length, keep_alive ? "keep-alive" : "close");
    else
        n = snprintf(head, sizeof head, "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nCache-Control: no-cache\r\n"
                     "Connection: close\r\n", status, http_reason(status), content_type);
    if (n < 0 || (size_t)n >= sizeof head) return -1;
    if (textbuf_append(out, head, (size_t)n)) return -1;
    if (extra && textbuf_append(out, extra, strlen(extra))) return -1;
    return textbuf_append(out, "\r\n", 2);
}
