/* json.h — a small JSON reader for untrusted input (safetensors headers,
 * config.json, tokenizer.json of several MB, JSON Lines prompts).
 *
 * json_parse builds a tree in one arena owned by the Json document: one
 * allocation pattern, freed at once by json_free. Strings are unescaped to
 * UTF-8 (\uXXXX surrogate pairs combined; a lone surrogate is an error), and
 * carry their length (they may contain NUL). Object members keep file order;
 * lookups by key are linear for small objects and hashed for large ones.
 * Depth is limited (JSON_MAX_DEPTH) so hostile nesting cannot overflow the
 * stack. Errors name the source (a file name or "line 12 of prompts.jsonl"),
 * the byte offset and what was expected.
 */
#ifndef CLLM_JSON_H
#define CLLM_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"
#include "base/err.h"

#define JSON_MAX_DEPTH 256

typedef enum { JSON_NULL, JSON_BOOL, JSON_NUMBER, JSON_STRING, JSON_ARRAY, JSON_OBJECT } JsonType;

typedef struct JsonValue JsonValue;
struct JsonValue {
    JsonType type;
    union {
        bool boolean;
        struct { double num; bool is_int; int64_t i; } number; /* is_int: written without . or e and fits int64 */
        struct { const char *s; size_t len; } string;          /* NUL-terminated too */
        struct { JsonValue *items; size_t n; } array;
        struct { const char **keys; size_t *key_lens; JsonValue *values; size_t n; void *index; } object;
    } u;
};

typedef struct Json Json; /* a parsed document; owns every JsonValue in it */

/* Parses text[0..len). source names the input in error messages. Returns NULL
 * and fills err on malformed input (err says the source, offset and problem). */
Json *json_parse(const char *text, size_t len, const char *source, Err *err);
/* Reads and parses a whole file (error names the path). */
Json *json_parse_file(const char *path, Err *err);
const JsonValue *json_root(const Json *doc);
void json_free(Json *doc);

/* Lookups: NULL when v is not an object/array or the member is missing. */
const JsonValue *json_get(const JsonValue *obj, const char *key);
const JsonValue *json_at(const JsonValue *arr, size_t i);
size_t json_len(const JsonValue *v); /* items of an array, members of an object, else 0 */

/* v in a few words for an error's "(got ...)": null, true, 3.5, 'text...'
 * (40 bytes at most), an array, an object. */
void json_describe(const JsonValue *v, char *out, size_t n);

/* A member of obj that is present and not null, else NULL. */
const JsonValue *json_member(const JsonValue *obj, const char *key);
/* v as an exact integer (1e3 and 100.0 count; 1.5, 2^53+ and non-numbers do not). */
bool json_as_int64(const JsonValue *v, int64_t *out);

/* Typed getters with a default, for optional config fields. A present member
 * of the wrong type returns the default too; use json_get + type to tell. */
double json_get_num(const JsonValue *obj, const char *key, double def);
int64_t json_get_int(const JsonValue *obj, const char *key, int64_t def);
bool json_get_bool(const JsonValue *obj, const char *key, bool def);
const char *json_get_str(const JsonValue *obj, const char *key, const char *def);

/* Appends s[0..len) to out as a JSON string literal with quotes (for writing
 * JSON Lines). out grows with realloc; returns -1 only on allocation failure. */
typedef TextBuf JsonBuf;
int jsonbuf_put_string(JsonBuf *out, const char *s, size_t len);
int jsonbuf_printf(JsonBuf *out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void jsonbuf_free(JsonBuf *out);

#endif
