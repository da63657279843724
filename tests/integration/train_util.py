"""What the data-parallel training tests share (test_mpi_train.py, test_device_train.py): a small MLP base version
and a learnable 3-class dataset, and reading a version's float weights."""
import subprocess

import numpy as np
import onnx
from onnx import numpy_helper


def mlp_and_data(tensord_bin, tmp_path, rows, timeout=180):
    """<tmp>/m/1: `tensord init` MLP 20-32-3 (seed 0); <tmp>/d.npz: `rows` rows of x in [0,1)^20, label from x[:3]."""
    base = tmp_path / "m"
    cp = subprocess.run([tensord_bin, "init", "--arch", "mlp", "--opt", "input=20", "--opt", "hidden=32",
                         "--opt", "classes=3", "--seed", "0", "--out", str(base / "1")],
                        capture_output=True, text=True, timeout=timeout)
    assert cp.returncode == 0, cp.stderr
    rng = np.random.default_rng(1)
    x = rng.random((rows, 20)).astype(np.float32)
    y = (x[:, :3].sum(1) * 2).astype(np.int64) % 3
    data = tmp_path / "d.npz"
    np.savez(data, x=x, label=y)
    return base, data


def weights(base, version):
    m = onnx.load(str(base / str(version) / "model.onnx"))
    return {i.name: numpy_helper.to_array(i) for i in m.graph.initializer if i.data_type == onnx.TensorProto.FLOAT}
