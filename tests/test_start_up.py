"""What every Dagster process pays at start (webserver, daemon, code server, each run worker): the
import of the definitions. A process that never calls a model must not import the openai package,
about 0.8 s of a ~2.6 s start (pipeline/evaluation/llm.py, OpenAIChatClient's docstring)."""

from __future__ import annotations

import subprocess
import sys

from .conftest import ROOT


def test_importing_the_definitions_does_not_import_the_openai_client():
    code = "import sys, warnings; warnings.simplefilter('ignore'); import definitions; print('openai' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "False"
