#!/usr/bin/env bash
# `dlog bench compare` measures Redis Streams beside dlog: it needs Debian's redis-server (the bench
# starts its own on a free loopback port and stops it) and the `redis` client in .venv. Install
# both when missing; without them only that mode (and its test, which skips) is unavailable, so
# this never fails `make test`.
set -uo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
status=0
if ! command -v redis-server >/dev/null 2>&1; then
    if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
        echo "redis-server not found: installing it with apt-get" >&2
        export DEBIAN_FRONTEND=noninteractive
        # the package's own service is not wanted (the bench runs its own process); policy-rc.d
        # is not touched, so on a machine with systemd the packaged service may start: harmless
        if ! (apt-get update -qq && apt-get install -y -qq --no-install-recommends redis-server >/dev/null); then
            echo "apt-get could not install redis-server: dlog bench compare is unavailable" >&2
            status=1
        fi
    else
        echo "redis-server not found: install it (Debian: sudo apt-get install redis-server)" >&2
        status=1
    fi
fi
if [ -x "$VENV/bin/python" ]; then
    if ! "$VENV/bin/python" -c "import redis" >/dev/null 2>&1; then
        echo "python package redis not found in $VENV: installing the bench extra (redis, hiredis) with pip" >&2
        "$VENV/bin/python" -m pip install --quiet -e '.[bench]' || status=1
    fi
else
    echo "no virtualenv at $VENV: run make install first, then this script again" >&2
    status=1
fi
exit $status
