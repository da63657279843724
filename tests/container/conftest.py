"""The container tests' shared setup: podman that works here, the Debian base images, and the image built once
per session from the repository's Dockerfile (its cpu target), as `make test-container` runs them.

Skip or fail, when this machine cannot run the image:
  - a missing tool (podman, runc, debootstrap) is a broken `make deps` (deploy/packages/test.txt lists them):
    a skip on a developer's machine, a FAILURE under CI=true, where `make deps` has just run;
  - a machine that refuses containers (the kernel, the runtime, no route to Debian's archive for debootstrap) is
    a skip everywhere, with podman's or debootstrap's own words: no change to this repository fixes it, and
    failing would block every change over the machine. Under CI=true that skip ends the run with a banner, so a
    green CI that did not run the container test cannot pass unnoticed.
A skip never happens silently: pytest -rs prints its reason, and the terminal summary repeats it.
"""
import os
import time

import pytest

import podman_util as pu

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
IMAGE = "localhost/tensord:ci"
CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

_report = {"why": None, "failed": False, "lines": []}


class Ctr:
    """What the tests need from the session: podman's environment, the image, the timings."""

    def __init__(self, env, image):
        self.env = env
        self.image = image

    def podman(self, *args, **kw):
        return pu.podman(self.env, *args, **kw)


def _unavailable(kind, why):
    _report["why"] = why
    if CI and kind == "tool":
        _report["failed"] = True
        pytest.fail(f"CI=true and the container test cannot run: {why}")
    pytest.skip(f"containers cannot run on this machine: {why}")


@pytest.fixture(scope="session")
def ctr(tmp_path_factory):
    env = pu.podman_env(tmp_path_factory.mktemp("podman"))
    try:
        spent = pu.ensure_base(env)
        why = pu.probe(env)
    except pu.Unavailable as e:
        _unavailable(e.kind, e.why)
    if why:
        _unavailable("machine", why)
    _report["lines"].append(f"base images {pu.BASE}, {pu.BASE_SLIM}: "
                            + (f"made with debootstrap in {spent:.0f} s" if spent else "kept from an earlier run"))
    log = str(tmp_path_factory.mktemp("build") / "podman-build.log")
    t0 = time.monotonic()
    # --format docker: the OCI format has no HEALTHCHECK; --pull=never: the FROM images are the local ones
    pu.podman(env, "build", "--format", "docker", "--pull=never", "--target", "cpu", "-t", IMAGE, "-f",
              os.path.join(ROOT, "Dockerfile"), ROOT, timeout=1500, log=log)
    size = pu.podman(env, "images", "--format", "{{.Size}}", IMAGE).stdout.strip()
    _report["lines"].append(f"{IMAGE} (Dockerfile, target cpu) built in {time.monotonic() - t0:.0f} s: {size}")
    return Ctr(env, IMAGE)


@pytest.hookimpl(trylast=True)  # after pytest's own summary: the banner is the last thing printed
def pytest_terminal_summary(terminalreporter):
    tr = terminalreporter
    for line in _report["lines"]:
        tr.write_line(f"container test: {line}")
    why = _report["why"]
    if why:
        bar = "!" * 100
        what = "FAILED (a tool `make deps` installs is missing)" if _report["failed"] else "SKIPPED"
        tr.write_line(bar, red=True, bold=True)
        tr.write_line(f"CONTAINER TESTS {what}{' UNDER CI=true' if CI else ''}: the image was not built or run.",
                      red=True, bold=True)
        for line in why.splitlines():
            tr.write_line(f"  {line}", red=True)
        tr.write_line(bar, red=True, bold=True)
