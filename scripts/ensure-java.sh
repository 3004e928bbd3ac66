#!/usr/bin/env bash
# ZooKeeper needs a JRE. Install Debian's headless one when missing and we are root.
set -euo pipefail
if command -v java >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "java not found: installing openjdk-17-jre-headless with apt-get" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq openjdk-17-jre-headless >/dev/null
    exit 0
fi
echo "java not found: install a Java 17 runtime (Debian: sudo apt-get install openjdk-17-jre-headless) and run make again" >&2
exit 1
