/* detect.h — what kind of model file a path is, by its first bytes (never
 * by its name alone): GGUF starts "GGUF"; a safetensors file with a u64
 * little-endian header length N (within the file) and then '{'; a
 * Hugging Face folder holds config.json (its weights, *.safetensors, are
 * safetensors_open's business); a .json file is a safetensors index. What
 * is none of these gets an error saying what it is not, and what it is where
 * the bytes tell: empty, a PyTorch checkpoint (zip "PK" or a pickle), an
 * ONNX model (.onnx: protobuf has no magic, so here the name decides).
 */
#ifndef CLLM_DETECT_H
#define CLLM_DETECT_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"

typedef enum {
    MODEL_FILE_GGUF,        /* a .gguf file */
    MODEL_FILE_SAFETENSORS, /* one .safetensors file */
    MODEL_FILE_ST_INDEX,    /* model.safetensors.index.json (or another JSON file) */
    MODEL_FILE_HF_FOLDER,   /* a folder with config.json */
} ModelFileKind;

/* The kind of path: 0, or -1 with err naming the path and what it is not. */
int model_file_detect(const char *path, ModelFileKind *kind, Err *err);

/* The same for the first n bytes (n <= 16 is enough) of a file of `size`
 * bytes named name: what model_file_detect does once it has read them. */
int model_file_detect_bytes(const char *name, const uint8_t *head, size_t n, uint64_t size, ModelFileKind *kind,
                            Err *err);

#endif
