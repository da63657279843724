# fuzz.mk - build and run the libFuzzer targets for the model loaders (ONNX protobuf, .npy) and the gRPC request
# decoders (TF Serving's and KServe v2's messages, fuzz_grpc.c).
#   make -f tests/fuzz/fuzz.mk FUZZ_TIME=60     build, seed, run each target for its share of FUZZ_TIME seconds
# Targets and the loader sources they need are compiled with clang -fsanitize=fuzzer(-no-link),address,undefined
# into build/fuzz/. The corpus lives in build/fuzz/corpus (seeded from the ONNX backend test models; never
# committed). A crash, leak, sanitizer report, timeout or RSS blow-up makes this exit non-zero; the
# reproducer is left in build/fuzz/artifacts/.
SHELL := /bin/bash
CLANG ?= clang
FUZZ_TIME ?= 60
FUZZ_OUT := build/fuzz
FUZZ_GEN := $(FUZZ_OUT)/gen
CONF ?= /usr/share/libonnx-testdata/data
TARGETS := onnx npy grpc
PER_TARGET := $(shell echo $$(( ($(FUZZ_TIME) + 2) / 3 )))

SAN := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
FCFLAGS := -std=gnu11 -g -O1 -I. -I$(FUZZ_GEN) $(SAN) -Wall -Wextra -Wno-unused-parameter \
	-Wno-missing-field-initializers
LIB_SRC := engine/ir/graph.c engine/ir/onnx-load.c engine/ir/onnx-tensor.c engine/ir/onnx-save.c engine/ir/file-io.c \
	engine/ir/npy.c engine/ir/tensor.c engine/ir/status.c engine/ir/seq.c
LIB_OBJ := $(FUZZ_GEN)/onnx.pb-c.o $(patsubst %.c,$(FUZZ_OUT)/obj/%.o,$(LIB_SRC))
BINS := $(patsubst %,$(FUZZ_OUT)/fuzz_%,$(TARGETS))

.PHONY: run build seed
run: build seed
	@mkdir -p $(FUZZ_OUT)/artifacts
	@set -e; for t in $(TARGETS); do \
	  echo "== fuzz_$$t for $(PER_TARGET)s"; \
	  $(FUZZ_OUT)/fuzz_$$t -max_total_time=$(PER_TARGET) -rss_limit_mb=2048 -timeout=20 -max_len=65536 \
	    -print_final_stats=1 -artifact_prefix=$(FUZZ_OUT)/artifacts/$$t- $(FUZZ_OUT)/corpus/$$t \
	    2> >(tail -n 40 >&2) || { echo "fuzz_$$t FAILED: reproducer in $(FUZZ_OUT)/artifacts/"; exit 1; }; \
	done
	@echo "fuzz: no crashes in $(FUZZ_TIME)s"

build: $(BINS)

$(FUZZ_GEN)/onnx.pb-c.c $(FUZZ_GEN)/onnx.pb-c.h: /usr/include/onnx/onnx.proto
	@mkdir -p $(FUZZ_GEN)
	protoc-c --c_out=$(FUZZ_GEN) -I/usr/include/onnx /usr/include/onnx/onnx.proto

$(FUZZ_GEN)/onnx.pb-c.o: $(FUZZ_GEN)/onnx.pb-c.c
	$(CLANG) $(FCFLAGS) -fsanitize=fuzzer-no-link -w -c $< -o $@

$(FUZZ_OUT)/obj/%.o: %.c $(FUZZ_GEN)/onnx.pb-c.h $(wildcard engine/*.h engine/*/*.h)
	@mkdir -p $(dir $@)
	$(CLANG) $(FCFLAGS) -fsanitize=fuzzer-no-link -c $< -o $@

$(FUZZ_OUT)/fuzz_%: tests/fuzz/fuzz_%.c $(LIB_OBJ)
	$(CLANG) $(FCFLAGS) -fsanitize=fuzzer -o $@ $< $(LIB_OBJ) -lprotobuf-c -lm

# The gRPC decoders #include their server sources and the messages generated from proto/.
GRPC_PROTO := $(wildcard proto/*.proto)
$(FUZZ_GEN)/proto/.done: $(GRPC_PROTO)
	@mkdir -p $(FUZZ_GEN)/proto
	protoc-c --c_out=$(FUZZ_GEN)/proto -Iproto $(GRPC_PROTO)
	@touch $@

$(FUZZ_OUT)/fuzz_grpc: tests/fuzz/fuzz_grpc.c $(LIB_OBJ) $(FUZZ_GEN)/proto/.done $(wildcard server/*.c server/*.h)
	$(CLANG) $(FCFLAGS) -I$(FUZZ_GEN)/proto -fsanitize=fuzzer -o $@ $< $(LIB_OBJ) -lprotobuf-c -lcjson -lm

# Seeds: a spread of ~40 backend-test models (copied once; libFuzzer adds its finds next to them) and a few
# hand-written .npy files.
seed:
	@mkdir -p $(FUZZ_OUT)/corpus/onnx $(FUZZ_OUT)/corpus/npy $(FUZZ_OUT)/corpus/grpc
	@if [ -z "$$(ls -A $(FUZZ_OUT)/corpus/grpc)" ]; then python3 tests/fuzz/grpc_seeds.py $(FUZZ_OUT)/corpus/grpc; fi
	@if [ -z "$$(ls -A $(FUZZ_OUT)/corpus/onnx)" ] && [ -d $(CONF) ]; then \
	  find $(CONF)/node $(CONF)/pytorch-converted -name model.onnx -size -64k 2>/dev/null | sort | awk 'NR % 30 == 1' | \
	  head -n 48 | while read -r f; do cp "$$f" "$(FUZZ_OUT)/corpus/onnx/$$(basename $$(dirname $$f)).onnx"; done; \
	fi
	@if [ -z "$$(ls -A $(FUZZ_OUT)/corpus/npy)" ]; then \
	  npy() { local v=$$1 h=$$2 n=$$(( $${#2} + 1 )) f=$(FUZZ_OUT)/corpus/npy/$$4; \
	    if [ $$v = 1 ]; then printf "\x93NUMPY\x01\x00\x$$(printf %02x $$n)\x00%s\n" "$$h" > $$f; \
	    else printf "\x93NUMPY\x0$$v\x00\x$$(printf %02x $$n)\x00\x00\x00%s\n" "$$h" > $$f; fi; \
	    head -c $$3 /dev/zero >> $$f; }; \
	  npy 1 "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }" 24 f4.npy; \
	  npy 2 "{'descr': '|b1', 'fortran_order': False, 'shape': (), }" 1 b1.npy; \
	  npy 3 "{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }" 24 i8.npy; \
	  npy 1 "{'descr': '<f2', 'fortran_order': False, 'shape': (0, 4), }" 0 f2.npy; \
	fi

# keep the objects between runs
.SECONDARY:
