"""Fail (exit 1) when a sanitizer report in a unit-test log points at our code.

Criterion runs each test in a child process, and a leak or a UBSan error there does not fail the test by itself,
so `make test-san` reads the log. A LeakSanitizer report whose every frame is in libcriterion (its runner's own
block, seen when workers finish together) is not ours and is passed over; any other report fails the run.
Usage: san_check.py LOG
"""
import re
import sys


def main(path):
    text = open(path, errors="replace").read()
    bad = []
    if re.search(r"runtime error:|ERROR: AddressSanitizer", text):
        bad.append("an AddressSanitizer or UBSan report")
    for block in re.split(r"\n(?=(?:Direct|Indirect) leak of )", text):
        if not re.match(r"(Direct|Indirect) leak of ", block):
            continue
        frames = [ln for ln in block.splitlines()[1:] if re.match(r"\s+#\d+ ", ln)]
        ours = [f for f in frames if not re.search(r"libcriterion|libasan|libsanitizer|__interceptor_|libc\.so|"
                                                    r"ld-linux|<unknown module>", f)]
        if ours:
            bad.append("a leak in our code:\n" + "\n".join(block.splitlines()[:12]))
    if bad:
        print(f"{path}: " + "\n".join(bad))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
