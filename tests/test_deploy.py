"""deploy/ without Docker or a cluster: the Dockerfile's instructions, the one lock every install
path uses (and the test venv matches), every imported package declared, and the instance config in
dagster.yaml and the Helm values checked against Dagster's own schema and against our definitions
(pools, schedule names)."""

from __future__ import annotations

import ast
import fnmatch
import importlib.metadata as metadata
import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, canonicalize_version

from .conftest import ROOT

DEPLOY = ROOT / "deploy"
LOCK = ROOT / "requirements.lock"
ADDON_VERSION = "0.29.27"


def _instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and heredoc bodies skipped."""
    out: list[tuple[str, str]] = []
    lines = iter(dockerfile.read_text().splitlines())
    for line in lines:
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        while line.endswith("\\"):
            line = line[:-1] + " " + next(lines).strip()
        keyword, _, args = line.strip().partition(" ")
        if heredoc := re.search(r"<<-?'?(\w+)'?", args):
            for body in lines:
                if body.strip() == heredoc.group(1):
                    break
        out.append((keyword.upper(), args.strip()))
    return out


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _dagster_version() -> str:
    [pin] = [r for r in _pyproject()["project"]["dependencies"] if Requirement(r).name == "dagster"]
    return str(Requirement(pin).specifier).removeprefix("==")


def test_dockerfile_builds_a_pinned_non_root_code_server():
    steps = _instructions(DEPLOY / "Dockerfile")
    kinds = [k for k, _ in steps]
    # llama.cpp is compiled in a stage of its own; the image is the last stage, with no compiler.
    assert [a for k, a in steps if k == "FROM"] == ["python:3.11-slim AS llama-build", "python:3.11-slim"]
    installs = [a for k, a in steps if k == "RUN" and "pip install" in a]
    # Every install holds to the lock, or installs no dependency at all (our own packages, last).
    assert installs and all("-c requirements.lock" in a or "--no-deps" in a for a in installs), installs
    assert any("requirements.lock" in a.split() for k, a in steps if k == "COPY")
    # The heredoc (skipped by _instructions) lists the runtime dependencies, the `deploy` extra and
    # the `gguf` extra (llama-cpp-python's server, around the wheel the build stage compiled).
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert 'project["dependencies"] + extras["deploy"] + extras["gguf"]' in dockerfile
    assert _extras()["gguf"] == ["llama-cpp-python[server]>=0.3.36,<0.4", "uvicorn>=0.22"]
    deploy_extra = {Requirement(r).name: str(Requirement(r).specifier) for r in _extras()["deploy"]}
    assert deploy_extra == {"dagster-postgres": f"=={ADDON_VERSION}", "dagster-k8s": f"=={ADDON_VERSION}"}
    # The add-ons belong to the core release the project pins (1.13.x ↔ 0.29.x, same patch).
    assert _dagster_version().split(".")[2] == ADDON_VERSION.split(".")[2]
    user = [a for k, a in steps if k == "USER"]
    assert user and user[-1].split(":")[0] not in ("0", "root")
    # Nothing runs as root after the switch, and the server is the last word.
    assert kinds.index("USER") > max(i for i, k in enumerate(kinds) if k == "RUN")
    cmd = json.loads(dict(steps)["CMD"])
    assert cmd[:3] == ["dagster", "code-server", "start"] and cmd[cmd.index("-m") + 1] == "definitions"
    assert "3030" in dict(steps)["EXPOSE"] and "grpc-health-check" in dict(steps)["HEALTHCHECK"]


def test_llama_cpp_is_built_for_a_portable_cpu_target_everywhere():
    """`make test` and the image build llama.cpp with deploy/llama-cpu.cmake: no instruction set
    beyond x86-64-v3, never the build machine's own (GGML_NATIVE), so a build works on every CPU
    of our machine kind. The installed build says so in its system info (this machine has AVX-512:
    a native build would list it)."""
    cache = dict(re.findall(r"^set\((GGML_\w+) (ON|OFF) CACHE BOOL", (DEPLOY / "llama-cpu.cmake").read_text(), re.M))
    assert cache["GGML_NATIVE"] == "OFF"
    assert {cache[f] for f in ("GGML_AVX", "GGML_AVX2", "GGML_FMA", "GGML_F16C", "GGML_BMI2")} == {"ON"}
    assert {v for k, v in cache.items() if "AVX512" in k or "AMX" in k or "VNNI" in k} == {"OFF"}
    makefile = (ROOT / "Makefile").read_text()
    assert "LLAMA_CMAKE_ARGS ?= -C $(CURDIR)/deploy/llama-cpu.cmake" in makefile
    assert 'CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)"' in makefile and "--no-binary llama-cpp-python" in makefile
    steps = _instructions(DEPLOY / "Dockerfile")
    assert ("ARG", 'LLAMA_CMAKE_ARGS="-C /build/llama-cpu.cmake"') in steps
    assert any(
        'CMAKE_ARGS="$LLAMA_CMAKE_ARGS" pip wheel' in a and "--no-binary llama-cpp-python" in a for k, a in steps
    )
    llama_cpp = pytest.importorskip("llama_cpp")
    system_info = llama_cpp.llama_print_system_info().decode()
    assert "AVX2 = 1" in system_info
    assert not re.search(r"(AVX512\w*|AMX\w*|AVX_VNNI) = 1", system_info), system_info


def test_every_copied_path_exists_and_is_in_the_build_context():
    patterns = [p for p in (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines() if p and not p.startswith("#")]

    def included(path: str) -> bool:
        keep = True
        for pattern in patterns:
            negate = pattern.startswith("!")
            if fnmatch.fnmatch(path, pattern.lstrip("!")) or fnmatch.fnmatch(
                path, pattern.lstrip("!").removesuffix("/**") + "/*"
            ):
                keep = negate
        return keep

    copies = [
        a.split()[:-1] for k, a in _instructions(DEPLOY / "Dockerfile") if k == "COPY" and not a.startswith("--from=")
    ]
    sources = [s for srcs in copies for s in srcs]
    assert "pipeline" in sources and "definitions.py" in sources
    for source in sources:
        assert (ROOT / source).exists(), source
        probe = source if (ROOT / source).is_file() else f"{source}/__init__.py"
        assert included(probe), f"{probe} is excluded from the build context"
    # Every library package and module is copied into the image; the demo's and tests' stand-ins
    # (testbed/) are not.
    found = {p.split(".")[0] for p in _pyproject()["tool"]["setuptools"]["packages"]["find"]["include"]}
    assert "testbed" in found and "testbed" not in sources
    assert (found - {"testbed"}) | {f"{m}.py" for m in _pyproject()["tool"]["setuptools"]["py-modules"]} <= set(sources)


def test_the_library_imports_neither_dagster_nor_the_testbed():
    """pipeline/ is the domain core (plain Python, polars, pyarrow): Dagster stays in assets/,
    sensors/ and quality/, and testbed/ is not in the image, so the library must not need it."""
    offenders = []
    for path in sorted((ROOT / "pipeline").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            names += [
                node.args[0].value
                for node in [node]
                if isinstance(node, ast.Call)
                and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ]
            offenders += [
                f"{path.relative_to(ROOT)}:{node.lineno} {n}"
                for n in names
                if n.split(".")[0] in ("dagster", "testbed")
            ]
    assert offenders == []


def _extras() -> dict[str, list[str]]:
    return _pyproject()["project"]["optional-dependencies"]


def _locked() -> dict[str, Requirement]:
    """requirements.lock's pins by canonical name (uv writes `name==version ; marker` lines)."""
    pins = {}
    for line in LOCK.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            requirement = Requirement(line)
            pins[canonicalize_name(requirement.name)] = requirement
    return pins


def _pinned_version(requirement: Requirement) -> str:
    [spec] = requirement.specifier
    assert spec.operator == "==" and "*" not in spec.version, f"{requirement} is not an exact pin"
    return spec.version


@pytest.mark.parametrize("target", ["setup", "demo", "test"])
def test_every_make_install_uses_the_lock(target, tmp_path):
    """What `make TARGET` would run on a fresh machine (make -n with a venv that does not exist yet):
    every pip install holds to the lock, the project comes with its extras, and for `make test` (CI)
    ruff checks and format-checks before pytest."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed (the README's commands need it)")
    dry = subprocess.run(
        ["make", "-n", "-C", str(ROOT), target, f"VENV={tmp_path / 'venv'}"], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    installs = [line for line in dry if " install " in line and "/pip " in line]
    assert installs and all("-c requirements.lock" in line for line in installs), installs
    [project] = [line for line in installs if " -e " in line]
    extras = set(re.search(r"'\.\[([^]]*)\]'", project).group(1).split(","))
    # The demo needs its S3 server; the tests (CI) install every extra, so the venv they run in
    # holds every package the image holds, at the same versions.
    assert extras == (set(_extras()) if target == "test" else {"demo"})
    if target == "test":
        steps = [
            next(i for i, line in enumerate(dry) if marker in line)
            for marker in ("ruff check .", "ruff format --check .", "-m pytest")
        ]
        assert steps == sorted(steps), dry
        # What they enforce: at least pycodestyle's errors, pyflakes, isort, pyupgrade and bugbear.
        assert {"E4", "E7", "E9", "F", "I", "UP", "B"} <= set(_pyproject()["tool"]["ruff"]["lint"]["select"])
    assert "make test" in (ROOT / ".ci" / "run").read_text().splitlines()


def test_the_lock_pins_every_dependency_and_extra_within_its_range():
    pins = _locked()
    declared = [*_pyproject()["project"]["dependencies"], *(r for extra in _extras().values() for r in extra)]
    for spec in declared:
        requirement = Requirement(spec)
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{name} is declared in pyproject.toml but not locked: run `make lock`"
        version = _pinned_version(pins[name])
        assert requirement.specifier.contains(version, prereleases=True), (
            f"{name}=={version} vs {requirement.specifier}: run `make lock`"
        )
    # One Dagster release train: the core's packages at the core's version, the add-ons (0.x) at
    # the same patch (1.13.27 ↔ 0.29.27).
    core = _dagster_version()
    for name in [n for n in pins if n == "dagster" or n.startswith("dagster-")]:
        version = _pinned_version(pins[name])
        assert version == core or (version.startswith("0.") and version.split(".")[2] == core.split(".")[2]), (
            name,
            version,
        )


def test_the_test_venv_runs_exactly_the_locked_versions():
    """Tested equals deployed: every locked package that applies here is installed at its locked
    version (`make test` installs every extra with -c requirements.lock). Packages installed but
    not locked are left alone (uv, which only `make lock` uses)."""
    mismatched, missing = [], []
    for name, requirement in _locked().items():
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue
        locked = _pinned_version(requirement)
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            missing.append(name)
            continue
        if canonicalize_version(installed) != canonicalize_version(locked):
            mismatched.append(f"{name}: installed {installed}, locked {locked}")
    assert (missing, mismatched) == ([], []), (
        "the venv differs from requirements.lock: run `make test-setup` (or `make lock` after a pyproject change)"
    )


# Where our code lives. Their names, the root's modules and a file's siblings (bench/'s scripts
# import bench/common.py as `common`) are our own imports, not a distribution's.
IMPORT_ROOTS = ["pipeline", "assets", "sensors", "quality", "testbed", "tests", "bench"]
# The modules the image ships (deploy/Dockerfile): these may import at module level only what the
# runtime dependencies install, not an extra.
LIBRARY_ROOTS = ["pipeline", "assets", "sensors", "quality"]
_IMPORTERS = {"import_module", "importorskip", "find_spec"}


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(top-level module name, imported at module level) of each absolute import in a file,
    including `importlib.import_module`, `importlib.util.find_spec` and `pytest.importorskip` of a
    constant name."""
    tree = ast.parse(path.read_text(), str(path))
    in_function: set[ast.AST] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            in_function.update(n for n in ast.walk(node) if n is not node)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", None)) in _IMPORTERS
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            names = [node.args[0].value]
        else:
            continue
        found += [(name.split(".")[0], node not in in_function) for name in names]
    return found


def test_every_directly_imported_package_is_declared():
    """Each third-party module our code imports is installed by a dependency pyproject.toml declares
    (not merely by some other package's dependency), and the image's modules import at module level
    only what the runtime dependencies declare."""
    project = _pyproject()["project"]
    runtime = {canonicalize_name(Requirement(r).name) for r in project["dependencies"]}
    declared = runtime | {canonicalize_name(Requirement(r).name) for extra in _extras().values() for r in extra}
    providers = metadata.packages_distributions()
    own = {
        *IMPORT_ROOTS,
        *(p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()),
        *(p.stem for p in ROOT.glob("*.py")),
    }
    undeclared, not_runtime = [], []
    files = [p for root in IMPORT_ROOTS for p in sorted((ROOT / root).rglob("*.py"))] + sorted(ROOT.glob("*.py"))
    assert len(files) > 100
    for path in files:
        siblings = {p.stem for p in path.parent.glob("*.py")}
        library = path.parent == ROOT or path.relative_to(ROOT).parts[0] in LIBRARY_ROOTS
        for module, top_level in sorted(set(_imports(path))):
            if module in sys.stdlib_module_names or module in own or module in siblings:
                continue
            dists = {canonicalize_name(d) for d in providers.get(module, [])}
            where = f"{path.relative_to(ROOT)}: {module} ({', '.join(sorted(dists)) or 'no installed distribution'})"
            if not dists & declared:
                undeclared.append(where)
            elif library and top_level and not dists & runtime:
                not_runtime.append(where)
    assert not undeclared, "declare these in pyproject.toml (and run `make lock`):\n" + "\n".join(undeclared)
    assert not not_runtime, (
        "the image installs only the runtime dependencies: import these lazily or declare them "
        "there:\n" + "\n".join(not_runtime)
    )


def _validate_instance_config(config: dict) -> None:
    from dagster._config import process_config
    from dagster._core.instance.config import dagster_instance_config_schema, validate_concurrency_config

    result = process_config(dagster_instance_config_schema(), config)
    assert result.success, [e.message for e in result.errors]
    validate_concurrency_config(config)


def _project_pools() -> set[str]:
    from definitions import defs

    graph = defs.resolve_asset_graph()
    return set().union(*(graph.get(key).pools for key in graph.materializable_asset_keys))


@pytest.fixture(scope="module")
def schedule_names() -> set[str]:
    from definitions import defs

    return {s.name for s in defs.get_repository_def().schedule_defs}


def _check_limits(concurrency: dict, schedule_names: set[str]) -> None:
    assert concurrency["pools"]["default_limit"] == 1
    limits = concurrency["runs"]["tag_concurrency_limits"]
    # Backfills together never take every slot: the live schedule always finds one.
    [backfill] = [t["limit"] for t in limits if t["key"] == "dagster/backfill" and "value" not in t]
    assert backfill < concurrency["runs"]["max_concurrent_runs"]
    limited = {t["value"] for t in limits if t["key"] == "dagster/schedule_name"}
    assert limited and limited <= schedule_names, limited - schedule_names


def test_dagster_yaml_is_valid_instance_config_for_our_pools_and_schedules(schedule_names, monkeypatch):
    for name in ("HOST", "PORT", "DB", "USERNAME", "PASSWORD"):
        monkeypatch.setenv(f"DAGSTER_PG_{name}", "5432" if name == "PORT" else "x")
    config = yaml.safe_load((DEPLOY / "dagster.yaml").read_text())
    _validate_instance_config(config)
    assert config["storage"]["postgres"]["postgres_db"]["password"] == {"env": "DAGSTER_PG_PASSWORD"}
    assert config["telemetry"] == {"enabled": False} and config["run_monitoring"]["enabled"]
    _check_limits(config["concurrency"], schedule_names)
    # A new pool must come with a decision about its limit (here and in docs/deploy.md).
    assert _project_pools() == {"gdelt_http", "article_fetch", "agent_evaluation"}
    deploy_doc = (ROOT / "docs" / "deploy.md").read_text()
    assert all(f"`{pool}`" in deploy_doc for pool in _project_pools())


def test_helm_values_run_our_image_with_the_k8s_run_launcher(schedule_names):
    values = yaml.safe_load((DEPLOY / "helm" / "values.yaml").read_text())
    [deployment] = values["dagster-user-deployments"]["deployments"]
    args = deployment["dagsterApiGrpcArgs"]
    assert args[args.index("--module-name") + 1] == "definitions" and deployment["port"] == 3030
    assert deployment["includeConfigInLaunchedRuns"]["enabled"]
    assert values["runLauncher"]["type"] == "K8sRunLauncher" and values["dagsterDaemon"]["enabled"]
    assert values["dagsterDaemon"]["runCoordinator"]["type"] == "QueuedRunCoordinator"
    assert values["postgresql"]["postgresqlScheme"] == "postgresql+psycopg2" and values["telemetry"]["enabled"] is False
    # The data directory every run pod shares is mounted where MIRAI_DATA_DIR points.
    env = {e["name"]: e.get("value") for e in deployment["env"]}
    assert {m["mountPath"] for m in deployment["volumeMounts"]} == {env["MIRAI_DATA_DIR"]}
    # Secrets come from a Secret, never from values (which end up in the release's ConfigMaps).
    assert (
        deployment["envSecrets"]
        and not {"MIRAI_ALERT_WEBHOOK_URL", "MIRAI_RELEASE_URI", "AWS_SECRET_ACCESS_KEY"} & env.keys()
    )
    _validate_instance_config(values["additionalInstanceConfig"])
    _check_limits(values["additionalInstanceConfig"]["concurrency"], schedule_names)


def test_only_the_webserver_and_the_daemon_reach_the_code_server():
    """Issue 30: the code server's unauthenticated gRPC listened on 0.0.0.0:3030 with no
    NetworkPolicy. It listens on the pod's address (a later --host than the chart's `-h 0.0.0.0`,
    its readiness probe asking there), and deploy/helm/networkpolicy.yaml admits only the chart's
    webserver and daemon pods, on 3030."""
    values = yaml.safe_load((DEPLOY / "helm" / "values.yaml").read_text())
    [deployment] = values["dagster-user-deployments"]["deployments"]
    args = deployment["dagsterApiGrpcArgs"]
    assert args[args.index("--host") + 1] == "$(POD_IP)" and "-h" not in args
    [pod_ip] = [e for e in deployment["env"] if e["name"] == "POD_IP"]
    assert pod_ip["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    probe = " ".join(deployment["readinessProbe"]["exec"]["command"])
    assert 'grpc-health-check -p 3030 -h "$POD_IP"' in probe
    policy = yaml.safe_load((DEPLOY / "helm" / "networkpolicy.yaml").read_text())
    assert policy["kind"] == "NetworkPolicy" and policy["apiVersion"] == "networking.k8s.io/v1"
    spec = policy["spec"]
    assert spec["podSelector"]["matchLabels"] == {"component": "user-deployments", "deployment": deployment["name"]}
    assert spec["policyTypes"] == ["Ingress"]
    [rule] = spec["ingress"]
    [source] = rule["from"]
    assert set(source) == {"podSelector"}  # pods of this namespace only: no namespaceSelector, no ipBlock
    [expression] = source["podSelector"]["matchExpressions"]
    assert expression["key"] == "component" and expression["operator"] == "In"
    assert set(expression["values"]) == {"dagster-webserver", "dagster-webserver-read-only", "dagster-daemon"}
    assert rule["ports"] == [{"protocol": "TCP", "port": deployment["port"]}]


def test_local_instance_yaml_limits_the_pools_and_sends_nothing(tmp_path):
    """deploy/dagster-local.yaml, the instance of `mirai demo` and of the README's setup (issue 20):
    every pool the assets use gets a limit (the UI warns beside a pool without one), no telemetry,
    no community dialog. Loaded by a real instance, which is what `dagster dev` does."""
    import dagster as dg

    config = yaml.safe_load((DEPLOY / "dagster-local.yaml").read_text())
    _validate_instance_config(config)
    (tmp_path / "dagster.yaml").write_text((DEPLOY / "dagster-local.yaml").read_text())
    with dg.DagsterInstance.from_config(str(tmp_path)) as instance:
        assert instance.get_concurrency_config().pool_config.default_pool_limit == 1
        assert not instance.telemetry_enabled and not instance.nux_enabled
    assert _project_pools() == {"gdelt_http", "article_fetch", "agent_evaluation"}  # default_limit covers both
