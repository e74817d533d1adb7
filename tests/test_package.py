"""The package itself: typed marker, an import path with nothing platform-specific."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import historygraph


def test_py_typed_is_shipped():
    assert (Path(historygraph.__file__).parent / "py.typed").is_file()
    assert "py.typed" in (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()


def test_the_cli_imports_where_there_is_no_resource_module():
    # `resource` exists on POSIX only; blocking it reproduces Windows for the import path
    code = ("import sys; sys.modules['resource'] = None\n"
            "import historygraph.cli.replay as cli\n"
            "assert cli._peak_rss_mb() is None\n"
            "print('ok')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_peak_memory_is_reported_where_resource_exists():
    from historygraph.cli.replay import _peak_rss_mb

    mb = _peak_rss_mb()
    assert mb is not None and 10 < mb < 24_000  # this test process: more than 10 MB, less than the machine


def test_setup_says_something_while_pip_runs(tmp_path):
    """Issue 50: set-up printed nothing for 10–13 minutes while pip installed on a loaded machine.
    scripts/setup.sh in a copy of the repository whose .venv/bin/python is a stand-in that is
    silent for 3.5 s in the main install step: with a heartbeat of 1 s (30 s by default) the step
    says it is still running, and quotes pip's last line."""
    import os
    import shutil
    import time

    root = Path(__file__).resolve().parents[1]
    (tmp_path / "scripts").mkdir()
    shutil.copy(root / "scripts" / "setup.sh", tmp_path / "scripts" / "setup.sh")
    (tmp_path / "pyproject.toml").write_text("")
    fake = tmp_path / ".venv" / "bin" / "python"
    fake.parent.mkdir(parents=True)
    fake.write_text('#!/usr/bin/env bash\n'  # pip install: silent for 3.5 s in the step installing historygraph
                    'case "$*" in *" -e "*) echo "Collecting numpy"; sleep 3.5; echo "Successfully installed a b";; esac\n')
    fake.chmod(0o755)
    env = {**os.environ, "PYTHON": sys.executable, "HISTORYGRAPH_SETUP_HEARTBEAT": "1"}
    t0 = time.monotonic()
    r = subprocess.run(["bash", "scripts/setup.sh"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    beats = [ln for ln in r.stderr.splitlines() if "pip still running" in ln]
    assert len(beats) >= 2 and all("historygraph with the" in ln for ln in beats), r.stderr
    assert "its last line: Collecting numpy" in beats[-1] and "setup: [" in beats[0]
    assert time.monotonic() - t0 < 15  # no heartbeat left behind holding stderr open
    assert (tmp_path / ".venv" / ".historygraph-installed").exists()
