"""bench/mlserver_runtime/onnx_runtime.py - the smallest MLServer runtime that serves an ONNX file with onnxruntime.

MLServer (PyPI `mlserver`) has no ONNX runtime of its own; this is what a user would write to serve one:
model-settings.json names `onnx_runtime.OnnxModel` as its implementation and `parameters.uri` as the .onnx file
(bench/grpc_bench.py writes those files under bench/out/ and puts this folder on PYTHONPATH).

load() creates one onnxruntime InferenceSession with onnxruntime's defaults (CPUExecutionProvider, intra-op threads =
cores: what `InferenceSession(path)` gives a user); predict() decodes every request input with MLServer's
NumpyCodec, runs the session once and encodes every output with NumpyCodec. Nothing is tuned: MLServer's own
settings (parallel_workers, codecs, batching off) stay at their defaults.
"""
import onnxruntime as ort
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse
from mlserver.utils import get_model_uri


class OnnxModel(MLModel):
    async def load(self) -> bool:
        path = await get_model_uri(self._settings)
        self._session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        self._output_names = [o.name for o in self._session.get_outputs()]
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        feeds = {inp.name: self.decode(inp, default_codec=NumpyCodec) for inp in payload.inputs}
        outs = self._session.run(self._output_names, feeds)
        return InferenceResponse(
            model_name=self.name,
            model_version=self.version,
            outputs=[NumpyCodec.encode_output(name, out) for name, out in zip(self._output_names, outs)],
        )
