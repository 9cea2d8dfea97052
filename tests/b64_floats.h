/* b64_floats.h — base64 of little-endian float32s (the goldens' logits in
 * the fixtures' JSON, written by tests/fixtures/make_*.py), decoded. One
 * copy for the tests that read them; static: each test is one file. */
#ifndef CLLM_TESTS_B64_FLOATS_H
#define CLLM_TESTS_B64_FLOATS_H

#include <stddef.h>
#include <stdint.h>

static int b64_value(char ch) {
    if (ch >= 'A' && ch <= 'Z') return ch - 'A';
    if (ch >= 'a' && ch <= 'z') return ch - 'a' + 26;
    if (ch >= '0' && ch <= '9') return ch - '0' + 52;
    return ch == '+' ? 62 : ch == '/' ? 63 : -1;
}

/* Decodes s[0, len) into at most cap floats (other characters skipped); returns the count. */
static size_t b64_floats(const char *s, size_t len, float *out, size_t cap) {
    size_t n = 0;
    uint32_t acc = 0;
    int bits = 0;
    unsigned char *bytes = (unsigned char *)out;
    for (size_t i = 0; i < len; i++) {
        int v = b64_value(s[i]);
        if (v < 0) continue;
        acc = acc << 6 | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            if (n < cap * 4) bytes[n++] = (acc >> bits) & 0xff;
        }
    }
    return n / 4;
}

#endif
