/* main.c — the command line of cllm: options, subcommands, help. No model
 * logic lives here; each subcommand parses its options and calls the layers. */
#include <stdio.h>
#include <string.h>

#define CLLM_VERSION "0.1.0"

static void print_usage(FILE *out) {
    fprintf(out,
            "cllm %s — LLM inference in C (GGUF / safetensors; CUDA and CPU)\n\n"
            "usage: cllm [SUBCOMMAND] [OPTIONS]\n\n"
            "subcommands:\n"
            "  chat        interactive chat (the default when no subcommand is given)\n"
            "  generate    answer every prompt of a file\n"
            "  info        describe a model file\n"
            "  tokenize    print the token ids of a text\n\n"
            "  cllm SUBCOMMAND --help   options of one subcommand\n"
            "  cllm --version           version\n",
            CLLM_VERSION);
}

int main(int argc, char **argv) {
    if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        print_usage(stdout);
        return 0;
    }
    if (argc >= 2 && !strcmp(argv[1], "--version")) {
        printf("cllm %s\n", CLLM_VERSION);
        return 0;
    }
    print_usage(stderr);
    return 2;
}
