# Makefile — driven by build.sh (read that first). Every .c under the layer
# folders is part of the engine; main.c is the command line; tests/test_*.c are
# unit-test programs (linked with tests/ref/, the test-only reference code);
# kernels/cuda/*.cu are compiled only with CUDA=1. Each configuration builds
# in a folder of its own (build.sh: build/cpu, build/cuda, build/asan), so
# any order of builds works. -MMD -MP: each object depends on the headers it
# includes, so a one-file change recompiles one file.

BUILD  ?= build/cpu
CUDA   ?= 0
SAN    ?= 0
CUDA_HOME ?= /usr/local/cuda
CC     ?= gcc
NVCC   ?= $(CUDA_HOME)/bin/nvcc
# GPU targets; a development build for the H200 alone: make CUDA_ARCHS=90
CUDA_ARCHS ?= 90 80 89

CFLAGS  = -std=c11 -D_GNU_SOURCE -O2 -g -Wall -Wextra -Wno-unused-parameter -I. -MMD -MP -pthread
LDLIBS  = -lz -lm -pthread
ifeq ($(SAN),1)
  CFLAGS  += -O1 -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
  LDFLAGS += -fsanitize=address,undefined
else
  CFLAGS  += -march=x86-64-v2
endif

LAYERS  = base formats tokenizer kernels kernels/cpu model engine parallel app
SRCS    = $(foreach d,$(LAYERS),$(wildcard $(d)/*.c))
OBJS    = $(SRCS:%.c=$(BUILD)/%.o)

ifeq ($(CUDA),1)
  CUSRCS  = $(wildcard kernels/cuda/*.cu)
  CUOBJS  = $(CUSRCS:%.cu=$(BUILD)/%.o)
  CFLAGS += -DCLLM_CUDA=1 -I$(CUDA_HOME)/include
  GENCODE = $(foreach a,$(CUDA_ARCHS),-gencode arch=compute_$(a),code=sm_$(a))
  # wgmma (quant_gemm.cu) exists only in the arch-specific Hopper target
  GENCODE_90A = $(foreach a,$(CUDA_ARCHS),-gencode arch=compute_$(a)$(if $(filter 90,$(a)),a),code=sm_$(a)$(if $(filter 90,$(a)),a))
  NVFLAGS = -std=c++17 -O3 -I. -MMD -MP -Xcompiler -Wall,-Wextra,-Wno-unused-parameter \
            --expt-relaxed-constexpr -lineinfo $(GENCODE)
  LDLIBS += -L$(CUDA_HOME)/lib64 -lcudart_static -lcublasLt -lnccl -ldl -lrt -lstdc++
endif

TESTSRCS = $(wildcard tests/test_*.c)
REFOBJS  = $(patsubst %.c,$(BUILD)/%.o,$(wildcard tests/ref/*.c))
TESTBINS = $(TESTSRCS:tests/%.c=$(BUILD)/tests/%)
ifeq ($(CUDA),1)
  # kernel and end-to-end checks that need a GPU (tests/gpu/run.sh runs them)
  GPUSRCS = $(wildcard tests/gpu/test_*.c)
  TESTBINS += $(GPUSRCS:tests/gpu/%.c=$(BUILD)/tests/gpu/%)
  GPUTESTOBJS = $(patsubst %.cu,$(BUILD)/%.o,$(wildcard tests/gpu/*.cu))  # test-only device code
endif

all: $(BUILD)/cllm tests

tests: $(TESTBINS)

$(BUILD)/libcllm.a: $(OBJS) $(CUOBJS)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/cllm: $(BUILD)/main.o $(BUILD)/libcllm.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/tests/gpu/%: $(BUILD)/tests/gpu/%.o $(REFOBJS) $(GPUTESTOBJS) $(BUILD)/libcllm.a
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/tests/%: $(BUILD)/tests/%.o $(REFOBJS) $(BUILD)/libcllm.a
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/kernels/cuda/quant_gemm.o: GENCODE = $(GENCODE_90A)
$(BUILD)/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -c $< -o $@

.PHONY: all tests
.SECONDARY: # keep the test objects: tests/gpu/bundle.sh carries them
-include $(OBJS:.o=.d) $(CUOBJS:.o=.d) $(GPUTESTOBJS:.o=.d) $(BUILD)/main.d $(TESTBINS:=.d) $(REFOBJS:.o=.d)
