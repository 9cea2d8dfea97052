# Makefile — driven by build.sh (read that first). Every .c under the layer
# folders is part of the engine; main.c is the command line; tests/test_*.c are
# unit-test programs (linked with tests/ref/, the test-only reference code);
# kernels/cuda/*.cu are compiled only with CUDA=1. Each configuration builds
# in a folder of its own (build.sh: build/cpu, build/asan, build/cuda-90,
# build/cuda-all: one per CUDA_ARCHS set), so any order of builds works. -MMD -MP: each object depends on the headers it
# includes, so a one-file change recompiles one file.

BUILD  ?= build/cpu
CUDA   ?= 0
SAN    ?= 0
CUDA_HOME ?= /usr/local/cuda
CC     ?= gcc
NVCC   ?= $(CUDA_HOME)/bin/nvcc
# GPU targets, oldest first: machine code for each (sm_90 is sm_90a for
# quant_gemm.cu's wgmma), and PTX of the last, which the driver compiles for
# newer GPUs. A development build for the H200 alone: make CUDA_ARCHS=90
CUDA_ARCHS ?= 80 86 89 90
# run before each compile with the source file; build.sh's prints "[n/N] file"
PROGRESS ?= :
PTX_ARCH   := $(lastword $(CUDA_ARCHS))

CFLAGS  = -std=c11 -D_GNU_SOURCE -O2 -g -Wall -Wextra -Wno-unused-parameter -I. -MMD -MP -pthread
# zlib from its static archive: the binary needs no libz.so at run time
LDLIBS  = -l:libz.a -lm -ldl -pthread
ifeq ($(SAN),1)
  CFLAGS  += -O1 -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
  LDFLAGS += -fsanitize=address,undefined
else
  CFLAGS  += -march=x86-64-v2
endif

LAYERS  = base formats tokenizer kernels kernels/cpu model engine parallel app
# kernels/cuda/cuda_libs.c: its run-time loader (dlopen by a name table)
# needs no CUDA header, so it is built, and unit-tested, in every build
SRCS    = $(foreach d,$(LAYERS),$(wildcard $(d)/*.c)) kernels/cuda/cuda_libs.c
OBJS    = $(SRCS:%.c=$(BUILD)/%.o)

ifeq ($(CUDA),1)
  CUSRCS  = $(wildcard kernels/cuda/*.cu)
  CUOBJS  = $(CUSRCS:%.cu=$(BUILD)/%.o)
  CFLAGS += -DCLLM_CUDA=1 -I$(CUDA_HOME)/include
  GENCODE = $(foreach a,$(filter-out $(PTX_ARCH),$(CUDA_ARCHS)),-gencode arch=compute_$(a),code=sm_$(a)) \
            -gencode arch=compute_$(PTX_ARCH),code=[sm_$(PTX_ARCH),compute_$(PTX_ARCH)]
  # wgmma (quant_gemm.cu) exists only in the arch-specific Hopper target; its
  # PTX is the plain one (no wgmma: the kernel is empty there and never runs)
  GENCODE_90A = $(foreach a,$(CUDA_ARCHS),-gencode arch=compute_$(a)$(if $(filter 90,$(a)),a),code=sm_$(a)$(if $(filter 90,$(a)),a)) \
                -gencode arch=compute_$(PTX_ARCH),code=compute_$(PTX_ARCH)
  NVFLAGS = -std=c++17 -O3 -I. -MMD -MP -Xcompiler -Wall,-Wextra,-Wno-unused-parameter \
            --expt-relaxed-constexpr -lineinfo $(GENCODE)
  # cuBLASLt and NCCL are opened at run time (kernels/cuda/cuda_libs.c);
  # cudart, libstdc++ (cudart's) and libgcc are linked in, so the binary
  # needs glibc's libraries only and starts on a machine without CUDA
  LDLIBS += -L$(CUDA_HOME)/lib64 -lcudart_static -Wl,-Bstatic -lstdc++ -Wl,-Bdynamic -static-libgcc -lrt
  # tests/gpu/test_quant_gemm.c calls cuBLASLt itself (its reference GEMM)
  GPULIBS = -Wl,--as-needed -L$(CUDA_HOME)/lib64 -l:libcublasLt.so.13
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

tests: $(GPUTESTOBJS) $(TESTBINS)  # the objects named: a new tests/gpu/*.cu is built before the checks link

$(BUILD)/libcllm.a: $(OBJS) $(CUOBJS)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/cllm: $(BUILD)/main.o $(BUILD)/libcllm.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/tests/gpu/%: $(BUILD)/tests/gpu/%.o $(REFOBJS) $(GPUTESTOBJS) $(BUILD)/libcllm.a
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS) $(GPULIBS)

$(BUILD)/tests/%: $(BUILD)/tests/%.o $(REFOBJS) $(BUILD)/libcllm.a
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	@$(PROGRESS) $<
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/kernels/cuda/quant_gemm.o: GENCODE = $(GENCODE_90A)
$(BUILD)/kernels/cuda/attention_prefill_sm90.o: GENCODE = $(GENCODE_90A)
$(BUILD)/%.o: %.cu
	@mkdir -p $(dir $@)
	@$(PROGRESS) $<
	$(NVCC) $(NVFLAGS) -c $< -o $@

.PHONY: all tests
.SECONDARY: # keep the test objects: tests/gpu/bundle.sh carries them
-include $(OBJS:.o=.d) $(CUOBJS:.o=.d) $(GPUTESTOBJS:.o=.d) $(BUILD)/main.d $(TESTBINS:=.d) $(REFOBJS:.o=.d)
