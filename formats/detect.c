/* detect.c — a model file's kind from its first bytes (see detect.h). */
#include "formats/detect.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#define WHAT_CLLM_READS "cllm reads .gguf files and Hugging Face folders (config.json + *.safetensors)"

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

static bool is_space(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

int model_file_detect_bytes(const char *name, const uint8_t *head, size_t n, uint64_t size, ModelFileKind *kind,
                            Err *err) {
    if (size == 0) return err_set(err, "%s: an empty file (0 bytes), not a model; " WHAT_CLLM_READS, name);
    if (n >= 4 && !memcmp(head, "GGUF", 4)) { *kind = MODEL_FILE_GGUF; return 0; }
    /* safetensors: the header length, then the JSON header itself; a length past the end is a truncated
     * file, which the reader names */
    if (n >= 9 && head[8] == '{') { *kind = MODEL_FILE_SAFETENSORS; return 0; }
    size_t i = 0;
    while (i < n && is_space(head[i])) i++;
    if (ends_with(name, ".json") && i < n && head[i] == '{') { *kind = MODEL_FILE_ST_INDEX; return 0; }
    if (n >= 4 && !memcmp(head, "PK\x03\x04", 4))
        return err_set(err, "%s: a zip archive (a PyTorch checkpoint?), not GGUF or safetensors: convert it to "
                       "safetensors or GGUF; " WHAT_CLLM_READS, name);
    /* pickle protocol 2..5 opens with PROTO (0x80) and its version */
    if (n >= 2 && head[0] == 0x80 && head[1] >= 2 && head[1] <= 5)
        return err_set(err, "%s: a PyTorch checkpoint (a pickle, protocol %d): convert it to safetensors or GGUF; "
                       WHAT_CLLM_READS, name, head[1]);
    if (ends_with(name, ".onnx"))
        return err_set(err, "%s: an ONNX model (by its name; no 'GGUF' magic, no safetensors header): convert it "
                       "to safetensors or GGUF; " WHAT_CLLM_READS, name);
    return err_set(err, "%s: not a model file (not GGUF: no 'GGUF' magic; not safetensors: no JSON header after the "
                   "8-byte length)%s; " WHAT_CLLM_READS, name,
                   ends_with(name, ".gguf") ? ", though it is named .gguf" :
                   ends_with(name, ".safetensors") ? ", though it is named .safetensors" : "");
}

static int detect_folder(const char *path, ModelFileKind *kind, Err *err) {
    char cfg[4096];
    struct stat s;
    int w = snprintf(cfg, sizeof cfg, "%s/config.json", path);
    if (w < 0 || (size_t)w >= sizeof cfg) return err_set(err, "%.200s...: path too long", path);
    if (stat(cfg, &s) || !S_ISREG(s.st_mode))
        return err_set(err, "%s: a folder without config.json, not a Hugging Face model folder; " WHAT_CLLM_READS,
                       path);
    *kind = MODEL_FILE_HF_FOLDER;
    return 0;
}

int model_file_detect(const char *path, ModelFileKind *kind, Err *err) {
    struct stat s;
    if (stat(path, &s)) return err_set(err, "%s: %s", path, errno == ENOENT ? "no such file or folder" : strerror(errno));
    if (S_ISDIR(s.st_mode)) return detect_folder(path, kind, err);
    if (!S_ISREG(s.st_mode)) return err_set(err, "%s: not a regular file or a folder", path);
    FILE *f = fopen(path, "rb");
    if (!f) return err_set(err, "%s: %s", path, strerror(errno));
    uint8_t head[16];
    size_t n = fread(head, 1, sizeof head, f);
    int bad = ferror(f);
    fclose(f);
    if (bad) return err_set(err, "%s: read error", path);
    return model_file_detect_bytes(path, head, n, (uint64_t)s.st_size, kind, err);
}
