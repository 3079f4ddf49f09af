# exo — build, test and run. See README.md for the two commands a new user needs.
#
#   make            build build/exo, build/tools/*, unit tests (default: -O2 -g)
#   make RELEASE=1  -O3 -march=native, into build/release/
#   make SAN=1      ASan + UBSan, into build/san/
#   make CUDA=1     also build the CUDA backend (needs nvcc), into build/cuda/
#   make test       install deps if missing, build, run every test (unit + e2e)
#   make run        install what running needs if missing, build build/exo, start a node with
#                   the demo model
#   make test-san   the whole suite under ASan + UBSan + LSan (build/san/)
#   make fuzz       build the libFuzzer targets (clang) into build/fuzz/
#   make CROSS=aarch64-linux-gnu-   cross-build the engine half and its unit tests into build/aarch64/
#   make test-aarch64  that build's unit tests under qemu-user (NEON with and without dotprod)
#
# Sources are discovered: every src/**/*.c (and src/**/*.cc: the Gloo wrapper, the only C++)
# goes into libexo.a, every tests/unit/test_*.c becomes one test binary, every tools/<name>/*.c
# one tool. Adding a file needs no edit here.

CC ?= cc
ifeq ($(origin CC),default)
CC := gcc
endif
# C++ (src/dist/gloo.cc only) follows the C compiler's family, so `make CC=clang` and the
# fuzz build (clang sanitizers) compile it with the matching runtime.
ifeq ($(origin CXX),default)
CXX := $(if $(findstring clang,$(CC)),clang++,g++)
endif

BUILD ?= build
OPT := -O2
ifeq ($(RELEASE),1)
BUILD := build/release
OPT := -O3 -march=native
endif
ifeq ($(SAN),1)
BUILD := build/san
OPT := -O1 -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
endif

PKGS := libmicrohttpd jansson libpcre2-8 libutf8proc libcurl libczmq libzmq libsodium libcrypto
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS := $(shell pkg-config --libs $(PKGS) 2>/dev/null)

# Cross build (CROSS=aarch64-linux-gnu-, Debian's gcc-aarch64-linux-gnu): only the engine half
# (base, model, text, compute, arch, infer, dist with tests/cross/dist_absent.c in place of Gloo)
# and the unit tests that need nothing else, linked against the arm64 multiarch libraries scripts/deps.sh --cross installs.
# The node half (HTTP, ZeroMQ, curl, Gloo) is left out: its arm64 -dev packages cannot be
# installed next to the amd64 ones on Debian 12 (libczmq-dev, libgloo-dev conflict), and it
# holds no architecture-specific code. libpcre2-dev:arm64 would pull libc6-dev:arm64 and upgrade
# amd64 libraries, so the runtime library is linked by its file name (headers are shared).
# test_tokenizer links too but is left out: 3 minutes under qemu and no architecture-specific code.
CROSS_DIRS := base model text compute arch infer dist
CROSS_EXTRA := tests/cross/dist_absent.c
CROSS_TESTS := test_cpu_matmul test_ops test_engine_reference test_forward test_engine \
               test_kv_cache test_sampler test_threadpool test_safetensors test_model_config \
               test_toml test_cpus
ifneq ($(CROSS),)
CC := $(CROSS)gcc
BUILD := build/$(patsubst %-linux-gnu-,%,$(CROSS))
PKG_CFLAGS := -DUTF8PROC_EXPORTS
PKG_LIBS := -ljansson -l:libpcre2-8.so.0 -lutf8proc -lsodium
endif

CFLAGS := -std=c17 -Wall -Wextra -Werror -g $(OPT) -D_GNU_SOURCE -pthread -Isrc $(PKG_CFLAGS) \
          -MMD -MP $(EXTRA_CFLAGS)
CXXFLAGS := $(filter-out -std=c17,$(CFLAGS)) -std=c++17
LDFLAGS := $(OPT) -pthread $(EXTRA_LDFLAGS)
# Gloo (dist/): the shared library brings its own ibverbs/hiredis; -lstdc++ because the link
# driver is the C compiler.
LDLIBS := $(PKG_LIBS) -lopenblas -lgloo -lstdc++ -lm -ldl
ifneq ($(CROSS),)
LDLIBS := $(PKG_LIBS) -lopenblas -lm -ldl
endif

ifeq ($(CUDA),1)
BUILD := build/cuda
NVCC ?= nvcc
CUDA_HOME ?= /usr/local/cuda
# sm_90a machine code for Hopper (H100/H200) plus compute_90 PTX the driver can compile for later
# GPUs; warnings are errors as for the C code.
NVCC_FLAGS ?= -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -gencode=arch=compute_90,code=compute_90 \
              -Werror all-warnings -Xcompiler -Wall,-Wextra
CU_SRC := $(shell find src -name '*.cu' 2>/dev/null)
CU_OBJ := $(CU_SRC:%.cu=$(BUILD)/obj/%.o)
CFLAGS += -DEXO_CUDA=1 -I$(CUDA_HOME)/include
LDLIBS += -L$(CUDA_HOME)/lib64 -lcudart -lcublas -lstdc++
endif

VERSION := $(shell git describe --always --dirty 2>/dev/null || echo unknown)
CFLAGS += -DEXO_VERSION='"0.1.0 ($(VERSION))"'

SRC := $(shell find src -name '*.c' | sort)
CXX_SRC := $(shell find src -name '*.cc' | sort)
MAIN_SRC := src/main.c
LIB_SRC := $(filter-out $(MAIN_SRC),$(SRC))
LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/obj/%.o) $(CXX_SRC:%.cc=$(BUILD)/obj/%.o) $(CU_OBJ)
LIB := $(BUILD)/libexo.a

UNIT_SRC := $(sort $(wildcard tests/unit/test_*.c))
UNIT_BIN := $(UNIT_SRC:tests/unit/%.c=$(BUILD)/tests/%)

TOOLS := $(notdir $(patsubst %/,%,$(sort $(dir $(wildcard tools/*/*.c)))))
TOOL_BIN := $(TOOLS:%=$(BUILD)/tools/%)

ifneq ($(CROSS),)
LIB_SRC := $(filter $(CROSS_DIRS:%=src/%/%),$(LIB_SRC)) $(CROSS_EXTRA)
LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
UNIT_BIN := $(CROSS_TESTS:%=$(BUILD)/tests/%)
endif

.PHONY: all test test-san test-aarch64 unit e2e run fuzz clean format deps bench
ifeq ($(CROSS),)
all: $(BUILD)/exo $(TOOL_BIN) $(UNIT_BIN)
else
all: $(UNIT_BIN)
endif

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	@echo '  CC   $<'
	@$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/obj/%.o: %.cc
	@mkdir -p $(dir $@)
	@echo '  CXX  $<'
	@$(CXX) $(CXXFLAGS) -c $< -o $@

$(BUILD)/obj/%.o: %.cu
	@mkdir -p $(dir $@)
	@echo '  NVCC $<'
	@$(NVCC) $(NVCC_FLAGS) -Isrc -DEXO_CUDA=1 -MMD -MP -c $< -o $@

$(LIB): $(LIB_OBJ)
	@mkdir -p $(dir $@)
	@rm -f $@ && ar rcs $@ $^

$(BUILD)/exo: $(BUILD)/obj/src/main.o $(LIB)
	@echo '  LD   $@'
	@$(CC) $(LDFLAGS) $^ $(LDLIBS) -o $@

# A tool is every .c file in tools/<name>/, linked against libexo.a. (No % inside the
# prerequisite functions: in a pattern rule make would replace it with the stem.)
.SECONDEXPANSION:
$(BUILD)/tools/%: $$(addprefix $(BUILD)/obj/,$$(subst .c,.o,$$(wildcard tools/%/*.c))) $(LIB)
	@mkdir -p $(dir $@)
	@echo '  LD   $@'
	@$(CC) $(LDFLAGS) $^ $(LDLIBS) -o $@

$(BUILD)/tests/%: $(BUILD)/obj/tests/unit/%.o $(LIB)
	@mkdir -p $(dir $@)
	@echo '  LD   $@'
	@$(CC) $(LDFLAGS) $^ $(LDLIBS) -lcmocka -o $@

deps:
	@bash scripts/deps.sh

NPROC := $(shell nproc 2>/dev/null || echo 2)

# The one test command: unit tests then end-to-end tests, one summary line at the end.
test: deps
	@$(MAKE) --no-print-directory -j$(NPROC) all
	@bash tests/run-all.sh $(BUILD)

# The aarch64 unit tests under qemu-user: once on a CPU with dotprod and i8mm (every NEON level),
# once on a Cortex-A72 (plain NEON: run-time detection must fall back). The engine tests find
# their models through the native build's mkmodel (EXO_MKMODEL_BUILD).
test-aarch64: deps
	@bash scripts/deps.sh --cross
	@$(MAKE) --no-print-directory -j$(NPROC) all
	@$(MAKE) --no-print-directory -j$(NPROC) CROSS=aarch64-linux-gnu- all
	@bash tests/run-cross.sh build/aarch64 $(BUILD)

# Whole suite (unit + e2e) against build/san; sanitizer reports fail it.
test-san: deps
	@$(MAKE) --no-print-directory SAN=1 test

unit:
	@$(MAKE) --no-print-directory -j$(NPROC) all
	@bash tests/run-unit.sh $(BUILD)

e2e:
	@$(MAKE) --no-print-directory -j$(NPROC) all
	@bash tests/run-e2e.sh $(BUILD)

# The node and the tools the README's next commands call (build/exo, build/tools/*): no unit
# tests, no test-only packages.
run:
	@bash scripts/deps.sh run
	@$(MAKE) --no-print-directory -j$(NPROC) $(BUILD)/exo $(TOOL_BIN)
	@bash scripts/run-demo.sh $(BUILD)

bench:
	@$(MAKE) --no-print-directory -j$(NPROC) RELEASE=1 all
	@bash bench/run.sh build/release

# libFuzzer targets: tests/fuzz/fuzz_*.c, each linked with the library built for fuzzing.
FUZZ_SRC := $(sort $(wildcard tests/fuzz/fuzz_*.c))
fuzz:
	@$(MAKE) --no-print-directory -j$(NPROC) CC=clang BUILD=build/fuzz \
	  EXTRA_CFLAGS="-fsanitize=fuzzer-no-link,address,undefined -O1" build/fuzz/libexo.a
	@mkdir -p build/fuzz/bin
	@for f in $(FUZZ_SRC); do n=$$(basename $$f .c); \
	  echo "  FUZZ $$n"; \
	  clang -std=c17 -g -O1 -D_GNU_SOURCE -Isrc $(PKG_CFLAGS) -fsanitize=fuzzer,address,undefined \
	    $$f build/fuzz/libexo.a $(LDLIBS) -o build/fuzz/bin/$$n || exit 1; done

format:
	@find src tests/unit tests/fuzz tools -name '*.[ch]' -o -name '*.cc' | xargs clang-format -i

clean:
	rm -rf build

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
