"""deploy/k8s: the Kubernetes manifests are valid objects, agree with each other, and agree with the real binary.

Schema: every YAML document under deploy/k8s, and the kustomize overlays rendered (gpu/, admin/), validate against
the Kubernetes OpenAPI schemas that PyPI's kubernetes-validate bundles (offline), strictly (an unknown or misspelt
field fails), at the oldest Kubernetes version the manifests promise (1.30) and at the newest the package bundles.
The overlays are rendered here by a small kustomize subset (resources, JSON 6902 `patches` with a target, `images`);
a kustomization using anything else fails the test. Where `kubectl` is installed, its built-in kustomize renders
the same objects (checked).

Semantics, what no schema sees: probes on the health routes and the named REST port; the grace period covers the
preStop sleep plus --drain_seconds; the startup probe outlasts --model_load_timeout_seconds; Service, PDB and
Deployment selectors match the pod labels (and the serving Service selects no training pod); mounts name existing
volumes; the serving Deployment and the training Job mount the same, defined claim, and the Job trains the very
directory the server serves; the Job is Indexed with completions == parallelism == TENSORD_WORLD_SIZE, TENSORD_RANK
from the completion index, TENSORD_COORDINATOR = rank 0's DNS name under the headless Service its pods name as
subdomain; thread flags fit the CPU limit; the GPU variant requests nvidia.com/gpu; the admin variant is one
replica with its token from a Secret; every pod runs as non-root under Pod Security's "restricted" rules.

Binary: through the image's entrypoint (deploy/docker/entrypoint.sh, pointed at $TENSORD_BIN), the serving
Deployment's env and args (each variant's) start the real `tensord serve`, whose probe routes and metrics path answer
200, which answers a predict (and the admin variant's admin API, with the Secret's token), and which drains with the
manifest's --drain_seconds; the Job's args run the real `tensord train` on a tiny IDX dataset and write the next
version. Volume paths are mapped into a tmp dir; only the ports are moved.
"""
import copy
import gzip
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import time

import numpy as np
import pytest
import requests
import yaml

import kubernetes_validate

from conftest import SANITIZER_MARKS
from serving_util import free_port, mm_model, write_version

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
K8S = os.path.join(ROOT, "deploy", "k8s")
# The oldest Kubernetes the manifests promise, and the newest schema the installed kubernetes-validate bundles.
SCHEMA_VERSIONS = sorted({"1.30.0", kubernetes_validate.latest_version()})
KUSTOMIZATION = "kustomization.yaml"
METRICS_PATH = "/monitoring/prometheus/metrics"  # server/serve.c's default (--monitoring_config_file changes it)
LIVE, READY = "/v2/health/live", "/v2/health/ready"
SERVING_VARIANTS = ("base", "gpu", "admin")
ENTRYPOINT = os.path.join(ROOT, "deploy", "docker", "entrypoint.sh")
ENTRYPOINT_TOKEN_FILE = "/run/secrets/tensord_admin_token"  # the entrypoint opens the admin port on 0.0.0.0 if present
TRAIN_JOB = "train-job.yaml"
MODELS_SHELL = "models-shell.yaml"
STANDALONE = (TRAIN_JOB, MODELS_SHELL)  # applied with kubectl apply -f, outside the kustomizations
COMPLETION_INDEX_ANNOTATION = "metadata.annotations['batch.kubernetes.io/job-completion-index']"


# ----------------------------------------------------------------------------------------------------------------
# loading and rendering

class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML keeps the last of two equal keys; the API server's strict decoding refuses them. So do we."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


def load_docs(path):
    with open(path) as f:
        docs = [d for d in yaml.load_all(f, Loader=_UniqueKeyLoader) if d is not None]
    for d in docs:
        assert isinstance(d, dict) and "kind" in d and "apiVersion" in d, f"{path}: a document without kind/apiVersion"
    return docs


def yaml_files():
    out = []
    for dirpath, _, names in os.walk(K8S):
        out += [os.path.join(dirpath, n) for n in names if n.endswith((".yaml", ".yml"))]
    return sorted(out)


def _pointer(path):
    assert path.startswith("/"), f"JSON pointer '{path}' must start with /"
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _walk(doc, parts, path):
    for p in parts:
        if isinstance(doc, list):
            assert p.isdigit() and int(p) < len(doc), f"{path}: no index {p}"
            doc = doc[int(p)]
        else:
            assert isinstance(doc, dict) and p in doc, f"{path}: no member '{p}'"
            doc = doc[p]
    return doc


def json_patch(doc, ops, where):
    """RFC 6902 add / remove / replace / test, as kustomize applies them (it fails on a failed test)."""
    for op in ops:
        kind, path = op["op"], op["path"]
        parts = _pointer(path)
        parent = _walk(doc, parts[:-1], f"{where} {path}")
        last = parts[-1]
        if kind == "test":
            assert _walk(doc, parts, f"{where} {path}") == op["value"], f"{where}: test of {path} failed"
        elif kind == "add":
            if isinstance(parent, list):
                assert last == "-" or (last.isdigit() and int(last) <= len(parent)), f"{where}: bad index in {path}"
                parent.insert(len(parent) if last == "-" else int(last), copy.deepcopy(op["value"]))
            else:
                parent[last] = copy.deepcopy(op["value"])
        elif kind in ("replace", "remove"):
            _walk(doc, parts, f"{where} {path}")  # must exist
            if kind == "remove":
                del parent[int(last) if isinstance(parent, list) else last]
            else:
                parent[int(last) if isinstance(parent, list) else last] = copy.deepcopy(op["value"])
        else:
            pytest.fail(f"{where}: JSON patch op '{kind}' is not in the subset this test renders")


def _pod_specs(obj):
    spec = obj.get("spec", {})
    if obj["kind"] == "Pod":
        return [spec]
    if obj["kind"] == "CronJob":
        return [spec["jobTemplate"]["spec"]["template"]["spec"]]
    return [spec["template"]["spec"]] if "template" in spec else []


def containers(obj):
    return [c for ps in _pod_specs(obj) for c in ps.get("initContainers", []) + ps.get("containers", [])]


def _split_image(image):
    name, digest = (image.split("@", 1) + [None])[:2]
    tag = None
    if ":" in name.rsplit("/", 1)[-1]:
        name, tag = name.rsplit(":", 1)
    return name, tag, digest


def set_images(objs, rules, where):
    for rule in rules:
        unknown = set(rule) - {"name", "newName", "newTag", "digest"}
        assert not unknown, f"{where}: images fields {unknown} are not in the subset this test renders"
        for c in (c for o in objs for c in containers(o)):
            name, tag, digest = _split_image(c["image"])
            if name != rule["name"]:
                continue
            name = rule.get("newName", name)
            if "digest" in rule:
                c["image"] = f"{name}@{rule['digest']}"
            elif "newTag" in rule:
                c["image"] = f"{name}:{rule['newTag']}"
            else:
                c["image"] = name + (f":{tag}" if tag else "") + (f"@{digest}" if digest else "")


def render(directory):
    """The objects `kustomize build directory` makes, for the subset of kustomize these manifests use."""
    kpath = os.path.join(directory, KUSTOMIZATION)
    (k,) = load_docs(kpath)
    assert k["apiVersion"] == "kustomize.config.k8s.io/v1beta1" and k["kind"] == "Kustomization", kpath
    unknown = set(k) - {"apiVersion", "kind", "resources", "patches", "images"}
    assert not unknown, f"{kpath}: {sorted(unknown)} are not in the kustomize subset this test renders; extend render()"
    objs = []
    for r in k.get("resources", []):
        p = os.path.normpath(os.path.join(directory, r))
        objs += render(p) if os.path.isdir(p) else load_docs(p)
    for i, pt in enumerate(k.get("patches", [])):
        where = f"{kpath} patches[{i}]"
        assert "target" in pt and set(pt) <= {"target", "patch", "path"} and set(pt["target"]) <= {"kind", "name"}, \
            f"{where}: only a target (kind, name) with an inline patch or a path is rendered here"
        if "patch" in pt:
            text = pt["patch"]
        else:
            with open(os.path.join(directory, pt["path"])) as f:
                text = f.read()
        ops = yaml.load(text, Loader=_UniqueKeyLoader)
        assert isinstance(ops, list), f"{where}: only JSON 6902 patches (a list of ops) are rendered here"
        hits = [o for o in objs if all((o["kind"] if f == "kind" else o["metadata"]["name"]) == v
                                       for f, v in pt["target"].items())]
        assert hits, f"{where}: the target {pt['target']} matches no object"
        for o in hits:
            json_patch(o, ops, where)
    set_images(objs, k.get("images", []), kpath)
    names = [(o["kind"], o["metadata"]["name"]) for o in objs]
    assert len(names) == len(set(names)), f"{kpath}: an object is defined twice: {names}"
    return objs


def variant(name):
    """A serving variant rendered, by directory name, or the objects of a standalone file."""
    if name in STANDALONE:
        return load_docs(os.path.join(K8S, name))
    return render(os.path.join(K8S, name))


def one(objs, kind, name=None):
    hits = [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(hits) == 1, f"expected one {kind}{' ' + name if name else ''}, found {len(hits)}"
    return hits[0]


def subcommand(c):
    args = c.get("args", [])
    return args[0] if args and not args[0].startswith("-") else None


def args_map(c):
    """--flag=value args (and bare --switch as True) of a container, after its subcommand; a flag twice is an error
    here."""
    out = {}
    for a in c.get("args", [])[1 if subcommand(c) else 0:]:
        assert a.startswith("--"), f"container {c['name']}: arg '{a}' is not --flag=value"
        k, sep, v = a.partition("=")
        assert k not in out, f"container {c['name']}: {k} given twice"
        out[k] = v if sep else True
    return out


def env_map(c):
    names = [e["name"] for e in c.get("env", [])]
    assert len(names) == len(set(names)), f"container {c['name']}: duplicate env {names}"
    return {e["name"]: e for e in c.get("env", [])}


def cpu_cores(q):
    q = str(q)
    return int(q[:-1]) / 1000 if q.endswith("m") else float(q)


def labels_match(selector, labels):
    assert selector, "an empty selector selects everything"
    return all(labels.get(k) == v for k, v in selector.items())


def serving_container(objs):
    d = one(objs, "Deployment")
    (c,) = d["spec"]["template"]["spec"]["containers"]
    return d, c


def named_port(c, name):
    hits = [p for p in c.get("ports", []) if p.get("name") == name]
    assert len(hits) == 1, f"container {c['name']} has no single port named '{name}'"
    return hits[0]["containerPort"]


def mount_for(pod_spec, c, volume_pred):
    vols = {v["name"]: v for v in pod_spec.get("volumes", [])}
    return [(m, vols[m["name"]]) for m in c.get("volumeMounts", []) if volume_pred(vols[m["name"]])]


# ----------------------------------------------------------------------------------------------------------------
# schema

def test_validator_is_strict():
    """The checks below mean something only if a misspelt field, a wrong type and a duplicate key fail."""
    d, _ = serving_container(variant("base"))
    for v in SCHEMA_VERSIONS:
        kubernetes_validate.validate(d, v, strict=True)
    bad = copy.deepcopy(d)
    bad["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, SCHEMA_VERSIONS[0], strict=True)
    bad = copy.deepcopy(d)
    bad["spec"]["replicas"] = "2"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, SCHEMA_VERSIONS[0], strict=True)
    with pytest.raises(yaml.constructor.ConstructorError):
        yaml.load("a: 1\na: 2\n", Loader=_UniqueKeyLoader)


def _validate_all(objs, where):
    errors = []
    for o in objs:
        for v in SCHEMA_VERSIONS:
            try:
                kubernetes_validate.validate(o, v, strict=True)
            except kubernetes_validate.ValidationError as e:
                errors.append(f"{where}: {o['kind']}/{o['metadata']['name']} at {v}: "
                              f"{'.'.join(map(str, e.path))}: {e.message}")
            except kubernetes_validate.SchemaNotFoundError as e:
                errors.append(f"{where}: {e.message}")
    assert not errors, "\n".join(errors)


def test_every_yaml_document_validates_strictly():
    files = yaml_files()
    rel = {os.path.relpath(f, K8S) for f in files}
    want = {*STANDALONE, "base/serving.yaml", "base/models-pvc.yaml"}
    want |= {f"{v}/{KUSTOMIZATION}" for v in SERVING_VARIANTS}
    assert want <= rel, f"missing under deploy/k8s: {sorted(want - rel)}"
    for f in files:
        docs = load_docs(f)
        if os.path.basename(f) == KUSTOMIZATION:
            render(os.path.dirname(f))  # a kustomization is checked by rendering it
            continue
        assert all(d["kind"] != "Kustomization" for d in docs), f"{f}: a Kustomization must be named {KUSTOMIZATION}"
        _validate_all(docs, os.path.relpath(f, ROOT))


@pytest.mark.parametrize("name", [v for v in SERVING_VARIANTS if v != "base"])
def test_rendered_overlay_validates_strictly(name):
    _validate_all(variant(name), f"deploy/k8s/{name} (rendered)")


@pytest.mark.parametrize("name", SERVING_VARIANTS)
def test_render_matches_kubectl_kustomize(name):
    kubectl = shutil.which("kubectl")
    if not kubectl:
        pytest.skip("kubectl is not installed: the rendering is checked against it where it is")
    cp = subprocess.run([kubectl, "kustomize", os.path.join(K8S, name)], capture_output=True, text=True, timeout=120)
    assert cp.returncode == 0, cp.stderr
    theirs = {(o["kind"], o["metadata"]["name"]): o for o in yaml.safe_load_all(cp.stdout) if o}
    ours = {(o["kind"], o["metadata"]["name"]): o for o in variant(name)}
    assert theirs.keys() == ours.keys()
    for k in ours:
        assert ours[k] == theirs[k], f"{name}: {k} renders differently here than with kubectl kustomize"


# ----------------------------------------------------------------------------------------------------------------
# serving semantics

@pytest.mark.parametrize("name", SERVING_VARIANTS)
def test_probes_use_health_routes_on_the_named_rest_port(name):
    _, c = serving_container(variant(name))
    http = named_port(c, "http")
    assert http == int(args_map(c).get("--rest_api_port", 8501)), "the http port is not the REST port tensord opens"
    assert named_port(c, "grpc") == int(args_map(c).get("--port", 8500))
    want = {"startupProbe": LIVE, "livenessProbe": LIVE, "readinessProbe": READY}
    for probe, path in want.items():
        assert probe in c, f"{name}: no {probe}"
        get = c[probe].get("httpGet")
        assert get and get["path"] == path and get["port"] == "http", \
            f"{name}: {probe} is {c[probe]}, want GET {path} on http"


def _prestop_seconds(c):
    exec_ = c.get("lifecycle", {}).get("preStop", {}).get("exec")
    if not exec_:
        return 0
    cmd = exec_["command"]
    assert len(cmd) == 2 and cmd[0] == "sleep", f"preStop {cmd}: expected [sleep, N]"
    return float(cmd[1])


@pytest.mark.parametrize("name", SERVING_VARIANTS)
def test_grace_period_covers_prestop_and_drain(name):
    d, c = serving_container(variant(name))
    a = args_map(c)
    assert "--drain_seconds" in a, "pass --drain_seconds explicitly: the grace period is sized from it"
    drain = float(a["--drain_seconds"])
    grace = d["spec"]["template"]["spec"].get("terminationGracePeriodSeconds", 30)
    # tensord exits within a second of the drain deadline (README: status 3 when requests were cut off)
    assert grace > _prestop_seconds(c) + drain + 1, \
        f"{name}: terminationGracePeriodSeconds {grace} <= preStop {_prestop_seconds(c)} s + " \
        f"--drain_seconds {drain} + 1"


@pytest.mark.parametrize("name", SERVING_VARIANTS)
def test_startup_probe_outlasts_model_loading(name):
    _, c = serving_container(variant(name))
    load = float(args_map(c).get("--model_load_timeout_seconds", 600))
    p = c["startupProbe"]
    budget = p.get("initialDelaySeconds", 0) + p.get("periodSeconds", 10) * p.get("failureThreshold", 3)
    assert budget > load, f"{name}: the startup probe gives up after {budget} s, loads may take {load} s"


@pytest.mark.parametrize("name", SERVING_VARIANTS)
def test_service_and_pdb_select_the_serving_pods_only(name):
    objs = variant(name)
    d, c = serving_container(objs)
    pod_labels = d["spec"]["template"]["metadata"]["labels"]
    assert labels_match(d["spec"]["selector"]["matchLabels"], pod_labels)
    svc = one(objs, "Service", d["metadata"]["name"])
    assert svc["spec"].get("type", "ClusterIP") == "ClusterIP"
    assert labels_match(svc["spec"]["selector"], pod_labels), "the Service selects no serving pod"
    ports = {p["name"]: p for p in svc["spec"]["ports"]}
    assert set(ports) == {"grpc", "http"} and ports["grpc"]["port"] == 8500 and ports["http"]["port"] == 8501
    for p in ports.values():
        target = p["targetPort"]
        assert (named_port(c, target) if isinstance(target, str) else target) == p["port"], f"{name}: Service port {p}"
    pdb = one(objs, "PodDisruptionBudget")
    assert labels_match(pdb["spec"]["selector"]["matchLabels"], pod_labels), "the PDB covers no serving pod"
    if "minAvailable" in pdb["spec"]:
        assert int(pdb["spec"]["minAvailable"]) < d["spec"].get("replicas", 1), "the PDB would block every drain"
    job = one(variant(TRAIN_JOB), "Job")
    train_labels = job["spec"]["template"]["metadata"]["labels"]
    assert not labels_match(svc["spec"]["selector"], train_labels), "the serving Service would route to training pods"
    assert not labels_match(pdb["spec"]["selector"]["matchLabels"], train_labels)
    assert not labels_match(d["spec"]["selector"]["matchLabels"], train_labels)


@pytest.mark.parametrize("name", SERVING_VARIANTS)
def test_prometheus_scrape_annotations(name):
    d, c = serving_container(variant(name))
    ann = d["spec"]["template"]["metadata"].get("annotations", {})
    assert ann.get("prometheus.io/scrape") == "true"
    assert ann.get("prometheus.io/port") == str(named_port(c, "http"))
    assert ann.get("prometheus.io/path") == METRICS_PATH
    assert "--monitoring_config_file" not in args_map(c), "a monitoring config may move the metrics path"


@pytest.mark.parametrize("name", SERVING_VARIANTS)
def test_thread_flags_fit_the_cpu_limit(name):
    """tensord sizes thread pools from the node's cores, not the cgroup's quota: the flags must say it."""
    _, c = serving_container(variant(name))
    a = args_map(c)
    for flag in ("--tensorflow_intra_op_parallelism", "--instances_per_version", "--rest_api_num_threads",
                 "--grpc_max_threads"):
        assert flag in a, f"{name}: {flag} is not set (its default follows the node's core count)"
    limit = cpu_cores(c["resources"]["limits"]["cpu"])
    used = int(a["--tensorflow_intra_op_parallelism"]) * int(a["--instances_per_version"])
    assert 1 <= used <= limit, f"{name}: intra-op threads x instances = {used}, CPU limit {limit}"


@pytest.mark.parametrize("name", SERVING_VARIANTS)
def test_models_volume_and_model_env(name):
    d, c = serving_container(variant(name))
    spec = d["spec"]["template"]["spec"]
    ((m, _),) = mount_for(spec, c, lambda v: v.get("persistentVolumeClaim", {}).get("claimName") == "tensord-models")
    env = env_map(c)
    assert env["MODEL_BASE_PATH"]["value"] == m["mountPath"], "MODEL_BASE_PATH is not where the models claim is mounted"
    assert re.fullmatch(r"[A-Za-z0-9_.-]+", env["MODEL_NAME"]["value"])
    a = args_map(c)
    assert not {"--model_base_path", "--model_name", "--model_config_file"} & set(a), \
        "the image's entrypoint passes --model_base_path from MODEL_BASE_PATH/MODEL_NAME"
    if name != "admin":
        assert m.get("readOnly") is True, "serving only reads the models"


def test_every_mount_names_a_volume_and_every_claim_exists():
    base_claims = {o["metadata"]["name"]: o for o in variant("base") if o["kind"] == "PersistentVolumeClaim"}
    for name in SERVING_VARIANTS + STANDALONE:
        objs = variant(name)
        claims = dict(base_claims, **{o["metadata"]["name"]: o for o in objs if o["kind"] == "PersistentVolumeClaim"})
        for o in objs:
            for ps in _pod_specs(o):
                vols = [v["name"] for v in ps.get("volumes", [])]
                assert len(vols) == len(set(vols)), f"{name}: duplicate volumes {vols}"
                for c in ps["containers"]:
                    paths = [m["mountPath"] for m in c.get("volumeMounts", [])]
                    assert len(paths) == len(set(paths)), f"{name}: {c['name']} mounts a path twice"
                    for m in c.get("volumeMounts", []):
                        assert m["name"] in vols, f"{name}: {c['name']} mounts undefined volume {m['name']}"
                for v in ps.get("volumes", []):
                    if "persistentVolumeClaim" in v:
                        assert v["persistentVolumeClaim"]["claimName"] in claims, \
                            f"{name}: the claim of volume {v['name']} is defined nowhere"


def test_serving_and_training_share_the_models_claim_and_directory():
    base = variant("base")
    d, c = serving_container(base)
    job = one(variant(TRAIN_JOB), "Job")
    (tc,) = job["spec"]["template"]["spec"]["containers"]

    def claim_mounts(spec, cont):
        return {v["persistentVolumeClaim"]["claimName"]: m["mountPath"]
                for m, v in mount_for(spec, cont, lambda v: "persistentVolumeClaim" in v)}

    serve_claims = claim_mounts(d["spec"]["template"]["spec"], c)
    train_claims = claim_mounts(job["spec"]["template"]["spec"], tc)
    assert len(serve_claims) == 1 and serve_claims.keys() == train_claims.keys(), (serve_claims, train_claims)
    (claim,) = serve_claims
    pvc = one(base, "PersistentVolumeClaim", claim)
    assert "ReadWriteMany" in pvc["spec"]["accessModes"], "serving pods on several nodes and the Job share it"
    env = env_map(c)
    served = os.path.join(env["MODEL_BASE_PATH"]["value"], env["MODEL_NAME"]["value"])
    trained = os.path.normpath(args_map(tc)["--model-base-path"])
    # where the Job writes, seen from the serving pod's mount
    assert trained.startswith(train_claims[claim] + "/")
    seen_by_server = serve_claims[claim] + trained[len(train_claims[claim]):]
    assert seen_by_server == served, f"the Job trains {trained}; the server serves {served}"


# ----------------------------------------------------------------------------------------------------------------
# training Job

def test_training_job_is_indexed_with_rank_env_and_headless_service():
    objs = variant(TRAIN_JOB)
    job = one(objs, "Job")
    svc = [o for o in objs if o["kind"] == "Service"]
    assert len(svc) == 1
    svc = svc[0]
    spec = job["spec"]
    assert spec.get("completionMode") == "Indexed"
    assert spec["completions"] == spec["parallelism"] >= 1, "every rank must run at once"
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] in ("Never", "OnFailure")
    assert svc["spec"].get("clusterIP") == "None", "the ranks' Service must be headless"
    assert pod.get("subdomain") == svc["metadata"]["name"], "pods get <job>-<i>.<service> names only with subdomain"
    assert labels_match(svc["spec"]["selector"], spec["template"]["metadata"]["labels"])
    assert svc["spec"].get("publishNotReadyAddresses") is True, "ranks must resolve before they are Ready"
    (c,) = pod["containers"]
    env = env_map(c)
    assert {"TENSORD_RANK", "TENSORD_WORLD_SIZE", "TENSORD_COORDINATOR"} <= env.keys()
    rank = env["TENSORD_RANK"]
    assert rank.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == COMPLETION_INDEX_ANNOTATION, \
        f"TENSORD_RANK must come from the completion index: {rank}"
    assert env["TENSORD_WORLD_SIZE"].get("value") == str(spec["completions"]), "TENSORD_WORLD_SIZE != completions"
    coord = env["TENSORD_COORDINATOR"]["value"]
    host, _, port = coord.rpartition(":")
    assert host == f"{job['metadata']['name']}-0.{svc['metadata']['name']}", f"{coord} is not rank 0's DNS name"
    (sp,) = [p for p in svc["spec"]["ports"] if p["port"] == int(port)]
    target = sp.get("targetPort", sp["port"])
    assert (named_port(c, target) if isinstance(target, str) else target) == int(port), \
        f"{coord}: the Service's port does not reach the container's"
    assert "command" not in c and subcommand(c) == "train", "the Job runs `train` through the image's entrypoint"
    a = args_map(c)
    assert "--model-base-path" in a and "--data" in a
    assert "--threads" in a, "without --threads tensord train starts a thread per core of the node"
    threads = int(a["--threads"]) * int(a.get("--replicas", 1))
    assert 1 <= threads <= cpu_cores(c["resources"]["limits"]["cpu"]), f"{threads} threads over the CPU limit"


KNOWN_RESOURCES = {"cpu", "memory", "ephemeral-storage", "nvidia.com/gpu"}


@pytest.mark.parametrize("name", SERVING_VARIANTS + STANDALONE)
def test_resources_are_set_and_known(name):
    """Requests and limits on every container, no misspelt resource name (the API server takes any domain-prefixed
    name: a pod asking for 'nvidia.com/gpus' just never schedules), and GPUs only in the GPU variant."""
    for o in variant(name):
        for c in containers(o):
            res = c.get("resources", {})
            req, lim = res.get("requests", {}), res.get("limits", {})
            assert {"cpu", "memory"} <= req.keys() and {"cpu", "memory"} <= lim.keys(), f"{name}: {c['name']}: {res}"
            assert set(req) | set(lim) <= KNOWN_RESOURCES, f"{name}: {c['name']}: unknown resource in {res}"
            assert ("nvidia.com/gpu" in {**req, **lim}) == (name == "gpu"), f"{name}: {c['name']}: {res}"


# ----------------------------------------------------------------------------------------------------------------
# GPU and admin variants

def test_gpu_variant_requests_a_gpu_and_the_gpu_image():
    _, base_c = serving_container(variant("base"))
    d, c = serving_container(variant("gpu"))
    res = c["resources"]
    assert "nvidia.com/gpu" in res.get("requests", {}) and "nvidia.com/gpu" in res.get("limits", {}), res
    assert int(res["limits"]["nvidia.com/gpu"]) >= 1
    assert res["requests"]["nvidia.com/gpu"] == res["limits"]["nvidia.com/gpu"], \
        "extended resources need requests == limits"
    assert c["image"] != base_c["image"] and "gpu" in c["image"], f"GPU pods run {c['image']}"
    tol = d["spec"]["template"]["spec"].get("tolerations", [])
    assert any(t.get("key") == "nvidia.com/gpu" for t in tol)


def test_admin_stays_closed_in_base_and_gpu():
    for name in ("base", "gpu"):
        d, c = serving_container(variant(name))
        a = args_map(c)
        assert not {"--admin_token_file", "--admin_port", "--admin_bind"} & set(a), f"{name}: admin flags {a}"
        assert not {"TENSORD_ADMIN_TOKEN", "TENSORD_ADMIN_TOKEN_FILE"} & env_map(c).keys(), \
            f"{name}: a token opens the admin port; it must stay closed by default"
        for m in c.get("volumeMounts", []):
            assert not ENTRYPOINT_TOKEN_FILE.startswith(m["mountPath"].rstrip("/") + "/"), \
                f"{name}: {m['mountPath']} may hold {ENTRYPOINT_TOKEN_FILE}, which opens the admin port"


def test_admin_variant_token_from_a_secret_loopback_one_replica():
    objs = variant("admin")
    d, c = serving_container(objs)
    spec = d["spec"]["template"]["spec"]
    a = args_map(c)
    token = a["--admin_token_file"]
    secrets = mount_for(spec, c, lambda v: "secret" in v)
    assert any(token == f"{m['mountPath']}/token" and m.get("readOnly") for m, _ in secrets), \
        f"--admin_token_file {token} is not the 'token' key of a read-only Secret mount"
    # the entrypoint passes --admin_port=0 unless its own token file exists: the args (last) must open it
    assert int(a.get("--admin_port", 0)) > 0, "--admin_port must be given: the entrypoint's --admin_port=0 comes first"
    assert a.get("--admin_bind") == "127.0.0.1", "the admin port stays on the pod's loopback (port-forward reaches it)"
    assert not {"TENSORD_ADMIN_TOKEN", "TENSORD_ADMIN_TOKEN_FILE"} & env_map(c).keys()
    for svc in (o for o in objs if o["kind"] == "Service"):
        assert all(p["port"] != 8502 for p in svc["spec"]["ports"])
    state = a["--state_dir"]
    ((m, v),) = mount_for(spec, c, lambda v: v.get("persistentVolumeClaim", {}).get("claimName") not in
                          (None, "tensord-models"))
    assert state == m["mountPath"]
    pvc = one(objs, "PersistentVolumeClaim", v["persistentVolumeClaim"]["claimName"])
    assert pvc["spec"]["accessModes"] == ["ReadWriteOnce"], "SQLite state on its own block volume"
    assert d["spec"]["replicas"] == 1 and d["spec"]["strategy"]["type"] == "Recreate", \
        "one tensord per --state_dir: one replica, never two during a rollout"


# ----------------------------------------------------------------------------------------------------------------
# security

def _eff(pod_sc, c_sc, key):
    return c_sc.get(key, pod_sc.get(key))


@pytest.mark.parametrize("name", SERVING_VARIANTS + STANDALONE)
def test_every_container_runs_as_non_root_restricted(name):
    pods = [(o, ps) for o in variant(name) for ps in _pod_specs(o)]
    assert pods
    for o, ps in pods:
        where = f"{name}: {o['kind']}/{o['metadata']['name']}"
        assert ps.get("automountServiceAccountToken") is False, f"{where}: tensord needs no API token"
        assert not (ps.get("hostNetwork") or ps.get("hostPID") or ps.get("hostIPC")), where
        psc = ps.get("securityContext", {})
        for c in ps.get("initContainers", []) + ps["containers"]:
            csc = c.get("securityContext", {})
            assert _eff(psc, csc, "runAsNonRoot") is True, f"{where}/{c['name']}: runAsNonRoot"
            uid = _eff(psc, csc, "runAsUser")
            assert uid is not None and uid != 0, f"{where}/{c['name']}: runAsUser {uid}"
            assert csc.get("allowPrivilegeEscalation") is False, f"{where}/{c['name']}: allowPrivilegeEscalation"
            assert csc.get("capabilities", {}).get("drop") == ["ALL"] and not csc["capabilities"].get("add"), \
                f"{where}/{c['name']}: capabilities"
            assert csc.get("privileged") is not True
            assert (_eff(psc, csc, "seccompProfile") or {}).get("type") in ("RuntimeDefault", "Localhost"), \
                f"{where}/{c['name']}: seccompProfile"
            assert csc.get("readOnlyRootFilesystem") is True, f"{where}/{c['name']}: readOnlyRootFilesystem"
            assert c.get("image") and c.get("imagePullPolicy") == "IfNotPresent", \
                f"{where}/{c['name']}: imagePullPolicy (a :latest image pulled Always defeats `kind load`)"


def test_every_pod_shares_one_uid_and_fs_group():
    """What the Job and the shell pod write on the shared claim, the servers read (and the Job writes over)."""
    ids = set()
    for name in SERVING_VARIANTS + STANDALONE:
        for o in variant(name):
            for ps in _pod_specs(o):
                psc = ps.get("securityContext", {})
                for c in ps.get("initContainers", []) + ps["containers"]:
                    csc = c.get("securityContext", {})
                    ids.add((name, _eff(psc, csc, "runAsUser"), _eff(psc, csc, "runAsGroup"), psc.get("fsGroup")))
    assert len({i[1:] for i in ids}) == 1 and next(iter(ids))[1] == 10001, sorted(ids)


# ----------------------------------------------------------------------------------------------------------------
# the manifests against the real binary

def _remap(value, mounts):
    """Replace each volume's mountPath in value (a path, a flag's value, a comma list) by its tmp directory."""
    if not mounts:
        return value
    alt = "|".join(re.escape(m) for m in sorted(mounts, key=len, reverse=True))  # one pass: /tmp may hold the locals
    return re.sub(r"(^|[=,])(" + alt + r")(?=/|,|$)", lambda mt: mt.group(1) + mounts[mt.group(2)], value)


def _local_volumes(tmp_path, pod_spec, c):
    """Each mount of c becomes a directory under tmp_path; a Secret's gets a 'token' file of 64 hex chars."""
    vols = {v["name"]: v for v in pod_spec.get("volumes", [])}
    mounts = {}
    for m in c.get("volumeMounts", []):
        local = tmp_path / "vol" / m["name"]
        local.mkdir(parents=True, exist_ok=True)
        if "secret" in vols[m["name"]]:
            (local / "token").write_text("0123456789abcdef" * 4)
        mounts[m["mountPath"]] = str(local)
    return mounts


def _env(c, mounts, fixed=None):
    e = dict(os.environ)
    for k in [k for k in e if k.startswith(("TENSORD_", "MODEL_", "OMP_"))]:
        del e[k]
    for v in c.get("env", []):
        if "value" in v:
            e[v["name"]] = _remap(v["value"], mounts)
    e.update(fixed or {})
    return e


def _entrypoint(tmp_path, tensord_bin):
    """The image's entrypoint script, running $TENSORD_BIN instead of /usr/local/bin/tensord."""
    assert os.path.isfile(ENTRYPOINT), f"{ENTRYPOINT} is missing: the manifests rely on the image's entrypoint"
    text = open(ENTRYPOINT).read()
    assert ENTRYPOINT_TOKEN_FILE in text, f"the entrypoint no longer names {ENTRYPOINT_TOKEN_FILE}: update this test"
    assert not os.path.exists(ENTRYPOINT_TOKEN_FILE), f"{ENTRYPOINT_TOKEN_FILE} exists here: it would open admin"
    patched, n = re.subn(r"^TENSORD=/usr/local/bin/tensord$", f"TENSORD={tensord_bin}", text, flags=re.M)
    assert n == 1, f"{ENTRYPOINT}: no line TENSORD=/usr/local/bin/tensord to point at the binary under test"
    path = tmp_path / "entrypoint.sh"
    path.write_text(patched)
    return ["/bin/sh", str(path)]


def _get(port, path):
    try:
        return requests.get(f"http://127.0.0.1:{port}{path}", timeout=5)
    except requests.RequestException:
        return None


@pytest.mark.parametrize("name", SERVING_VARIANTS)
def test_serving_args_run_the_real_server(tensord_bin, tmp_path, name):
    d, c = serving_container(variant(name))
    spec = d["spec"]["template"]["spec"]
    mounts = _local_volumes(tmp_path, spec, c)
    env = _env(c, mounts)
    base = os.path.join(env["MODEL_BASE_PATH"], env["MODEL_NAME"])
    write_version(base, 1, mm_model())
    rest, admin = free_port(), free_port()
    # the container: ENTRYPOINT + args; only the ports move: the serving ones appended (the last flag wins), the
    # admin port's value replaced where the manifest gives it (without it the entrypoint's --admin_port=0 holds)
    args = [re.sub(r"^--admin_port=\d+$", f"--admin_port={admin}", _remap(a, mounts)) for a in c["args"]]
    admin_on = "--admin_token_file" in args_map(c)
    cmd = [*_entrypoint(tmp_path, tensord_bin), *args, "--port=0", f"--rest_api_port={rest}",
           "--rest_api_host=127.0.0.1"]
    log = open(tmp_path / "serve.log", "w+")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def out():
        log.flush()
        return open(tmp_path / "serve.log").read()[-4000:]

    try:
        probes = [c["startupProbe"], c["livenessProbe"], c["readinessProbe"]]
        end = time.monotonic() + 60
        while time.monotonic() < end and proc.poll() is None:
            rs = [_get(rest, p["httpGet"]["path"]) for p in probes]
            if all(r is not None and r.status_code == 200 for r in rs):
                break
            # up, but a probe's route answers neither 200 nor "not ready yet": it will never pass
            if any(r is not None and r.status_code not in (200, 503) for r in rs):
                bad = [(p["httpGet"]["path"], r.status_code) for p, r in zip(probes, rs) if r is not None]
                pytest.fail(f"{name}: probe routes answer {bad}\n{out()}")
            time.sleep(0.1)
        else:
            pytest.fail(f"{name}: the probes never all answered 200 (exit {proc.poll()})\n{' '.join(cmd)}\n{out()}")
        ann = d["spec"]["template"]["metadata"]["annotations"]
        r = _get(rest, ann["prometheus.io/path"])
        assert r is not None and r.status_code == 200 and "tensord_" in r.text, f"metrics path: {r}"
        r = requests.post(f"http://127.0.0.1:{rest}/v1/models/{env['MODEL_NAME']}:predict",
                          data=json.dumps({"instances": [[1.0, 2.0, 3.0, 4.0]]}), timeout=10)
        assert r.status_code == 200 and len(r.json()["predictions"][0]) == 4, r.text
        if admin_on:
            secret_dir = [mounts[m["mountPath"]] for m, _ in mount_for(spec, c, lambda v: "secret" in v)][0]
            token = open(os.path.join(secret_dir, "token")).read()
            r = requests.get(f"http://127.0.0.1:{admin}/v1/admin/models", headers={"Authorization": f"Bearer {token}"},
                             timeout=10)
            assert r.status_code == 200 and env["MODEL_NAME"] in r.text, f"admin API: {r.status_code} {r.text}\n{out()}"
        proc.send_signal(signal.SIGTERM)
        grace = spec["terminationGracePeriodSeconds"] - _prestop_seconds(c)
        try:
            rc = proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{name}: still running {grace} s after SIGTERM: the kubelet would SIGKILL it\n{out()}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        log.close()
    text = open(tmp_path / "serve.log").read()
    assert rc == 0, f"{name}: exit {rc} after SIGTERM\n{text[-4000:]}"
    for mark in SANITIZER_MARKS:
        assert mark not in text, text[-4000:]
    drain = float(args_map(c)["--drain_seconds"])
    assert f"up to {drain:g} s" in text, f"{name}: the drain did not use --drain_seconds={drain:g}\n{text[-4000:]}"


def _write_idx(path, arr):
    """IDX (ubyte) as Fashion-MNIST ships it, gzipped: magic 0x08 <ndim>, big-endian int32 dims, then the bytes."""
    arr = np.ascontiguousarray(arr, dtype=np.uint8)
    head = struct.pack(">BBBB", 0, 0, 0x08, arr.ndim) + struct.pack(f">{arr.ndim}i", *arr.shape)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with gzip.open(path, "wb") as f:
        f.write(head + arr.tobytes())


def test_training_job_args_run_the_real_trainer(tensord_bin, tmp_path):
    job = one(variant(TRAIN_JOB), "Job")
    spec = job["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    mounts = _local_volumes(tmp_path, spec, c)
    args = [_remap(a, mounts) for a in c["args"]]
    a = {k: v for k, _, v in (x.partition("=") for x in args)}
    base = a["--model-base-path"]
    cp = subprocess.run([tensord_bin, "init", "--arch", "cnn", "--seed", "0", "--out", os.path.join(base, "1")],
                        capture_output=True, text=True, timeout=120)
    assert cp.returncode == 0, cp.stderr
    images, labels = a["--data"].split(",")
    rng = np.random.default_rng(0)
    _write_idx(images, rng.integers(0, 256, size=(96, 28, 28)))
    _write_idx(labels, rng.integers(0, 10, size=(96,)))
    env = _env(c, mounts, {"TENSORD_RANK": "0"})  # the downward API's completion index for pod 0
    cmd = [*_entrypoint(tmp_path, tensord_bin), *args, "--threads=1", "--epochs=1"]
    cp = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    for mark in SANITIZER_MARKS:
        assert mark not in cp.stderr, cp.stderr[-4000:]
    assert cp.returncode == 0, f"exit {cp.returncode}\n{' '.join(cmd)}\n{cp.stderr[-4000:]}"
    assert os.path.isfile(os.path.join(base, "2", "model.onnx")), os.listdir(base)
