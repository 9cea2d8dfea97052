/* http.h — the HTTP/1.1 subset `cllm serve` speaks, as pure functions over a
 * byte buffer (no sockets here), so the parser can be unit-tested and fuzzed.
 *
 * Why in-tree: no C HTTP server library in Debian links statically into a
 * one-file binary with a small footprint, and the subset a local API server
 * needs is small: a request line, headers, a Content-Length body, keep-alive,
 * and responses that are either whole (Content-Length) or a server-sent event
 * stream ended by closing the connection.
 *
 * What is refused (each with the status RFC 9112 names): a line not ended by
 * CRLF, a NUL or control byte, obsolete line folding, a method that is not an
 * upper-case token, a target not starting with '/', a version other than
 * HTTP/1.0 and HTTP/1.1 (505), a header section over the limit or with more
 * than HTTP_MAX_HEADERS fields (431), a Content-Length that is not digits,
 * given twice, or over the body limit (400 / 413), any Transfer-Encoding (a
 * chunked request body is not read: 411, asking for Content-Length; others
 * 501).
 */
#ifndef CLLM_HTTP_H
#define CLLM_HTTP_H

#include <stdbool.h>
#include <stddef.h>

#include "base/buf.h"
#include "base/err.h"

#define HTTP_MAX_HEADERS 64
#define HTTP_MAX_HEADER_BYTES (16 << 10) /* request line + headers + the blank line */

typedef struct {
    const char *name, *value; /* into the parsed buffer, not NUL-terminated */
    size_t name_len, value_len;
} HttpHeader;

typedef struct {
    const char *method, *target; /* into the buffer */
    size_t method_len, target_len;
    int minor;                   /* HTTP/1.minor: 0 or 1 */
    HttpHeader headers[HTTP_MAX_HEADERS];
    int n_headers;
    size_t header_bytes;         /* the head, blank line included: the body starts there */
    size_t content_length;       /* 0 when absent */
    bool keep_alive;             /* HTTP/1.1 unless "Connection: close"; 1.0 only with "keep-alive" */
} HttpRequest;

typedef enum { HTTP_INCOMPLETE = 0, HTTP_COMPLETE = 1, HTTP_BAD = -1 } HttpParse;

/* Parses the request at the start of buf[0..len). HTTP_COMPLETE: the head
 * and the whole body are there (the request takes header_bytes +
 * content_length bytes; what follows is the next request). HTTP_INCOMPLETE:
 * more bytes are needed (never returned once len is past a limit).
 * HTTP_BAD: *status is the status to answer with and err says why; the
 * connection must be closed after the answer. */
HttpParse http_parse_request(const char *buf, size_t len, size_t max_body, HttpRequest *req, int *status, Err *err);

/* The value of header name (case-insensitive), or NULL; *len its length. */
const char *http_header(const HttpRequest *req, const char *name, size_t *len);
/* Whether the target's path (before any '?') is path. */
bool http_path_is(const HttpRequest *req, const char *path);
bool http_method_is(const HttpRequest *req, const char *method);

/* "OK", "Not Found", ... ("Error" for a code it does not know). */
const char *http_reason(int status);
/* Appends a response head: the status line, Content-Type, then
 * Content-Length (content_length >= 0) or, for an event stream (< 0), no
 * length and "Connection: close"; extra (NULL or whole "Name: value\r\n"
 * lines) goes before the blank line. -1 when out of memory. */
int http_put_head(TextBuf *out, int status, const char *content_type, long long content_length, bool keep_alive,
                  const char *extra);

#endif
