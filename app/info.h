/* info.h — printing what a model holds (`cllm info`). */
#ifndef CLLM_INFO_H
#define CLLM_INFO_H

#include <stdio.h>

#include "model/model.h"

/* kv_tokens of KV cache are sized in kv_dtype; the GPU fit is shown for both. */
void model_print_info(FILE *out, const Model *m, int kv_tokens, KVDtype kv_dtype, const char *chat_family);
void model_print_tensors(FILE *out, const Model *m);

#endif
