/* loader_internal.h — the loader's helpers that its FP8 part (fp8_weights.c)
 * shares; not for use outside model/. */
#ifndef CLLM_LOADER_INTERNAL_H
#define CLLM_LOADER_INTERNAL_H

#include "model/model.h"

/* Takes ownership of p (freed with the model); p == NULL is out of memory. */
int model_own(Model *m, void *p, Err *err);
/* The file's tensor of that name, or NULL. */
const TensorInfo *model_find(const Model *m, const char *name);
/* Marks a file tensor as read by a weight role (model_unused lists the rest). */
void model_mark_used(Model *m, const TensorInfo *t);

/* fp8_weights.c: binds w's scale (and static input_scale) from the file
 * tensors beside t (a F8_E4M3 matrix): "<name minus 'weight'>weight_scale"
 * and "...input_scale", every value checked. */
int fp8_bind_scales(Model *m, WeightRef *w, const TensorInfo *t, Err *err);
/* fp8_weights.c: value i of a scale tensor (F32, BF16, F16) as fp32, and
 * the check of a scale tensor: one of those dtypes, every value a positive
 * finite number (else -1 with err naming the tensor and the value). */
float fp8_scale_at(const TensorInfo *t, uint64_t i);
int fp8_check_scale_values(const Model *m, const TensorInfo *s, Err *err);
/* kv_scales.c: the checkpoint's static FP8 KV-cache scales bound to every
 * layer's kv_scales (none in the file: left absent), after the layers'
 * matrices (their names give the attention prefix). */
int kv_bind_scales(Model *m, Err *err);
/* fp8_weights.c: --weights fp8: the float matrices of the layers and an
 * untied LM head quantized to e4m3 with per-row scales. */
int fp8_quantize_weights(Model *m, Err *err);

#endif
