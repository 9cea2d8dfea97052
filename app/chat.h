/* chat.h — `cllm chat`: an interactive conversation at a prompt. */
#ifndef CLLM_CHAT_H
#define CLLM_CHAT_H

#include "app/runtime.h"

/* Runs the chat loop on stdin/stdout until /exit or end of input. Returns 0,
 * or 2 after printing a user error (model that cannot load, ...). */
int chat_main(const RunOptions *o);

#endif
