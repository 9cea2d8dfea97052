/* cuda_ops.cuh — TRANSITIONAL (removed before this redesign lands): the old
 * header of the split kernel families. Include the family's header instead:
 * bf16.cuh, activation.cuh (act_glu), elementwise.cuh, norm.cuh, rope_kv.cuh,
 * gemv.cuh, moe.cuh, attention.cuh. */
#ifndef CLLM_CUDA_OPS_CUH
#define CLLM_CUDA_OPS_CUH
#include "kernels/cuda/activation.cuh"
#include "kernels/cuda/bf16.cuh"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/gemv.cuh"
#include "kernels/cuda/moe.cuh"
#include "kernels/cuda/norm.cuh"
#include "kernels/cuda/rope_kv.cuh"
#endif
