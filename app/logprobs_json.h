/* logprobs_json.h — a finished request's log-probabilities (engine/logprobs.h)
 * as the JSON values generate writes (app/results.h places them):
 *
 *   completions: {"tokens": [str...], "token_logprobs": [lp...],
 *     "top_logprobs": [{str: lp, ...}...], "text_offset": [byte offset...]}
 *     (OpenAI's legacy shape; with echo the prompt's tokens come first, the
 *     first with null entries; offsets are byte offsets into "text");
 *   chat: {"content": [{"token": str, "logprob": lp, "bytes": [u8...],
 *     "top_logprobs": [{"token", "logprob", "bytes"}...]}...]};
 *   prompt_logprobs (vLLM): [null, {"id": {"logprob", "rank",
 *     "decoded_token"}, ...}...]: each prompt token's entry and its top k.
 * Token strings are the tokens' decoded bytes (tokenizer_token_bytes), an
 * invalid UTF-8 piece written with U+FFFD (its exact bytes are in "bytes").
 * A logprob of -inf is written -9999.0, as vLLM does (JSON has no -inf).
 */
#ifndef CLLM_LOGPROBS_JSON_H
#define CLLM_LOGPROBS_JSON_H

#include "base/json.h"
#include "engine/logprobs.h"
#include "tokenizer/tokenizer.h"

/* prompt: the echoed prompt's entries (NULL/0 without echo); top: the
 * alternatives to write per token (entries hold at least that many, or the
 * vocabulary). */
int logprobs_json_completion(JsonBuf *b, const Tokenizer *tok, const TokenLogprob *prompt, int n_prompt,
                             const TokenLogprob *gen, int n_gen, int top);
int logprobs_json_chat(JsonBuf *b, const Tokenizer *tok, const TokenLogprob *gen, int n_gen, int top);
int logprobs_json_prompt(JsonBuf *b, const Tokenizer *tok, const TokenLogprob *prompt, int n_prompt, int top);

#endif
