/* model.h — a loaded model: config, weights bound by name, tokenizer.
 *
 * model_load accepts a .gguf file, a safetensors folder (config.json beside
 * the weights), a .safetensors file, or a model.safetensors.index.json. The
 * weights stay in the file mapping; only small vectors (norms, biases, sinks)
 * and tensors whose layout the forward pass cannot read directly (gpt-oss's
 * interleaved safetensors experts) are converted into buffers the model owns.
 */
#ifndef CLLM_MODEL_H
#define CLLM_MODEL_H

#include <stdbool.h>

#include "model/config.h"
#include "model/gguf.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "tokenizer/tokenizer.h"

typedef struct {
    char *path;
    ModelConfig cfg;
    ModelWeights w;
    Tokenizer *tok;            /* NULL when loaded with MODEL_LOAD_NO_TOKENIZER */
    bool is_gguf;
    GGUFFile gguf;
    Safetensors st;
    void **owned;              /* converted buffers */
    int n_owned, cap_owned;
    uint64_t n_params;         /* elements of every bound tensor */
    uint64_t weight_bytes;     /* bytes of every bound tensor as stored */
    bool dummy;                /* MODEL_LOAD_DUMMY_WEIGHTS: weights made up, no file read */
    void *dummy_data;          /* the random bf16 values dummy tensors point at (owned) */
    uint64_t dummy_bytes;
} Model;

/* MODEL_LOAD_DUMMY_WEIGHTS: a safetensors folder without weight files
 * (config.json and tokenizer.json only): every required tensor gets its
 * shape in bf16 and points at one shared buffer of random values (so all
 * layers are equal), optional ones are absent. For benchmarks of shapes too
 * big for the disk (vLLM's --load-format dummy); the outputs mean nothing. */
enum { MODEL_LOAD_NO_TOKENIZER = 1, MODEL_LOAD_DUMMY_WEIGHTS = 2 };

int model_load(Model *m, const char *path, int flags, Err *err);
void model_free(Model *m);

/* Every tensor in the file, in file order (for `cllm info --tensors`). */
uint64_t model_tensor_count(const Model *m);
const TensorInfo *model_tensor_at(const Model *m, uint64_t i);

#endif
