"""gRPC over TLS: TF Serving's --ssl_config_file (server_key, server_cert, custom_ca, client_verify) against the real
binary, with certificates made here by the openssl command line tool (Debian's openssl package).

- TLS on: a client that trusts the CA gets its Predict answered, bit-equal to REST; a plaintext client is refused.
- client_verify: a client without a certificate is refused; one with a certificate signed by custom_ca is served.
- A config without server_cert makes `tensord serve` exit with an error naming the file and the field.
"""
import os
import shutil
import subprocess

import grpc
import numpy as np
import pytest

import serving_util as u

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command (Debian openssl)")


def _run(*args, cwd):
    subprocess.run(args, cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("pki"))
    _run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days",
         "2", "-subj", "/CN=tensord test CA", cwd=d)
    with open(os.path.join(d, "ext.cnf"), "w") as f:
        f.write("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    for who in ("server", "client"):
        _run("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{who}.key", "-out", f"{who}.csr", "-subj",
             f"/CN={'localhost' if who == 'server' else 'tensord test client'}", cwd=d)
        _run("openssl", "x509", "-req", "-in", f"{who}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", f"{who}.pem", "-days", "2", "-extfile", "ext.cnf", cwd=d)

    def read(name):
        with open(os.path.join(d, name), "rb") as f:
            return f.read()
    return {k: read(k) for k in ("ca.pem", "server.key", "server.pem", "client.key", "client.pem")} | {"dir": d}


def _quote(pem):
    """A PEM text as text-format string literals, one per line (adjacent literals concatenate)."""
    return "\n".join('"' + line + '\\n"' for line in pem.decode().strip().splitlines())


def _ssl_config(pki, path, client_verify=False, with_cert=True):
    text = f"server_key: {_quote(pki['server.key'])}\n"
    if with_cert:
        text += f"server_cert: {_quote(pki['server.pem'])}\n"
    if client_verify:
        text += f"custom_ca: {_quote(pki['ca.pem'])}\nclient_verify: true\n"
    u.write_text(path, text)
    return path


def _serve(tmp_path, cfg):
    base = str(tmp_path / "m")
    u.write_version(base, 1, u.mm_model())
    srv = u.Server(tmp_path, base_path=base, grpc=True, extra=[f"--ssl_config_file={cfg}"])  # waits for the port
    return srv, srv.grpc_port


def _predict(channel, x):
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc
    import tensorflow as tf
    rq = predict_pb2.PredictRequest()
    rq.model_spec.name = "m"
    rq.inputs["x"].CopyFrom(tf.make_tensor_proto(x))
    r = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(rq, timeout=20)
    return tf.make_ndarray(r.outputs["y"])


def test_tls_serves_trusting_clients_and_refuses_plaintext(tmp_path, pki):
    cfg = _ssl_config(pki, str(tmp_path / "ssl.cfg"))
    srv, gport = _serve(tmp_path, cfg)
    with srv:
        x = u.randn((3, 4), seed=3)
        creds = grpc.ssl_channel_credentials(root_certificates=pki["ca.pem"])
        with grpc.secure_channel(f"localhost:{gport}", creds) as ch:
            y = _predict(ch, x)
        r = srv.post_json("/v2/models/m/infer", {"inputs": [{"name": "x", "shape": [3, 4], "datatype": "FP32",
                                                             "data": x.flatten().tolist()}],
                                                 "outputs": [{"name": "y", "parameters": {"binary_data": True}}]})
        assert r.status_code == 200, r.text
        hl = int(r.headers["Inference-Header-Content-Length"])
        rest = np.frombuffer(r.content[hl:], dtype=np.float32).reshape(y.shape)
        assert y.tobytes() == rest.tobytes(), f"gRPC over TLS {y} != REST {rest}"
        with grpc.insecure_channel(f"127.0.0.1:{gport}") as ch:
            with pytest.raises(grpc.RpcError) as ei:
                _predict(ch, x)
            assert ei.value.code() == grpc.StatusCode.UNAVAILABLE, ei.value
        assert "(TLS)" in srv.stderr()


def test_client_verify_needs_a_certificate_from_custom_ca(tmp_path, pki):
    cfg = _ssl_config(pki, str(tmp_path / "ssl.cfg"), client_verify=True)
    srv, gport = _serve(tmp_path, cfg)
    with srv:
        x = u.randn((1, 4), seed=4)
        anon = grpc.ssl_channel_credentials(root_certificates=pki["ca.pem"])
        with grpc.secure_channel(f"localhost:{gport}", anon) as ch:
            with pytest.raises(grpc.RpcError) as ei:
                _predict(ch, x)
            assert ei.value.code() == grpc.StatusCode.UNAVAILABLE, ei.value
        mutual = grpc.ssl_channel_credentials(root_certificates=pki["ca.pem"], private_key=pki["client.key"],
                                              certificate_chain=pki["client.pem"])
        with grpc.secure_channel(f"localhost:{gport}", mutual) as ch:
            y = _predict(ch, x)
        assert y.shape == (1, 4)
        assert srv.alive()


def test_bad_ssl_config_is_a_startup_error(tmp_path, pki):
    cfg = _ssl_config(pki, str(tmp_path / "ssl.cfg"), with_cert=False)
    base = str(tmp_path / "m")
    u.write_version(base, 1, u.mm_model())
    p = subprocess.run([u.tensord_bin(), "serve", "--rest_api_port=0", f"--port={u.free_port()}",
                        "--grpc_api_host=127.0.0.1", f"--ssl_config_file={cfg}", "--model_name=m",
                        f"--model_base_path={base}"], capture_output=True, text=True, timeout=60)
    assert p.returncode != 0
    assert "server_cert" in p.stderr and "ssl.cfg" in p.stderr, p.stderr
