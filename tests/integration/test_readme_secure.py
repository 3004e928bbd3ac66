"""The README's secure quick start works as printed: `dlog standalone --secure`, then every command
of the block with the client.toml it made (only the directory and ZooKeeper port differ)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.helpers import readme_blocks
from dlog_tools.cluster import LineReader

PROJECT = Path(__file__).resolve().parent.parent.parent


def test_the_secure_quick_start_works_as_printed(tmp_path):
    block = next(body for body in readme_blocks("") if "standalone --secure" in body)
    lines = [line.split("  #")[0].strip() for line in block.splitlines()
             if line.strip() and not line.lstrip().startswith("#")]
    lines = [line.replace("/tmp/dlog-secure", str(tmp_path / "dlog-secure"))
                 .replace("/tmp/shop.toml", str(tmp_path / "shop.toml")) for line in lines]
    start, *commands = lines
    assert "standalone --secure" in start and len(commands) == 6
    arguments = start.split()[1:] + ["--zk-port", "0", "--ui-port", "-1"]
    environment = {key: value for key, value in os.environ.items() if not key.startswith("DLOG_")}
    standalone = subprocess.Popen([sys.executable, "-m", "dlog_tools.cli", *arguments], cwd=PROJECT,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  env=environment)
    try:
        reader = LineReader(standalone)
        assert reader.line_starting("dlog standalone ready", 90) is not None
        config_line = reader.line_starting("  client config", 10)
        assert config_line is not None and "client.toml" in config_line
        for command in commands:
            if command.startswith("export "):
                name, _, value = command[len("export "):].partition("=")
                environment[name] = value
                continue
            result = subprocess.run(command.replace(".venv/bin/dlog", f"{sys.executable} -m dlog_tools.cli"),
                                    shell=True, cwd=PROJECT, capture_output=True, text=True, timeout=120,
                                    env=environment)
            assert result.returncode == 0, (command, result.stderr)
            if " read " in command:
                assert result.stdout.split() == ["hello", "world"]
    finally:
        standalone.send_signal(signal.SIGTERM)
        standalone.wait(timeout=60)
        standalone.stdout.close()
