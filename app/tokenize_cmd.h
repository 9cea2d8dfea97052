/* tokenize_cmd.h — `cllm tokenize` (app/tokenize_cmd.c). */
#ifndef CLLM_TOKENIZE_CMD_H
#define CLLM_TOKENIZE_CMD_H

#include <stdbool.h>

typedef struct {
    const char *model;      /* NULL: the default model */
    const char *file;       /* the text from this file ("-": stdin), or NULL */
    const char *text;       /* else this text */
    bool pieces;            /* each token's piece beside its id */
    bool parse_special;     /* special-token text becomes the special token */
    bool add_bos;           /* BOS first where the model expects it */
} TokenizeOptions;

/* Prints the ids; the exit code. */
int tokenize_main(const TokenizeOptions *o);

#endif
