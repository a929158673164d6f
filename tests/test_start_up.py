"""What every Dagster process pays at start (webserver, daemon, code server, each run and step
worker): the import of the definitions. Packages only some runs use are imported where they are
used: the openai client (about 0.8 s of a ~2.6 s start; pipeline/evaluation/llm.py) and matplotlib
(about 0.4 s; the pictures of assets/ingest.py, assets/articles.py, the leaderboards' charts)."""

from __future__ import annotations

import subprocess
import sys

from .conftest import ROOT

LAZY = ("openai", "matplotlib")


def test_importing_the_definitions_imports_neither_openai_nor_matplotlib():
    code = (
        "import sys, warnings; warnings.simplefilter('ignore'); import definitions; "
        f"print(sorted(name for name in {LAZY!r} if name in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
