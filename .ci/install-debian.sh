#!/usr/bin/env bash
# Debian packages the project needs on a fresh machine. Idempotent and quiet.
set -euo pipefail

# sandbox/supervisor.py runs graded programs as an unprivileged uid, which cannot
# execute the pyenv interpreter under /root (mode 700): it needs a
# world-executable system python3 (and util-linux for the namespace probe in
# its tests).
if ! [ -x /usr/bin/python3 ] || ! command -v unshare >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq python3-minimal util-linux >/dev/null
fi

# tests/faults/test_fault_s3_outage.py needs an S3 server that keeps its objects across a restart: npm's
# s3rver (persists to a directory), installed project-locally into .ci/node_modules.
CI_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if ! [ -x "$CI_DIR/node_modules/.bin/s3rver" ]; then
    if ! command -v npm >/dev/null 2>&1; then
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq >/dev/null
        apt-get install -y -qq nodejs npm >/dev/null
    fi
    npm install --prefix "$CI_DIR" --no-save --no-audit --no-fund --loglevel=error s3rver@3.7.1 >/dev/null
fi

# tests/flows/test_deploy.py drives the Prefect UI in headless Chromium (Playwright with executable_path).
if ! [ -x /usr/bin/chromium ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq chromium >/dev/null
fi
