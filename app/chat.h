/* chat.h — `cllm chat`: an interactive conversation at a prompt. */
#ifndef CLLM_CHAT_H
#define CLLM_CHAT_H

#include "app/runtime.h"

#include <stdbool.h>

/* Runs the chat loop on stdin/stdout until /exit or end of input. given: the
 * SAMPLING_GIVEN_* bits (app/models.h) of o->sampling the user set (the
 * others come from the model's own settings where its files have them);
 * seed_given: o->sampling.seed was set (reply k draws with seed + k; else
 * every reply gets a fresh seed). Returns 0, or 2 after printing a user
 * error (model that cannot load, ...). */
int chat_main(const RunOptions *o, unsigned given, bool seed_given);

#endif
