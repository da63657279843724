"""The package lists in deploy/packages/ are the single source of truth (fast checks, no container needed):

  - each file is one Debian package name a line (`#` comments), no name twice in a file;
  - `make deps` installs exactly their union (read from `make -n deps`, so the check sees what make runs);
  - the Dockerfile installs packages only through deploy/docker/apt-install.sh and the lists: its build stages
    from build.txt, its runtime stages from runtime.txt; no apt-get install of its own;
  - runtime.txt covers the binary: every library $TENSORD_BIN names (DT_NEEDED) is owned (dpkg -S) by a package
    runtime.txt lists, and every library ldd resolves by a package in the dependency closure of that list
    (apt-cache depends --recurse), so a slim image with only those packages loads it;
  - the gpu target is the cpu target on another base: the same instructions but the FROM lines (and CUDA=1).
The container test (tests/container, `make test-container`) builds the image and runs the binary in it.
"""
import os
import re
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PKG_DIR = os.path.join(ROOT, "deploy", "packages")
LISTS = ("build", "runtime", "test")
NAME = re.compile(r"^[a-z0-9][a-z0-9+.-]+$")  # Debian policy 5.6.1


def read_list(name):
    path = os.path.join(PKG_DIR, f"{name}.txt")
    names = []
    with open(path) as f:
        for line in f:
            names += line.split("#", 1)[0].split()
    return names


def dockerfile_stages():
    """{stage name: [instruction lines, continuation lines joined]} in file order."""
    stages, cur, buf = {}, None, ""
    with open(os.path.join(ROOT, "Dockerfile")) as f:
        for raw in f:
            line = raw.rstrip("\n")
            if not buf and (not line.strip() or line.lstrip().startswith("#")):
                continue
            buf += line[:-1] + " " if line.endswith("\\") else line
            if line.endswith("\\"):
                continue
            ins, buf = " ".join(buf.split()), ""
            m = re.match(r"FROM\s+\S+\s+AS\s+(\S+)$", ins, re.I)
            if m:
                cur = m.group(1)
                stages[cur] = []
            assert cur, f"Dockerfile: an instruction before the first named FROM: {ins!r}"
            stages[cur].append(ins)
    return stages


@pytest.mark.parametrize("name", LISTS)
def test_package_file_is_names_one_a_line(name):
    names = read_list(name)
    assert names, f"deploy/packages/{name}.txt names no package"
    bad = [n for n in names if not NAME.match(n)]
    assert not bad, f"deploy/packages/{name}.txt: not Debian package names: {bad}"
    dup = sorted({n for n in names if names.count(n) > 1})
    assert not dup, f"deploy/packages/{name}.txt names these twice: {dup}"


def test_make_deps_installs_the_package_files():
    cp = subprocess.run(["make", "-n", "--no-print-directory", "deps"], cwd=ROOT, capture_output=True, text=True,
                        timeout=60)
    assert cp.returncode == 0, f"make -n deps failed: {cp.stderr[-2000:]}"
    lines = [l for l in cp.stdout.splitlines() if "apt-get install" in l]
    assert len(lines) == 1, f"expected one apt-get install in `make -n deps`, got:\n{cp.stdout}"
    installed = lines[0].split("apt-get install", 1)[1].split()
    installed = {w for w in installed if not w.startswith("-")}
    want = set().union(*(read_list(n) for n in LISTS))
    assert installed == want, (f"make deps installs other packages than deploy/packages/*.txt: only in make: "
                               f"{sorted(installed - want)}, only in the files: {sorted(want - installed)}")


def test_dockerfile_installs_from_the_package_files_only():
    text = open(os.path.join(ROOT, "Dockerfile")).read()
    code = "\n".join(l for l in text.splitlines() if not l.lstrip().startswith("#"))
    assert not re.search(r"\bapt(-get)?\s+install\b", code), \
        "the Dockerfile runs apt install itself: install through deploy/docker/apt-install.sh and deploy/packages/"
    want = {"build": "build.txt", "gpu-build": "build.txt", "cpu": "runtime.txt", "gpu": "runtime.txt"}
    stages = dockerfile_stages()
    assert set(stages) == set(want), f"Dockerfile stages {sorted(stages)}, expected {sorted(want)}"
    for stage, body in stages.items():
        runs = [i for i in body if i.startswith("RUN") and "apt-install.sh" in i]
        assert len(runs) == 1, f"stage {stage}: expected one RUN of apt-install.sh, got {runs}"
        files = re.findall(r"apt-install\.sh\s+((?:\S+\.txt\s*)+)", runs[0])
        named = [os.path.basename(f) for f in files[0].split()] if files else []
        assert named == [want[stage]], f"stage {stage} installs from {named}, expected [{want[stage]}]"
        copies = [i for i in body if i.startswith("COPY") and f"deploy/packages/{want[stage]}" in i]
        assert copies, f"stage {stage} does not COPY deploy/packages/{want[stage]}"


def test_gpu_target_is_the_cpu_target_on_another_base():
    stages = dockerfile_stages()

    def body(stage, build_stage):
        out = []
        for i in stages[stage][1:]:  # all but FROM
            i = i.replace(f"--from={build_stage} ", "--from=BUILD ").replace(" CUDA=1", "")
            out.append(i)
        return out

    assert body("gpu", "gpu-build") == body("cpu", "build"), \
        "the gpu and cpu runtime stages differ (entry point, user, ports, health check, packages must match)"
    assert body("gpu-build", "") == body("build", ""), "the gpu-build and build stages differ beyond CUDA=1"
    assert any("CUDA=1" in i for i in stages["gpu-build"]), "the gpu-build stage does not build with CUDA=1"
    assert "nvidia/cuda:13" in stages["gpu"][0] and "runtime" in stages["gpu"][0], stages["gpu"][0]
    assert "nvidia/cuda:13" in stages["gpu-build"][0] and "devel" in stages["gpu-build"][0], stages["gpu-build"][0]


# ---------------------------------------------------------------------------------------------------------------
# runtime.txt against the binary

def _owners(paths):
    """{path: the Debian package that ships it, or None}; merged /usr: /lib and /usr/lib spellings both tried, and
    the file a symlink (an alternative) points to. One dpkg -S for all: it is slow per call."""
    cands = {}
    for path in paths:
        cands[path] = []
        for p in (path, os.path.realpath(path)):
            cands[path] += [p, p[4:] if p.startswith("/usr/") else "/usr" + p]
    allc = sorted({c for cs in cands.values() for c in cs})
    cp = subprocess.run(["dpkg", "-S", *allc], capture_output=True, text=True, timeout=120)
    owner = {}
    for line in cp.stdout.splitlines():
        if line.startswith("diversion") or ": " not in line:
            continue
        pkgs, f = line.split(": ", 1)
        owner[f.strip()] = pkgs.split(",")[0].split(":")[0].strip()
    return {path: next((owner[c] for c in cs if c in owner), None) for path, cs in cands.items()}


def _closure(pkgs):
    cp = subprocess.run(["apt-cache", "depends", "--recurse", "--no-recommends", "--no-suggests", "--no-conflicts",
                         "--no-breaks", "--no-replaces", "--no-enhances", *pkgs], capture_output=True, text=True,
                        timeout=120)
    assert cp.returncode == 0, f"apt-cache depends failed: {cp.stderr[-1000:]}"
    return {l.strip().strip("<>").split(":")[0] for l in cp.stdout.splitlines() if l and not l.startswith(" ")}


def test_runtime_list_covers_every_library_the_binary_loads(tensord_bin):
    for tool in ("dpkg", "apt-cache", "ldd", "objdump"):
        if not shutil.which(tool):
            pytest.skip(f"{tool} not found: this check reads Debian's package database (Debian 12, as the image)")
    runtime = set(read_list("runtime"))
    ldd = subprocess.run(["ldd", tensord_bin], capture_output=True, text=True, timeout=60)
    assert ldd.returncode == 0, f"ldd {tensord_bin}: {ldd.stderr}"
    libs = {}  # soname -> resolved path
    for line in ldd.stdout.splitlines():
        m = re.match(r"\s*(\S+)\s+=>\s+(\S+)", line) or re.match(r"\s*(/\S+)\s+\(", line)
        if not m:
            continue
        soname, path = (m.group(1), m.group(2)) if m.lastindex == 2 else (os.path.basename(m.group(1)), m.group(1))
        assert path != "not", f"{tensord_bin} needs {soname}, which this machine lacks (make deps)"
        libs[soname] = path
    od = subprocess.run(["objdump", "-p", tensord_bin], capture_output=True, text=True, timeout=60)
    needed = re.findall(r"^\s*NEEDED\s+(\S+)", od.stdout, re.M)
    assert needed, f"objdump -p {tensord_bin} shows no NEEDED entries"
    by_path = _owners(libs.values())
    owners = {s: by_path[p] for s, p in libs.items()}
    unowned = sorted(s for s, o in owners.items() if o is None)
    assert not unowned, f"libraries no Debian package ships (built by hand?): {unowned}"
    direct = {s: owners[os.path.basename(s)] if os.path.basename(s) in owners else None for s in needed}
    missing = sorted(f"{s} ({o})" for s, o in direct.items() if o not in runtime)
    assert not missing, (f"{tensord_bin} names libraries whose packages deploy/packages/runtime.txt does not list: "
                         f"{missing}")
    closure = _closure(sorted(runtime))
    indirect = sorted(f"{s} ({o})" for s, o in owners.items() if o not in closure)
    assert not indirect, (f"ldd resolves libraries from packages outside runtime.txt's dependency closure (the slim "
                          f"image would lack them): {indirect}")
