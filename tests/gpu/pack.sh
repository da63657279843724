#!/usr/bin/env bash
# tests/gpu/pack.sh - run HERE (the build machine) before tests/gpu/run.sh goes to a GPU machine.
#
# The GPU machine (tools: device) is bare: CUDA's toolkit and Python with PyTorch/onnx/numpy, none of Debian's
# libraries tensord links (oneDNN, gRPC, libmicrohttpd, OpenBLAS...), no network. So this builds here with CUDA on
# and writes .gpu/bundle.tar.xz (git-ignored; name it in the device tool's `carry`): the binaries (tensord, the CUDA
# plugin, test_ops, gpu_bench, grpc_load), every non-libc shared library they load here except CUDA's own (the GPU
# machine's toolkit and its PyTorch wheels provide cuBLAS, cuDNN and NCCL), the ONNX backend test data and the
# expected-pass lists, and a serialized KServe ModelInfer request for ResNet-50 (tritonclient from .venv).
# About 40 MB. Then, on the device machine: `bash tests/gpu/run.sh` (see there).
set -euo pipefail
cd "$(dirname "$0")/../.."
make -j"$(nproc)" CUDA=1 build/tensord build/libtensord_cuda.so build/tests/test_ops build/tests/gpu_bench
mkdir -p build/bench && gcc -O2 -o build/bench/grpc_load bench/grpc_load.c -lgrpc -lgpr -lpthread
rm -rf build/gpu-pack && mkdir -p build/gpu-pack/bin build/gpu-pack/lib build/gpu-pack/data
cp build/tensord build/libtensord_cuda.so build/tests/test_ops build/tests/gpu_bench build/bench/grpc_load build/gpu-pack/bin/
for b in build/gpu-pack/bin/*; do
    ldd "$b" | awk '/=> \//{print $3}'
done | sort -u | grep -v -E '/(libc|libm|libpthread|libdl|librt|ld-linux[^/]*|libgcc_s|libstdc\+\+)\.so' \
     | grep -v -E 'lib(cuda|cudart|cublas|cublasLt|cudnn[a-z_]*|nccl|nvrtc|nvJitLink)\.so' \
     | while read -r l; do cp -L "$l" build/gpu-pack/lib/; done
cp -r /usr/share/libonnx-testdata/data/{node,pytorch-converted,pytorch-operator,simple} build/gpu-pack/data/
cp tests/conformance/expected-*.txt build/gpu-pack/data/
# ResNet-50's requests: [1,3,S,S] float32 input "x" (the torchvision export's name), seeded; S = 224 and 64 (quick)
.venv/bin/python - <<'PY'
import numpy as np
from tritonclient.grpc import service_pb2
for s in (224, 64):
    x = np.random.default_rng(0).standard_normal((1, 3, s, s)).astype(np.float32)
    req = service_pb2.ModelInferRequest(model_name="resnet50")
    req.inputs.add(name="x", datatype="FP32", shape=list(x.shape))
    req.raw_input_contents.append(x.tobytes())
    open(f"build/gpu-pack/data/resnet50_infer_{s}.pb", "wb").write(req.SerializeToString())
PY
mkdir -p .gpu
tar -cJf .gpu/bundle.tar.xz -C build/gpu-pack .
ls -la .gpu/bundle.tar.xz
