#!/usr/bin/env bash
# The UI browser test (tests/integration/test_ui.py) needs a headless chromium. Install Debian's
# when missing and we are root; otherwise say what to do. Never fails `make test`: without a
# browser that one test skips and says why.
set -uo pipefail
if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "chromium not found: installing it with apt-get" >&2
    export DEBIAN_FRONTEND=noninteractive
    if apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null; then
        exit 0
    fi
    echo "apt-get could not install chromium: the UI browser test will skip" >&2
    exit 0
fi
echo "chromium not found: install it (Debian: sudo apt-get install chromium) or the UI browser test skips" >&2
exit 0
