"""What every benchmark records about the machine it ran on: CPU model, usable CPUs, git commit of the tree."""
import os
import platform
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def usable_cpus():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count()


def run_out(*cmd, cwd=ROOT):
    """stdout of a command, "" if it cannot run."""
    try:
        return subprocess.run(list(cmd), cwd=cwd, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


def git_commit():
    """Short commit of the tree, with -dirty when tracked files changed."""
    commit = run_out("git", "rev-parse", "--short=12", "HEAD") or "(no commit)"
    if run_out("git", "status", "--porcelain", "--untracked-files=no"):
        commit += "-dirty"
    return commit
