/* activation.h — the gated activations of the MLP, as every backend names them.
 *
 * out = act(gate) * up, with
 *   ACT_SILU        silu(g) = g * sigmoid(g)                (SwiGLU)
 *   ACT_GELU_TANH   gelu with the tanh approximation        (GeGLU, Gemma)
 *   ACT_SWIGLU_OAI  g = min(gate, limit), u = clamp(up, -limit, limit),
 *                   (u + 1) * g * sigmoid(1.702 g)          (gpt-oss)
 */
#ifndef CLLM_ACTIVATION_H
#define CLLM_ACTIVATION_H

typedef enum { ACT_SILU, ACT_GELU_TANH, ACT_SWIGLU_OAI } Activation;

#endif
