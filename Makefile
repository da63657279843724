# tensord - one Makefile for the library, the binary, tests, fuzzing and benchmarks.
#   make            build build/tensord and build/libtensord.a
#   make deps       install system packages (apt) and the Python test tools (.venv)
#   make test       unit tests, ONNX conformance with expected-pass lists, pytest cross-checks, a bounded fuzz run
#   make SAN=1 test the same under AddressSanitizer + UBSan (build/san)
#   make test-container  build the Docker image (Dockerfile, cpu target) with podman and run it as users do; CI runs it
#                   after make test (tests/container/)
#   make CUDA=0     skip the CUDA backend (built by default when nvcc is found: build/libtensord_cuda.so, a plugin the
#                   binary loads at start; with no GPU or driver it logs "no CUDA device, using CPU" and runs on the CPU)
#   make bench      run the benchmarks against onnxruntime (bench/)
SHELL := /bin/bash
comma := ,
CC ?= gcc
ARCH ?= native
SAN ?= 0
CUDA ?= auto
PY ?= .venv/bin/python

ifeq ($(SAN),1)
BUILD ?= build/san
SANFLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
OPT := -O1 -g
else
BUILD ?= build
SANFLAGS :=
OPT := -O3 -g
endif

GEN := $(BUILD)/gen
WERROR := $(if $(CI),-Werror,)
CFLAGS_BASE := -std=gnu11 -march=$(ARCH) $(OPT) -fno-math-errno -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers \
	$(WERROR) -fopenmp -fPIC -I. -I$(GEN) -I$(GEN)/proto $(SANFLAGS)
CFLAGS += $(CFLAGS_BASE)
LDLIBS := -lgrpc -lgpr -lmicrohttpd -lcjson -lsqlite3 -ldnnl -lopenblas -lprotobuf-c -lcrypto -lz -lm -lpthread -fopenmp $(SANFLAGS)

# ---- feature detection: one line per feature ----
NVCC := $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
ifeq ($(CUDA),auto)
CUDA_ON := $(if $(NVCC),1,0)
else
CUDA_ON := $(CUDA)
endif
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
# sm_80 (A100) and sm_90 (H100/H200) code, plus PTX of sm_90 for newer cards to JIT.
CUDA_ARCH ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90
HAVE_CUDNN := $(shell test -f $(CUDA_HOME)/include/cudnn.h -o -f /usr/include/cudnn.h && echo 1 || echo 0)
HAVE_NCCL := $(shell test -f $(CUDA_HOME)/include/nccl.h -o -f /usr/include/nccl.h && echo 1 || echo 0)
NVCCFLAGS := -O3 -std=c++20 $(CUDA_ARCH) -I. -Xcompiler -fPIC,-Wall,-Wextra,-Wno-unused-parameter,-Wno-missing-field-initializers \
	$(if $(CI),-Werror all-warnings,) -DTENSORD_NCCL=$(HAVE_NCCL)
CUDA_LIBS := -L$(CUDA_HOME)/lib64 -lcudart -lcublasLt -lcublas -lcudnn $(if $(filter 1,$(HAVE_NCCL)),-lnccl,) -Xlinker -rpath=$(CUDA_HOME)/lib64
HAVE_DNNL := $(shell test -f /usr/include/dnnl.h && echo 1 || echo 0)
HAVE_ONNX_PROTO := $(shell test -f /usr/include/onnx/onnx.proto && echo 1 || echo 0)
$(info tensord build: oneDNN $(if $(filter 1,$(HAVE_DNNL)),found,NOT FOUND (make deps)))
$(info tensord build: onnx.proto $(if $(filter 1,$(HAVE_ONNX_PROTO)),found,NOT FOUND (make deps)))
# MPI (Debian's OpenMPI, libopenmpi-dev): multi-process training under mpirun (engine/train/comm-mpi.c). MPI=0 turns
# it off; without it `mpirun ... tensord train` refuses with a message.
MPI ?= auto
MPI_CFLAGS := $(if $(filter 0,$(MPI)),,$(shell pkg-config --cflags ompi-c 2>/dev/null))
MPI_LIBS := $(if $(MPI_CFLAGS),$(shell pkg-config --libs ompi-c 2>/dev/null),)
ifneq ($(MPI_LIBS),)
CFLAGS_BASE += -DTENSORD_MPI=1 $(MPI_CFLAGS)
LDLIBS += $(MPI_LIBS)
endif
$(info tensord build: MPI $(if $(MPI_LIBS),found (OpenMPI: mpirun -np N tensord train),$(if $(filter 0,$(MPI)),off (MPI=0),not found (make deps installs libopenmpi-dev))))
$(info tensord build: CUDA $(if $(filter 1,$(CUDA_ON)),on (nvcc $(NVCC); build/libtensord_cuda.so),off$(if $(NVCC), (CUDA=0), (nvcc not found))))
$(if $(filter 1,$(CUDA_ON)),$(info tensord build: cuDNN $(if $(filter 1,$(HAVE_CUDNN)),found,NOT FOUND)$(comma) NCCL $(if $(filter 1,$(HAVE_NCCL)),found,not found (multi-GPU training off))))

LIB_SRC := $(wildcard engine/*.c engine/*/*.c kernels/*.c kernels/cpu/*.c kernels/sim/*.c)
BIN_SRC := $(wildcard server/*.c admin/*.c models/*.c)
CU_SRC := $(wildcard kernels/cuda/*.cu)
LIB_OBJ := $(GEN)/onnx.pb-c.o $(patsubst %.c,$(BUILD)/obj/%.o,$(LIB_SRC))
# The gRPC APIs' messages (proto/*.proto, written to the public field numbers) are generated at build time.
PROTO_SRC := $(wildcard proto/*.proto)
PROTO_C := $(patsubst proto/%.proto,$(GEN)/proto/%.pb-c.c,$(PROTO_SRC))
PROTO_H := $(PROTO_C:.c=.h)
PROTO_OBJ := $(PROTO_C:.c=.o)
# The admin dashboard (admin/dashboard.html: HTML, CSS and JS in one file, no build step) is embedded in the binary.
DASH_C := $(GEN)/dashboard-html.c
BIN_OBJ := $(patsubst %.c,$(BUILD)/obj/%.o,$(BIN_SRC)) $(PROTO_OBJ) $(DASH_C:.c=.o)
CU_OBJ := $(patsubst %.cu,$(BUILD)/obj/%.o,$(CU_SRC))
UNIT_SRC := $(wildcard tests/unit/test_*.c)
UNIT_BIN := $(patsubst tests/unit/%.c,$(BUILD)/tests/%,$(UNIT_SRC))

.PHONY: all deps test test-build test-unit test-ops test-conformance test-py test-san test-fuzz test-container bench demo serve-demo clean cuda
all: $(BUILD)/tensord $(BUILD)/libtensord.a $(if $(filter 1,$(CUDA_ON)),$(BUILD)/libtensord_cuda.so,)

$(GEN)/onnx.pb-c.c $(GEN)/onnx.pb-c.h: /usr/include/onnx/onnx.proto
	@mkdir -p $(GEN)
	protoc-c --c_out=$(GEN) -I/usr/include/onnx /usr/include/onnx/onnx.proto

$(GEN)/onnx.pb-c.o: $(GEN)/onnx.pb-c.c
	$(CC) $(CFLAGS_BASE) -w -c $< -o $@

$(PROTO_C) $(PROTO_H) &: $(PROTO_SRC)
	@mkdir -p $(GEN)/proto
	protoc-c --c_out=$(GEN)/proto -Iproto $(PROTO_SRC)

$(DASH_C): admin/dashboard.html
	@mkdir -p $(GEN)
	xxd -i -n adm_dashboard_html $< > $@.tmp && mv $@.tmp $@

$(DASH_C:.c=.o): $(DASH_C)
	$(CC) $(CFLAGS_BASE) -w -c $< -o $@

$(GEN)/proto/%.pb-c.o: $(GEN)/proto/%.pb-c.c $(PROTO_H)
	$(CC) $(CFLAGS_BASE) -w -c $< -o $@

$(BUILD)/obj/%.o: %.c $(GEN)/onnx.pb-c.h $(PROTO_H) Makefile
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/libtensord.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

# -rdynamic: the CUDA plugin calls the engine's eng_err & co. from the binary that loaded it.
$(BUILD)/tensord: $(BIN_OBJ) $(BUILD)/libtensord.a
	$(CC) $(CFLAGS) -rdynamic -o $@ $(BIN_OBJ) $(BUILD)/libtensord.a $(LDLIBS) -ldl

cuda: $(BUILD)/libtensord_cuda.so
$(BUILD)/obj/%.o: %.cu $(wildcard kernels/cuda/*.h) kernels/kernel.h kernels/backend-impl.h kernels/krn-*.h Makefile
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

$(BUILD)/libtensord_cuda.so: $(CU_OBJ)
	$(NVCC) -shared $(CUDA_ARCH) -o $@ $(CU_OBJ) $(CUDA_LIBS)

# Unit tests #include the server sources they test: -MMD records those, so editing one rebuilds the test.
$(BUILD)/tests/%: tests/unit/%.c $(BUILD)/libtensord.a $(PROTO_H) Makefile
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -rdynamic -MMD -MP -MF $@.d -o $@ $< $(BUILD)/libtensord.a -lcriterion $(LDLIBS) -ldl

# The op x backend x precision walker (tests/test_ops.c): its own binary, not a Criterion test, since it is one
# table-driven run over the ONNX node tests that prints a summary table.
$(BUILD)/tests/test_ops: tests/test_ops.c $(BUILD)/libtensord.a Makefile
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -rdynamic -MMD -MP -MF $@.d -o $@ $< $(BUILD)/libtensord.a $(LDLIBS) -ldl

# The CUDA matmul kernel against a bare cuBLASLt call (tests/gpu/run.sh runs it on a GPU machine).
$(BUILD)/tests/gpu_bench: tests/gpu/gpu_bench.c $(BUILD)/libtensord.a Makefile
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -rdynamic -MMD -MP -MF $@.d -o $@ $< $(BUILD)/libtensord.a $(LDLIBS) -ldl

-include $(shell find $(BUILD)/obj $(BUILD)/tests -name '*.d' 2>/dev/null)

# ---- dependencies ----
# deploy/packages/: build.txt (compiling), runtime.txt (what the binary loads; the images install it too),
# test.txt (tests and benchmarks only). One package a line, `#` comments; the Dockerfile reads the same files.
APT_PKGS := $(strip $(shell sed 's/\#.*//' deploy/packages/build.txt deploy/packages/runtime.txt deploy/packages/test.txt))
deps:
	@if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	 $$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q $(APT_PKGS)
	test -x .venv/bin/python || python3 -m venv .venv
	.venv/bin/pip install -q --upgrade pip
	.venv/bin/pip install -q -r tests/requirements.txt

# ---- tests ----
CONF := /usr/share/libonnx-testdata/data
# The suites run one after another; what they need is built first with every core (nvcc and gcc alike).
NPROC := $(shell nproc 2>/dev/null || echo 1)
test: test-build test-unit test-ops test-conformance test-py test-san test-fuzz
	@echo "make test: all suites passed"

test-build:
	@$(MAKE) --no-print-directory -j$(NPROC) all $(UNIT_BIN) $(BUILD)/tests/test_ops

test-unit: $(UNIT_BIN)
	@set -e; for t in $(UNIT_BIN); do echo "== $$t"; $$t --jobs 2; done

# Every op x backend x precision against the CPU's fp32 outputs, on the ONNX tests our fp32 run passes (the node
# suite for every op, the others for real-size convolutions); skips, saying why, a backend or a precision this
# build or this CPU lacks (STYLE.md, Tests).
OPS_ARGS := $(foreach s,node pytorch-converted pytorch-operator simple,--data $(CONF)/$(s) --expect tests/conformance/expected-$(s).txt)
test-ops: $(BUILD)/tests/test_ops
	@echo "== $<"; $< $(OPS_ARGS)

# Then again with every provably row-independent plan split into one-row chunks on 2 threads: the batch-split
# analysis (engine/plan/plan-split.c) must never change an answer on the ONNX test models.
test-conformance: $(BUILD)/tensord
	@set -e; for s in node pytorch-converted pytorch-operator simple; do \
	  echo "== conformance $$s"; \
	  $(BUILD)/tensord conformance $(CONF)/$$s --expect tests/conformance/expected-$$s.txt; \
	done
	@set -e; for s in node pytorch-converted pytorch-operator simple; do \
	  echo "== conformance $$s, batches split into one-row chunks"; \
	  TENSORD_SPLIT_ROWS=1 $(BUILD)/tensord conformance $(CONF)/$$s --threads 2 --expect tests/conformance/expected-$$s.txt; \
	done

# The unit tests and the whole conformance run again under AddressSanitizer + UBSan (each test isolated in a
# child process so that a crash is named, and counted as a failure).
# LeakSanitizer's exit code is left at 0 for the unit tests: tests/san_check.py reads each log instead, so that
# Criterion's own runner block (all frames in libcriterion) does not fail a run, and any leak in our code does.
SAN_ENV := ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp UBSAN_OPTIONS=print_stacktrace=1
SAN_UNIT_ENV := $(SAN_ENV) LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp:exitcode=0
test-san:
	$(MAKE) --no-print-directory -j$(NPROC) SAN=1 build/san/tensord build/san/tests/test_ops $(patsubst tests/unit/%.c,build/san/tests/%,$(UNIT_SRC))
	@set -e; for t in $(patsubst tests/unit/%.c,build/san/tests/%,$(UNIT_SRC)); do echo "== (asan) $$t"; \
	  $(SAN_UNIT_ENV) $$t --jobs 2 > $$t.log 2>&1 || { tail -n 30 $$t.log; echo "$$t failed ($$t.log)"; exit 1; }; \
	  grep -E "Synthesis" $$t.log; \
	  $(PY) tests/san_check.py $$t.log || exit 1; \
	done
	@echo "== (asan) build/san/tests/test_ops"; $(SAN_ENV) build/san/tests/test_ops $(OPS_ARGS) > build/san/test_ops.log 2>&1 \
	  || { grep -E "^FAIL|Sanitizer|runtime error:" build/san/test_ops.log | head -n 30; tail -n 1 build/san/test_ops.log; \
	       echo "test_ops failed (build/san/test_ops.log)"; exit 1; }; tail -n 1 build/san/test_ops.log
	@if grep -qE "ERROR: (Address|Leak)Sanitizer|runtime error:" build/san/test_ops.log; then \
	  echo "sanitizer report in test_ops (build/san/test_ops.log)"; exit 1; fi
	@set -e; for s in node pytorch-converted pytorch-operator simple; do \
	  echo "== (asan) conformance $$s"; \
	  $(SAN_ENV) build/san/tensord conformance $(CONF)/$$s --isolate --expect tests/conformance/expected-$$s.txt 2>&1 | tee build/san/conformance-$$s.log | tail -n 3; \
	  if grep -qE "ERROR: (Address|Leak)Sanitizer|runtime error:" build/san/conformance-$$s.log; then \
	    echo "sanitizer report in conformance $$s (build/san/conformance-$$s.log)"; exit 1; fi; \
	  grep -q "^REGRESSION\|tests crashed" build/san/conformance-$$s.log && exit 1 || true; \
	done

test-py: $(BUILD)/tensord
	TENSORD_BIN=$(BUILD)/tensord $(PY) -m pytest -q tests/integration

FUZZ_TIME ?= 60
test-fuzz:
	$(MAKE) --no-print-directory -f tests/fuzz/fuzz.mk FUZZ_TIME=$(FUZZ_TIME)

# The Docker image (Dockerfile, cpu target) built with podman and run as a TF Serving user would: REST and gRPC
# answers equal this build's, health check, non-root, SIGTERM drains. About 3 minutes the first time (a debian:12
# base made with debootstrap, apt inside the build), 1-2 after; not part of `make test`. tests/container/.
test-container: $(BUILD)/tensord
	TENSORD_BIN=$(BUILD)/tensord $(PY) -m pytest -v -rs tests/container

bench: all
	$(PY) bench/run.py

# The main job on the bundled demo model: build the demo bundle, run tensord on 16 Fashion-MNIST test images.
demo: all
	$(PY) models/demo/make_demo.py --out $(BUILD)/demo
	$(BUILD)/tensord predict --model $(BUILD)/demo/fashion/1 --input images=$(BUILD)/demo/images.npy --output-dir $(BUILD)/demo/out
	$(PY) models/demo/show.py $(BUILD)/demo/out/probabilities.npy $(BUILD)/demo/labels.npy

# Serve the demo bundle on the TF Serving ports (gRPC 8500, REST 8501) until Ctrl-C, on loopback only; `make serve-demo
# DEMO_HOST=0.0.0.0` exposes it on every interface.
DEMO_HOST ?= 127.0.0.1
serve-demo: demo
	$(BUILD)/tensord serve --port=8500 --rest_api_host=$(DEMO_HOST) --rest_api_port=8501 --model_name=fashion --model_base_path=$(BUILD)/demo/fashion

clean:
	rm -rf build
