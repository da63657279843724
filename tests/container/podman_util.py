"""Podman for the container tests: settings that work on this machine, the Debian base images made from Debian's
archive (no container registry is reachable here), and wrappers that show podman's own words when a step fails.

  podman_env(tmp)      writes a containers.conf and returns the environment to run podman with. podman's defaults
                       fail here: crun does not support this hybrid cgroup v1/v2 setup (runc does, with cgroupfs),
                       and the default ulimits are above the hard limits, which a container cannot raise.
  ensure_base(env)     docker.io/library/debian:12 and :12-slim, as the Dockerfile's FROM lines name them: kept from
                       an earlier run when both exist, else `debootstrap --variant=minbase bookworm` (~30 s,
                       ~200 MB) imported twice, the slim one without docs, man pages and locales (as Debian's
                       -slim images), so the image size measured here is close to the real one.
  probe(env)           a trivial `podman run` with a published port: None when containers run, else why not.
  podman(env, *args)   runs podman; on failure, pytest.fail with the command and the tail of its output.

Unavailable is one of two things (Unavailable.kind): "tool" (podman, runc or debootstrap missing: `make deps`
installs them, deploy/packages/test.txt) or "machine" (the kernel, the runtime or the network refuses).
"""
import os
import resource
import shutil
import subprocess
import tempfile
import time

import pytest

BASE = "docker.io/library/debian:12"
BASE_SLIM = "docker.io/library/debian:12-slim"
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"


class Unavailable(Exception):
    def __init__(self, kind, why):
        super().__init__(why)
        self.kind = kind  # "tool" | "machine"
        self.why = why


def _tail(text, n=40):
    return "\n".join((text or "").splitlines()[-n:])


def podman_env(tmp):
    """Environment (a copy of os.environ) with CONTAINERS_CONF pointing at a file written under tmp."""
    hard_nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    hard_nproc = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    nofile = 1048576 if hard_nofile == resource.RLIM_INFINITY else hard_nofile
    nproc = 32768 if hard_nproc == resource.RLIM_INFINITY else min(32768, hard_nproc)
    conf = os.path.join(str(tmp), "containers.conf")
    with open(conf, "w") as f:
        f.write("# written by tests/container/podman_util.py\n"
                "[containers]\n"
                f'default_ulimits = ["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]\n'
                "[engine]\n"
                'runtime = "runc"\n'
                'cgroup_manager = "cgroupfs"\n')
    env = dict(os.environ)
    env["CONTAINERS_CONF"] = conf
    return env


def run(env, args, timeout=120, check=True, log=None):
    """Runs a command; returns CompletedProcess (text). check: pytest.fail with its output when it fails.
    log: a path that receives stdout and stderr (for long builds), whose tail a failure shows."""
    try:
        if log:
            with open(log, "w") as f:
                cp = subprocess.run(args, env=env, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    timeout=timeout, text=True)
            with open(log) as f:
                cp.stdout, cp.stderr = f.read(), ""
        else:
            cp = subprocess.run(args, env=env, capture_output=True, stdin=subprocess.DEVNULL, timeout=timeout, text=True)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        if log and os.path.exists(log):
            out = open(log).read()
        pytest.fail(f"`{' '.join(args)}` did not finish within {timeout} s\n{_tail(out)}")
    if check and cp.returncode != 0:
        pytest.fail(f"`{' '.join(args)}` exited {cp.returncode}\n{_tail(cp.stdout + cp.stderr)}")
    return cp


def podman(env, *args, timeout=120, check=True, log=None):
    return run(env, ["podman", *args], timeout=timeout, check=check, log=log)


def _need_tool(name):
    if not shutil.which(name):
        raise Unavailable("tool", f"{name} is not installed (deploy/packages/test.txt; `make deps` installs it)")


def _image_exists(env, ref):
    return subprocess.run(["podman", "image", "exists", ref], env=env, capture_output=True).returncode == 0


def ensure_base(env):
    """Makes sure BASE and BASE_SLIM exist locally; returns seconds spent (0 when both were there)."""
    _need_tool("podman")
    _need_tool("runc")
    if _image_exists(env, BASE) and _image_exists(env, BASE_SLIM):
        return 0.0
    _need_tool("debootstrap")
    if os.geteuid() != 0:
        raise Unavailable("machine", "the base image is made with debootstrap, which needs root")
    t0 = time.monotonic()
    work = tempfile.mkdtemp(prefix="tensord-debootstrap-", dir="/var/tmp")
    try:
        root = os.path.join(work, "rootfs")
        cp = subprocess.run(["debootstrap", "--variant=minbase", SUITE, root, MIRROR], capture_output=True, text=True,
                            timeout=600)
        if cp.returncode != 0:
            raise Unavailable("machine", f"debootstrap {SUITE} from {MIRROR} failed (exit {cp.returncode}):\n"
                                         f"{_tail(cp.stdout + cp.stderr, 15)}")
        _like_official(root)
        _import(env, root, BASE)
        _slim(root)
        _import(env, root, BASE_SLIM)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return time.monotonic() - t0


def _like_official(root):
    """What Debian's own debian:12 image has and a debootstrap tree lacks or adds: the updates and security
    suites, no apt lists or downloaded packages (every Dockerfile runs apt-get update first)."""
    os.remove(os.path.join(root, "etc/apt/sources.list"))
    with open(os.path.join(root, "etc/apt/sources.list.d/debian.sources"), "w") as f:
        f.write(f"Types: deb\nURIs: {MIRROR}\nSuites: {SUITE} {SUITE}-updates\nComponents: main\n"
                "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n"
                f"Types: deb\nURIs: http://deb.debian.org/debian-security\nSuites: {SUITE}-security\nComponents: main\n"
                "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n")
    for d in ("var/lib/apt/lists", "var/cache/apt"):
        subprocess.run(["find", os.path.join(root, d), "-type", "f", "-delete"], check=True)


def _slim(root):
    """As Debian's -slim images: docs, man pages and translations removed, and dpkg told not to install them."""
    for d in ("usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale"):
        p = os.path.join(root, d)
        if os.path.isdir(p):
            for e in os.listdir(p):
                q = os.path.join(p, e)
                shutil.rmtree(q) if os.path.isdir(q) and not os.path.islink(q) else os.remove(q)
    with open(os.path.join(root, "etc/dpkg/dpkg.cfg.d/docker"), "w") as f:
        f.write("path-exclude /usr/share/doc/*\npath-include /usr/share/doc/*/copyright\n"
                "path-exclude /usr/share/man/*\npath-exclude /usr/share/info/*\npath-exclude /usr/share/locale/*\n")


def _import(env, root, ref):
    tar = subprocess.Popen(["tar", "-C", root, "-c", "."], stdout=subprocess.PIPE)
    cp = subprocess.run(["podman", "import", "--change", "CMD [\"bash\"]", "-", ref], stdin=tar.stdout, env=env,
                        capture_output=True, text=True, timeout=300)
    tar.stdout.close()
    tar.wait()
    if cp.returncode != 0 or tar.returncode != 0:
        raise Unavailable("machine", f"podman import of the debootstrap tree as {ref} failed (exit {cp.returncode}):\n"
                                     f"{_tail(cp.stdout + cp.stderr, 15)}")


def probe(env):
    """None if a container starts with a published loopback port, else podman's reason."""
    cp = subprocess.run(["podman", "run", "--rm", "-p", "127.0.0.1::8501", BASE, "true"], env=env,
                        capture_output=True, text=True, timeout=120)
    if cp.returncode != 0:
        return f"`podman run --rm -p 127.0.0.1::8501 {BASE} true` exited {cp.returncode}:\n{_tail(cp.stderr, 15)}"
    return None
