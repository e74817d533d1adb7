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
