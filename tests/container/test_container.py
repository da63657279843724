"""The Docker image (Dockerfile, target cpu), built with podman and run as a TF Serving user runs TF Serving's image:

    docker run -p 8500:8500 -p 8501:8501 -v DIR/fashion:/models/fashion -e MODEL_NAME=fashion tensord

with the demo model (models/demo/make_demo.py), on free loopback ports. Checked from the host, with the clients
users bring: REST and gRPC predictions equal what this repository's own build gives (`tensord predict`,
$TENSORD_BIN) within 1e-5; the image's HEALTHCHECK passes; tensord runs as a non-root uid; the admin port opens
only with a token file mounted; `podman stop` (SIGTERM through tini) lets an in-flight request finish and the
container exits 0. The image and its base come from conftest.py (the `ctr` fixture), which says when and why
this machine cannot run them.
"""
import json
import os
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import requests

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOL = 1e-5
HTTP_TIMEOUT = 30
START_TIMEOUT = 60
ADMIN_TOKEN = "0123456789abcdef" * 4  # the admin port wants 32 characters or more


def free_port(taken=()):
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            p = s.getsockname()[1]
        if p not in taken:
            return p


def tensord_bin():
    path = os.environ.get("TENSORD_BIN", os.path.join(ROOT, "build", "tensord"))
    path = path if os.path.isabs(path) else os.path.join(ROOT, path)
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        pytest.fail(f"tensord binary not found or not executable: {path} (build it with `make`, or set TENSORD_BIN)")
    return path


class Container:
    """One `podman run -d` of the image: REST (8501) and gRPC (8500) published on free loopback ports, plus
    whatever `publish` names ({container port: host port}). stop() is `podman stop`; remove() cleans up."""

    _n = 0

    def __init__(self, ctr, volumes=(), env=(), args=(), publish=None):
        Container._n += 1
        self.ctr = ctr
        self.name = f"tensord-ci-{os.getpid()}-{Container._n}"
        self.rest_port = free_port()
        self.grpc_port = free_port({self.rest_port})
        self.ports = {8501: self.rest_port, 8500: self.grpc_port, **(publish or {})}
        cmd = ["run", "-d", "--name", self.name]
        for cport, hport in self.ports.items():
            cmd += ["-p", f"127.0.0.1:{hport}:{cport}"]
        for v in volumes:
            cmd += ["-v", v]
        for e in env:
            cmd += ["-e", e]
        ctr.podman(*cmd, ctr.image, *args)
        self.removed = False

    def url(self, path):
        return f"http://127.0.0.1:{self.rest_port}{path}"

    def inspect(self, fmt):
        return self.ctr.podman("inspect", "--format", fmt, self.name).stdout.strip()

    def logs(self):
        cp = self.ctr.podman("logs", self.name, check=False)
        return cp.stdout + cp.stderr

    def describe(self):
        state = self.ctr.podman("inspect", "--format", "{{.State.Status}} exit={{.State.ExitCode}}", self.name,
                                check=False).stdout.strip()
        return f"container {self.name} ({state})\n--- podman logs ---\n{self.logs()[-4000:]}"

    def wait_ready(self, timeout=START_TIMEOUT):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                if requests.get(self.url("/v2/health/ready"), timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            if self.inspect("{{.State.Running}}") != "true":
                break
            time.sleep(0.2)
        pytest.fail(f"GET /v2/health/ready on the published port {self.rest_port} never answered 200 within "
                    f"{timeout} s\n{self.describe()}")

    def exec(self, *args, check=True):
        return self.ctr.podman("exec", self.name, *args, check=check)

    def remove(self):
        if not self.removed:
            self.ctr.podman("rm", "-f", "-t", "0", self.name, check=False)
            self.removed = True


# ---------------------------------------------------------------------------------------------------------------
# fixtures: the demo bundle, this build's answers on it, the image serving it

@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """models/demo/make_demo.py's bundle: DIR/fashion/1/model.onnx and DIR/images.npy (16 test images)."""
    d = tmp_path_factory.mktemp("demo")
    cp = subprocess.run([sys.executable, os.path.join(ROOT, "models/demo/make_demo.py"), "--out", str(d)],
                        capture_output=True, text=True, timeout=300)
    assert cp.returncode == 0, f"make_demo.py failed\n{cp.stdout}\n{cp.stderr}"
    # the container's user (uid 10001) reads the bind mount: world-readable, as a deployer's model would be
    subprocess.run(["chmod", "-R", "a+rX", str(d)], check=True)
    return d


@pytest.fixture(scope="module")
def images(demo):
    return np.load(demo / "images.npy")


@pytest.fixture(scope="module")
def reference(demo, tmp_path_factory):
    """This repository's own build on the same images: `tensord predict` -> probabilities [16, 10]."""
    out = tmp_path_factory.mktemp("reference")
    cp = subprocess.run([tensord_bin(), "predict", "--model", str(demo / "fashion" / "1"), "--input",
                         f"images={demo / 'images.npy'}", "--output-dir", str(out)],
                        capture_output=True, text=True, timeout=120)
    assert cp.returncode == 0, f"tensord predict failed (exit {cp.returncode})\n{cp.stderr}"
    return np.load(out / "probabilities.npy")


@pytest.fixture(scope="module")
def server(ctr, demo):
    """The image serving the demo as a TF Serving user runs it: the model mounted under /models, MODEL_NAME set."""
    c = Container(ctr, volumes=[f"{demo / 'fashion'}:/models/fashion:ro"], env=["MODEL_NAME=fashion"])
    try:
        c.wait_ready()
        yield c
    finally:
        c.remove()


def assert_close(got, want, what):
    got = np.asarray(got, dtype=np.float32)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, this build gives {want.shape}"
    err = float(np.max(np.abs(got - want)))
    assert err <= TOL, f"{what}: max |image - this build| = {err:.3g} > {TOL}"


# ---------------------------------------------------------------------------------------------------------------
# the image itself

def test_image_has_every_library_the_binary_loads(ctr):
    cp = ctr.podman("run", "--rm", "--entrypoint", "ldd", ctr.image, "/usr/local/bin/tensord")
    missing = [l.strip() for l in cp.stdout.splitlines() if "not found" in l]
    assert not missing, f"libraries missing from the image (deploy/packages/runtime.txt): {missing}"


def test_subcommands_pass_through_the_entry_point(ctr):
    cp = ctr.podman("run", "--rm", ctr.image, "version")
    assert cp.stdout.startswith("tensord "), f"`docker run IMAGE version` printed {cp.stdout!r} {cp.stderr!r}"


def test_image_config(ctr):
    cfg = json.loads(ctr.podman("image", "inspect", "--format", "{{json .Config}}", ctr.image).stdout)
    assert cfg.get("User") == "10001:10001", f"image user {cfg.get('User')!r}"
    assert set(cfg.get("ExposedPorts") or {}) == {"8500/tcp", "8501/tcp"}, cfg.get("ExposedPorts")
    assert "MODEL_BASE_PATH=/models" in cfg.get("Env", []) and "MODEL_NAME=model" in cfg.get("Env", []), cfg.get("Env")
    assert (cfg.get("Entrypoint") or [None])[0] == "/usr/bin/tini", f"entrypoint {cfg.get('Entrypoint')}"
    hc = json.loads(ctr.podman("image", "inspect", "--format", "{{json .HealthCheck}}", ctr.image).stdout) or {}
    assert "http://127.0.0.1:8501/v2/health/ready" in " ".join(hc.get("Test") or []), \
        f"no HEALTHCHECK on /v2/health/ready in the image (built with --format docker?): {hc}"


def test_mpirun_starts_ranks_as_the_image_user(ctr):
    # openmpi-bin is in the image for `mpirun -np N tensord train ...`; a command that is not a tensord
    # subcommand runs as given (the entry point execs it), as the image's non-root user
    cp = ctr.podman("run", "--rm", ctr.image, "mpirun", "-np", "2", "--oversubscribe", "tensord", "version")
    lines = [l for l in cp.stdout.splitlines() if l.startswith("tensord ")]
    assert len(lines) == 2, f"mpirun -np 2 tensord version printed {cp.stdout!r} {cp.stderr[-1000:]!r}"


# ---------------------------------------------------------------------------------------------------------------
# serving, from the host

def test_rest_predict_matches_this_build(server, images, reference):
    r = requests.post(server.url("/v1/models/fashion:predict"), data=json.dumps({"instances": images.tolist()}),
                      timeout=HTTP_TIMEOUT)
    assert r.status_code == 200, f"HTTP {r.status_code} {r.text[:300]}\n{server.describe()}"
    assert_close(r.json()["predictions"], reference, "REST /v1/models/fashion:predict")


def test_grpc_predict_matches_this_build(server, images, reference):
    import grpc
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc
    ch = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}")
    try:
        grpc.channel_ready_future(ch).result(timeout=HTTP_TIMEOUT)
        rq = predict_pb2.PredictRequest()
        rq.model_spec.name = "fashion"
        rq.inputs["images"].CopyFrom(tf.make_tensor_proto(images))
        resp = prediction_service_pb2_grpc.PredictionServiceStub(ch).Predict(rq, timeout=HTTP_TIMEOUT)
    finally:
        ch.close()
    assert_close(tf.make_ndarray(resp.outputs["probabilities"]), reference, "gRPC PredictionService/Predict")


def test_healthcheck_passes(server):
    cp = server.ctr.podman("healthcheck", "run", server.name, check=False)
    assert cp.returncode == 0, f"`podman healthcheck run` exited {cp.returncode}: {cp.stdout} {cp.stderr}\n" \
                               f"{server.describe()}"


def test_tensord_runs_as_non_root(server):
    # every process in the container: its executable, and its real and effective uid (/proc/PID/status)
    out = server.exec("sh", "-c", 'for p in /proc/[0-9]*; do printf "%s %s %s\\n" "$(readlink $p/exe)" '
                                  '"$(sed -n "s/^Name:\\t//p" $p/status)" "$(sed -n "s/^Uid:\\t//p" $p/status)"; '
                                  'done').stdout
    procs = [l.split() for l in out.splitlines() if l.strip()]
    tensord = [p for p in procs if p[0] == "/usr/local/bin/tensord"]
    assert tensord, f"no tensord process in the container: {procs}"
    for p in tensord:
        assert p[1] == "tensord", f"the server's process is named {p[1]!r} in ps/top, not tensord: {procs}"
        assert p[2] != "0" and p[3] != "0", f"tensord runs as uid {p[2]} (effective {p[3]}): {procs}"
    assert server.exec("id", "-u").stdout.strip() == "10001"


def test_admin_port_closed_without_a_token_file(server):
    cp = server.exec("curl", "-sS", "-o", "/dev/null", "http://127.0.0.1:8502/v1/admin/models", check=False)
    assert cp.returncode == 7, f"admin port 8502 answered (curl exit {cp.returncode}) with no token file mounted"
    assert "admin API on" not in server.logs()


def test_admin_port_opens_with_a_token_file(ctr, demo, tmp_path):
    token = tmp_path / "tensord_admin_token"
    token.write_text(ADMIN_TOKEN + "\n")
    token.chmod(0o644)
    admin_port = free_port()
    c = Container(ctr, volumes=[f"{demo / 'fashion'}:/models/fashion:ro",
                                f"{token}:/run/secrets/tensord_admin_token:ro"],
                  env=["MODEL_NAME=fashion"], publish={8502: admin_port})
    try:
        c.wait_ready()
        assert "admin API on 0.0.0.0:8502" in c.logs(), c.describe()
        url = f"http://127.0.0.1:{admin_port}/v1/admin/models"
        r = requests.get(url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=HTTP_TIMEOUT)
        assert r.status_code == 200, f"admin GET with the token: HTTP {r.status_code} {r.text[:300]}\n{c.describe()}"
        assert "fashion" in r.text
        r = requests.get(url, timeout=HTTP_TIMEOUT)
        assert r.status_code == 401, f"admin GET without a token: HTTP {r.status_code}"
    finally:
        c.remove()


def test_admin_token_in_the_environment_is_refused(ctr):
    cp = ctr.podman("run", "--rm", "-e", f"TENSORD_ADMIN_TOKEN={ADMIN_TOKEN}", ctr.image, check=False)
    assert cp.returncode == 2 and "mount the token as a file" in cp.stderr, \
        f"exit {cp.returncode}: {cp.stdout[-500:]} {cp.stderr[-1000:]}"


# ---------------------------------------------------------------------------------------------------------------
# docker stop: SIGTERM reaches tensord through tini, which drains

BATCH_WAIT_S = 4


def test_stop_drains_an_inflight_request(ctr, demo, images, reference, tmp_path):
    """A request is held in flight by the batcher: with batch_timeout_micros at 4 s and a batch that never fills,
    it waits 4 s for company (TF Serving's batching flags, passed through the entry point as a user would)."""
    cfg = tmp_path / "batching.txt"
    cfg.write_text(f"max_batch_size {{ value: 64 }}\nbatch_timeout_micros {{ value: {BATCH_WAIT_S * 1000000} }}\n"
                   "max_enqueued_batches { value: 8 }\nnum_batch_threads { value: 1 }\n")
    cfg.chmod(0o644)
    c = Container(ctr, volumes=[f"{demo / 'fashion'}:/models/fashion:ro", f"{cfg}:/config/batching.txt:ro"],
                  env=["MODEL_NAME=fashion"],
                  args=["--enable_batching", "--batching_parameters_file=/config/batching.txt"])
    try:
        c.wait_ready()
        result = {}

        def call():
            try:
                result["r"] = requests.post(c.url("/v1/models/fashion:predict"),
                                            data=json.dumps({"instances": images.tolist()}), timeout=60)
            except requests.RequestException as e:
                result["error"] = e
            result["t"] = time.monotonic()

        t = threading.Thread(target=call)
        t.start()
        time.sleep(1)  # the request is queued, waiting out the batch timeout
        t_stop = time.monotonic()
        c.ctr.podman("stop", "-t", "30", c.name, timeout=60)  # SIGTERM; SIGKILL only after 30 s
        t.join(timeout=60)
        assert "error" not in result, f"the in-flight request failed: {result['error']}\n{c.describe()}"
        assert "r" in result, f"the in-flight request did not return\n{c.describe()}"
        r = result["r"]
        assert r.status_code == 200, f"in-flight request during the drain: HTTP {r.status_code} {r.text[:300]}\n" \
                                     f"{c.describe()}"
        assert_close(r.json()["predictions"], reference, "the drained request")
        assert result["t"] > t_stop, "the request finished before `podman stop`: the test proved nothing"
        code = c.inspect("{{.State.ExitCode}}")
        logs = c.logs()
        assert code == "0", f"container exit code {code} after podman stop (SIGTERM)\n{c.describe()}"
        assert "draining in-flight requests" in logs, f"no drain in the log: did SIGTERM reach tensord?\n{logs[-3000:]}"
    finally:
        c.remove()
