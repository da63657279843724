#!/bin/sh
# apt-install.sh - installs the packages named in deploy/packages/*.txt files, for the Dockerfile's stages.
# The one way an image installs packages, so the package lists stay the single source of truth:
#   apt-install.sh FILE...   one package a line, `#` starts a comment; --no-install-recommends; apt lists removed.
# A name this distribution's archive does not have is reported by name (with the file), before anything is
# installed: the gpu target's Ubuntu base renames some Debian packages (see deploy/packages/runtime.txt).
set -eu
[ "$#" -gt 0 ] || { echo "apt-install.sh: give one or more package files (deploy/packages/*.txt)" >&2; exit 2; }
pkgs=
for f in "$@"; do
    [ -r "$f" ] || { echo "apt-install.sh: cannot read package file '$f'" >&2; exit 2; }
    pkgs="$pkgs $(sed 's/#.*//' "$f" | tr -s ' \t' '\n\n')"
done
pkgs=$(echo $pkgs)
[ -n "$pkgs" ] || { echo "apt-install.sh: no package names in $*" >&2; exit 2; }

export DEBIAN_FRONTEND=noninteractive
apt-get update -q
missing=
for p in $pkgs; do
    # `apt-cache show` also finds virtual packages; a real candidate version is what install needs
    apt-cache policy "$p" 2>/dev/null | grep -q 'Candidate: [^(]' || missing="$missing $p"
done
if [ -n "$missing" ]; then
    . /etc/os-release
    echo "apt-install.sh: not in ${PRETTY_NAME:-this distribution}'s archive:$missing (from $*)" >&2
    exit 1
fi
apt-get install -y -q --no-install-recommends $pkgs
apt-get clean
rm -rf /var/lib/apt/lists/*
