/* model.h — a loaded model: config, weights bound by name, tokenizer.
 *
 * model_load accepts a .gguf file, a safetensors folder (config.json beside
 * the weights), a .safetensors file, or a model.safetensors.index.json. The
 * weights stay in the file mapping; only small vectors (norms, biases, sinks)
 * and tensors whose layout the forward pass cannot read directly (gpt-oss's
 * interleaved safetensors experts) are converted into buffers the model owns,
 * and so is a tensor whose bytes the file places misaligned for its type
 * (GGUF general.alignment below 16, an odd safetensors header). A file
 * tensor that no weight role reads is named on stderr at load (the loader's
 * one print: every command loads through it) and listed in m->unused.
 */
#ifndef CLLM_MODEL_H
#define CLLM_MODEL_H

#include <stdbool.h>

#include "formats/gguf.h"
#include "formats/safetensors.h"
#include "kernels/weights.h"
#include "model/config.h"
#include "model/generation_defaults.h"
#include "model/quant_config.h"
#include "model/shape.h"
#include "tokenizer/tokenizer.h"

typedef struct {
    char *path;
    ModelConfig cfg;
    QuantConfig quant;         /* config.json's quantization_config (FP8 checkpoints) */
    GenerationDefaults gen;    /* the sampling settings the files recommend (generation_defaults.h) */
    ModelWeights w;
    ModelShape shape;          /* what a backend is told of it (rope tables owned) */
    Tokenizer *tok;            /* NULL when loaded with MODEL_LOAD_NO_TOKENIZER */
    bool is_gguf;
    GGUFFile gguf;
    Safetensors st;
    void **owned;              /* converted buffers */
    int n_owned, cap_owned;
    uint64_t n_params;         /* elements of every bound tensor */
    uint64_t weight_bytes;     /* bytes of every bound tensor as stored */
    bool dummy;                /* MODEL_LOAD_DUMMY_WEIGHTS: weights made up, no file read */
    DType dummy_type;          /* their matrices' type (model_load_dummy; DT_BF16 otherwise) */
    void *dummy_data[DT_COUNT];     /* per type: the random values dummy tensors point at (owned) */
    uint64_t dummy_bytes[DT_COUNT];
    float *dummy_fp8_scales;        /* dummy F8_E4M3 matrices' row scales, dummy_fp8_rows long (owned) */
    int64_t dummy_fp8_rows;
    TensorInfo *dummy_tensors;      /* the made-up tensors, in binding order (model_tensor_at) */
    uint64_t n_dummy, cap_dummy;
    bool *tensor_used;         /* per file tensor (model_tensor_at order): read by a weight role */
    const char **unused;       /* the names of the others, in file order (warned about at load) */
    uint64_t n_unused;
} Model;

/* MODEL_LOAD_DUMMY_WEIGHTS: a safetensors folder without weight files
 * (config.json and tokenizer.json only): every required tensor gets its
 * shape, in bf16 (model_load) or with its matrices in a quantized type
 * (model_load_dummy; model/dummy.h says which tensor gets which type), and
 * all tensors of one type point at one shared buffer of random values (so
 * all layers are equal, and host memory holds only the largest tensor of
 * each type); optional ones are absent. weight_bytes counts every tensor in
 * its own type. For benchmarks of shapes too big for the disk (vLLM's
 * --load-format dummy); the outputs mean nothing. */
/* MODEL_LOAD_WEIGHTS_FP8 (--weights fp8): every F32/F16/BF16 matrix of the
 * layers (wq wk wv wo w_gate w_up w_down) and an LM head not tied to the
 * embedding becomes e4m3 codes with one scale per output row (scale =
 * amax(row) / 448; codes fp32_to_e4m3(w / scale): round to nearest even,
 * saturating; an all-zero row gets scale 1). Embeddings, norms, biases and
 * routers stay as they are; a matrix in a GGUF block type (Q4_K, ...) is
 * refused, naming it; one already F8_E4M3 stays as the file has it. */
enum { MODEL_LOAD_NO_TOKENIZER = 1, MODEL_LOAD_DUMMY_WEIGHTS = 2, MODEL_LOAD_WEIGHTS_FP8 = 4 };

int model_load(Model *m, const char *path, int flags, Err *err);
/* model_load with MODEL_LOAD_DUMMY_WEIGHTS and the matrices in type (one
 * of model/dummy.h's DUMMY_TYPE_NAMES; another type is refused). */
int model_load_dummy(Model *m, const char *path, int flags, DType type, Err *err);
void model_free(Model *m);

/* Every tensor in the file, in file order (for `cllm info --tensors`); of
 * a dummy model, every tensor it made. */
uint64_t model_tensor_count(const Model *m);
const TensorInfo *model_tensor_at(const Model *m, uint64_t i);

#endif
