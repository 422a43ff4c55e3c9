#!/usr/bin/env bash
# Debian packages the project needs on a fresh machine. Idempotent and quiet.
set -euo pipefail

# stages/sandbox.py runs graded programs as an unprivileged uid, which cannot
# execute the pyenv interpreter under /root (mode 700): it needs a
# world-executable system python3 (and util-linux for the namespace probe in
# its tests).
if ! [ -x /usr/bin/python3 ] || ! command -v unshare >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq python3-minimal util-linux >/dev/null
fi
