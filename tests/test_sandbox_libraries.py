"""Code blocks that import numpy and pandas (issue 15, point 3; MIRAI's code-block prompt offers
them). The libraries are loaded in the sandbox child before lockdown; every test here makes its
attack from a block that imports them, with the Python-level guards switched off the way
test_sandbox_attacks.py does it, so what refuses is the kernel: the empty root, Landlock, the
pinned descriptor table, the seccomp allowlist and the address-space limit.
"""

from __future__ import annotations

import http.server
import importlib.util
import re
import sys
import threading
from datetime import date
from typing import ClassVar

import pytest

from pipeline.agent_api import EventDatabase
from pipeline.agent_api.lockdown import SECCOMP_ARCHES, machine
from pipeline.agent_api.sandbox import Sandbox
from pipeline.storage import DataLayout
from testbed.database import generate_event_database
from tests.test_sandbox_attacks import BYPASS

pytestmark = pytest.mark.skipif(
    sys.platform != "linux" or machine() not in SECCOMP_ARCHES,
    reason=f"the sandbox's OS layer is built for Linux {', '.join(SECCOMP_ARCHES)}",
)
IMPORTS = "import numpy as np\nimport pandas as pd\n"
CUTOFF_QUERY = date(2023, 12, 10)


@pytest.fixture(scope="module")
def database(tmp_path_factory):
    """Three months; the environment's cutoff is in the second, so the third is a later month."""
    root = tmp_path_factory.mktemp("libraries-db")
    generate_event_database(root, date(2023, 11, 1), 3, seed=7, quads_per_day=20)
    return root


@pytest.fixture(scope="module")
def env(database):
    environment = EventDatabase(database, code_libraries=("numpy", "pandas")).environment(CUTOFF_QUERY)
    yield environment
    environment.close()


@pytest.fixture(scope="module")
def unguarded(env):
    """The module's environment after the bypass: the audit hook and import guard let everything
    through, numpy and pandas are imported."""
    assert env.run_code(BYPASS).strip() == "guards off"
    assert env.run_code(IMPORTS) == ""
    return env


def test_numpy_and_pandas_analyse_the_gated_tables(env):
    """What a MIRAI agent does with them: a frame from the API's events, grouped, resampled,
    pivoted, queried, iterated; a matrix inverted; the newest event is the cutoff's."""
    code = IMPORTS + (
        "events = get_events(date_range=DateRange(start_date=Date('2023-11-01'), end_date=Date('2023-12-09')))\n"
        "df = pd.DataFrame([{'date': e.date.date, 'r': e.relation.code, 'n': 1} for e in events])\n"
        "df['date'] = pd.to_datetime(df['date'])\n"
        "weekly = df.set_index('date').resample('W')['n'].sum()\n"
        "top = df.groupby('r').size().sort_values(ascending=False)\n"
        "table = df.pivot_table(index='date', columns='r', values='n', aggfunc='sum', fill_value=0)\n"
        "print(len(df), int(weekly.sum()), int(top.sum()), int(np.asarray(table).sum()), len(df.query('n == 1')),"
        " len(list(df.itertuples())), int(df['r'].str.contains('^[0-9]{3}$', regex=True).sum()))\n"
        "m = np.random.default_rng(0).normal(size=(300, 300))\n"
        "newest = pd.to_datetime(pd.Series([e.date.date for e in get_events()])).max()\n"
        "print(newest == pd.Timestamp('2023-12-09'), np.allclose(np.linalg.inv(m) @ m, np.eye(300)))"
    )
    first, second = env.run_code(code).splitlines()
    assert first.split() == ["30"] * 7
    assert second == "True True"  # the newest event is the cutoff's (query day 2023-12-10, distance 1)
    assert env.sandbox_report["libraries"].startswith(f"numpy {importlib.import_module('numpy').__version__}, pandas")


def _paths(database) -> dict[str, str]:
    layout = DataLayout(database)
    return {
        "a later month": str(layout.database_path("events", date(2024, 1, 1))),
        "the cutoff month": str(layout.database_path("news", date(2023, 12, 1))),
        "a system file": "/etc/passwd",
    }


READS = {
    "np.fromfile": "np.fromfile(PATH, dtype=np.uint8)[:16].tobytes()",
    "np.load": "np.load(PATH, allow_pickle=True)",
    "np.memmap": "bytes(np.memmap(PATH, dtype=np.uint8, mode='r')[:16])",
    "np.loadtxt": "np.loadtxt(PATH, dtype=str, delimiter=':')",
    "pd.read_csv": "pd.read_csv(PATH, sep=':', header=None)",
    "pd.read_parquet": "pd.read_parquet(PATH)",
    "pd.read_table": "pd.read_table(PATH, engine='python')",
    "pd.read_pickle": "pd.read_pickle(PATH)",
    # ctypes reached through numpy (no import): libc is already mapped, so dlopen(NULL) reads no file.
    "libc open via np.ctypeslib": "_l = np.ctypeslib.ctypes.CDLL(None, use_errno=True)\n"
    "print(_l.open(PATH.encode(), 0), np.ctypeslib.ctypes.get_errno())",
    "np.ctypeslib.load_library": "np.ctypeslib.load_library('libc.so.6', '/lib/x86_64-linux-gnu')",
    # pyarrow, which pandas loads for its Arrow-backed dtypes, reached through sys.modules.
    "pyarrow.memory_map": "_sys.modules['pyarrow'].memory_map(PATH)",
    "pyarrow.ipc.open_file": "_sys.modules['pyarrow'].ipc.open_file(PATH)",
}


@pytest.mark.parametrize("reader", list(READS))
def test_library_file_reads_are_refused_by_the_kernel(unguarded, database, reader):
    """Each reader on each path (a later month's database file, the cutoff month's, /etc/passwd):
    refused (open answers EPERM: the seccomp allowlist, behind it the empty root and Landlock), and
    nothing of the file reaches the observation. pandas' parquet engine (pyarrow) is not loaded,
    so read_parquet fails earlier, at the import, which needs files too."""
    if reader.startswith("pyarrow") and unguarded.run_code("'pyarrow' in _sys.modules").strip() != "True":
        pytest.skip("pandas did not load pyarrow here")
    for what, path in _paths(database).items():
        code = f"PATH = {path!r}\n" + READS[reader]
        observation = unguarded.run_code(code)
        if reader == "libc open via np.ctypeslib":
            assert observation.split() == ["-1", "1"], (what, observation)  # -1, EPERM
            continue
        # np.fromfile reports the refused open as a SystemError; any error, and no bytes of the file.
        assert re.match(r"(PermissionError|OSError|ImportError|SystemError): ", observation), (what, observation)
        assert "root:" not in observation and "PAR1" not in observation, (what, observation)


WRITES = {
    "np.save": "np.save(PATH, np.arange(3))",
    "np.savetxt": "np.savetxt(PATH, np.arange(3))",
    "np.memmap w+": "np.memmap(PATH, dtype=np.uint8, mode='w+', shape=(16,))",
    "DataFrame.to_csv": "pd.DataFrame({'a': [1]}).to_csv(PATH)",
    "DataFrame.to_pickle": "pd.DataFrame({'a': [1]}).to_pickle(PATH)",
    "ndarray.tofile": "np.arange(3).tofile(PATH)",
}


@pytest.mark.parametrize("writer", list(WRITES))
def test_library_writes_create_nothing(unguarded, tmp_path, writer):
    """Writing beside an existing file, and over it: refused, the file keeps its bytes, nothing
    appears in its directory."""
    keep = tmp_path / "keep.npy"
    keep.write_bytes(b"keep")
    for path in (tmp_path / "planted.out", keep):
        observation = unguarded.run_code(f"PATH = {str(path)!r}\n" + WRITES[writer])
        assert re.match(r"(PermissionError|OSError|SystemError): ", observation), (path, observation)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.npy"]
    assert keep.read_bytes() == b"keep"


class _Recorder(http.server.BaseHTTPRequestHandler):
    requests: ClassVar[list[str]] = []

    def do_GET(self):
        self.requests.append(self.path)
        body = b"a,b\n1,2\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_library_network_reads_reach_nothing(unguarded):
    """pandas and numpy read URLs: a real server on 127.0.0.1 (reachable from this process) gets no
    request; the observation is an error."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/data.csv"
    try:
        from urllib.request import urlopen

        with urlopen(url, timeout=10) as reply:  # the server answers this process
            assert reply.read() == b"a,b\n1,2\n"
        _Recorder.requests.clear()
        for code in (f"pd.read_csv({url!r})", f"np.loadtxt({url!r}, delimiter=',', skiprows=1)"):
            observation = unguarded.run_code(code)
            assert not observation.startswith(("   a", "array")), observation
            assert "Error" in observation.split(":")[0], observation
            raw = f"_s = _socket.socket()\n_s.connect(('127.0.0.1', {server.server_address[1]}))"
            assert unguarded.run_code(raw).startswith("PermissionError"), raw
        assert _Recorder.requests == []
    finally:
        server.shutdown()
        server.server_close()


def test_numpy_allocations_stay_within_the_memory_limit(database):
    """A huge np.zeros and a huge pandas frame fail cleanly with MemoryError observations, the
    variables survive, and an allocation within the budget still works."""
    with EventDatabase(database, code_libraries=("numpy", "pandas")).environment(CUTOFF_QUERY) as env:
        assert env.run_code(IMPORTS + "kept = 41", memory_mb=512) == ""
        huge = env.run_code("np.zeros(2**40)", memory_mb=512)
        assert huge.startswith("MemoryError: Unable to allocate 8.00 TiB"), huge
        over = env.run_code("a = np.ones(100 * 2**20)", memory_mb=512)  # 800 MiB of touched pages
        assert over.startswith("MemoryError"), over
        frame = env.run_code("pd.DataFrame(np.empty((10**5, 10**4)))", memory_mb=512)
        assert frame.startswith("MemoryError"), frame
        assert env.run_code("kept + 1\n", memory_mb=512).strip() == "42"
        assert env.run_code("int(np.ones(20 * 2**20).sum())", memory_mb=512).strip() == str(20 * 2**20)


def test_libraries_are_loaded_only_when_asked_for(database):
    """By default a sandbox loads none (each costs start time): importing one is refused with a
    message saying it is not loaded; a name outside LIBRARIES is an error before any process."""
    with EventDatabase(database).environment(CUTOFF_QUERY) as env:
        for name in ("numpy", "pandas"):
            refused = env.run_code(f"import {name}")
            assert refused.startswith(f"ImportError: import of '{name}' is not allowed in the sandbox (not loaded"), (
                refused
            )
        assert env.sandbox_report["libraries"] == "none"
    with pytest.raises(ValueError, match="unknown sandbox libraries \\['torch'\\]"):
        Sandbox(None, libraries=("numpy", "torch"))


# networkx and scikit-learn are not dependencies: what an agent does with them, run when installed.
OPTIONAL_USE = {
    "networkx": (
        "import networkx as nx\n"
        "G = nx.DiGraph((e.head_entity.code, e.tail_entity.code) for e in get_events())\n"
        "print(G.number_of_edges() > 0, len(nx.degree_centrality(G)) == G.number_of_nodes(),"
        " len(nx.betweenness_centrality(G)) == G.number_of_nodes())"
    ),
    "sklearn": (
        "import numpy as np\nfrom sklearn.linear_model import LogisticRegression\n"
        "from sklearn.feature_extraction.text import TfidfVectorizer\n"
        "X = np.random.default_rng(0).normal(size=(40, 3))\ny = (X[:, 0] > 0).astype(int)\n"
        "print(LogisticRegression().fit(X, y).score(X, y) > 0.9, TfidfVectorizer().fit_transform("
        "[title for _, title in get_news_articles()]).shape[0] > 0, 'C' in LogisticRegression().get_params())"
    ),
}
OPTIONAL_READS = {
    "networkx": "import networkx as nx\nnx.read_edgelist(PATH)",
    "sklearn": "import sklearn\nsklearn.feature_extraction.text.TfidfVectorizer(input='filename').fit([PATH])",
}


@pytest.mark.parametrize("name", list(OPTIONAL_USE))
def test_an_installed_optional_library_works_and_reads_no_file(database, name):
    if importlib.util.find_spec(name) is None:
        pytest.skip(f"{name} is not installed (not a dependency of this project)")
    libraries = ("numpy", name)
    with EventDatabase(database, code_libraries=libraries).environment(CUTOFF_QUERY) as env:
        assert env.run_code(OPTIONAL_USE[name]).split() == ["True"] * 3
        assert env.run_code(BYPASS).strip() == "guards off"
        path = _paths(database)["a later month"]
        refused = env.run_code(f"PATH = {path!r}\n" + OPTIONAL_READS[name])
        assert refused.startswith("PermissionError: [Errno 1]") and "PAR1" not in refused, refused


@pytest.mark.parametrize("name", list(OPTIONAL_USE))
def test_a_library_that_is_not_installed_is_reported_and_refused(database, name):
    if importlib.util.find_spec(name) is not None:
        pytest.skip(f"{name} is installed here")
    with EventDatabase(database, code_libraries=(name,)).environment(CUTOFF_QUERY) as env:
        assert env.run_code(f"import {name}").startswith("ImportError"), name
        assert env.sandbox_report["libraries"] == f"{name} not installed"
