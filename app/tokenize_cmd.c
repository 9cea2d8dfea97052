/* tokenize_cmd.c — `cllm tokenize`: a text's token ids as the model's own
 * tokenizer makes them (tokenize_cmd.h). */
#include "app/tokenize_cmd.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/models.h"

int tokenize_main(const TokenizeOptions *o) {
    int rc = 0;
    char *text = NULL;
    size_t len = 0;
    if (o->file) {
        FILE *f = strcmp(o->file, "-") ? fopen(o->file, "rb") : stdin;
        if (!f) { fprintf(stderr, "cllm tokenize: %s: %s\n", o->file, strerror(errno)); return 2; }
        size_t cap = 0, n;
        char buf[65536];
        while ((n = fread(buf, 1, sizeof buf, f)) > 0) {
            if (len + n + 1 > cap) { cap = 2 * (len + n + 1); text = realloc(text, cap); if (!text) abort(); }
            memcpy(text + len, buf, n);
            len += n;
        }
        if (f != stdin) fclose(f);
    } else {
        text = strdup(o->text);
        len = strlen(text);
    }
    Model m;
    if ((rc = app_load_model("tokenize", o->model, 0, DT_BF16, &m))) { free(text); return rc; }
    TokenIds ids = {0};
    Err err = {{0}};
    if (tokenizer_encode(m.tok, text ? text : "", len, o->parse_special, o->add_bos && tokenizer_add_bos(m.tok), &ids, &err)) {
        fprintf(stderr, "cllm tokenize: %s\n", err.msg);
        rc = 2;
    }
    for (size_t i = 0; rc == 0 && i < ids.n; i++) {
        if (o->pieces) printf("%6d  %s\n", ids.ids[i], tokenizer_piece(m.tok, ids.ids[i]));
        else printf(i + 1 < ids.n ? "%d " : "%d\n", ids.ids[i]);
    }
    token_ids_free(&ids);
    model_free(&m);
    free(text);
    return rc;
}
