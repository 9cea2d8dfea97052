/* utf8.h — UTF-8 as the tokenizers, JSON and the streaming text need it:
 * decoding with Python's replacement rules, encoding, and the bytes of a
 * character still arriving. */
#ifndef CLLM_UTF8_H
#define CLLM_UTF8_H

#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"

/* Decodes one UTF-8 sequence at s[0..n), n >= 1. Returns its length (1..4)
 * and sets *cp when valid; otherwise returns minus the length of the maximal
 * invalid subpart (the bytes one U+FFFD replaces) and sets *cp = 0xFFFD. */
int utf8_next(const uint8_t *s, size_t n, uint32_t *cp);
/* Writes cp as UTF-8 into out (4 bytes room); returns the length. */
int utf8_put(uint32_t cp, char *out);
/* Length of the longest prefix of s[0..n) that could still start a valid
 * sequence if more bytes came (0 when s[0..n) is invalid already or n == 0).
 * For holding back a split multi-byte character in streaming. */
int utf8_incomplete_len(const uint8_t *s, size_t n);
/* Length of the longest valid UTF-8 prefix of s[0..n) (n: all valid). */
size_t utf8_valid_prefix(const char *s, size_t n);

/* Appends s[0..n) to out with every invalid UTF-8 subpart replaced by
 * U+FFFD (Python's bytes.decode(errors="replace")). */
int utf8_sanitize(const char *s, size_t n, TextBuf *out);

#endif
