"""deploy/ without Docker or a cluster: the Dockerfile's instructions, the pinned constraints, and
the instance config in dagster.yaml and the Helm values checked against Dagster's own schema and
against our definitions (pools, schedule names)."""

from __future__ import annotations

import ast
import fnmatch
import json
import re
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from .conftest import ROOT

DEPLOY = ROOT / "deploy"
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
    assert steps[0] == ("FROM", "python:3.11-slim")
    installs = " ".join(a for k, a in steps if k == "RUN" and "pip install" in a)
    assert "-c deploy/constraints.txt" in installs
    assert f"dagster-postgres=={ADDON_VERSION}" in installs and f"dagster-k8s=={ADDON_VERSION}" in installs
    # The add-ons belong to the core release the project pins (1.13.x ↔ 0.29.x, same patch).
    assert _dagster_version().split(".")[2] == ADDON_VERSION.split(".")[2]
    user = [a for k, a in steps if k == "USER"]
    assert user and user[-1].split(":")[0] not in ("0", "root")
    # Nothing runs as root after the switch, and the server is the last word.
    assert kinds.index("USER") > max(i for i, k in enumerate(kinds) if k == "RUN")
    cmd = json.loads(dict(steps)["CMD"])
    assert cmd[:3] == ["dagster", "code-server", "start"] and cmd[cmd.index("-m") + 1] == "definitions"
    assert "3030" in dict(steps)["EXPOSE"] and "grpc-health-check" in dict(steps)["HEALTHCHECK"]


def test_every_copied_path_exists_and_is_in_the_build_context():
    patterns = [p for p in (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines() if p and not p.startswith("#")]

    def included(path: str) -> bool:
        keep = True
        for pattern in patterns:
            negate = pattern.startswith("!")
            if fnmatch.fnmatch(path, pattern.lstrip("!")) or fnmatch.fnmatch(path, pattern.lstrip("!").removesuffix("/**") + "/*"):
                keep = negate
        return keep

    copies = [a.split()[:-1] for k, a in _instructions(DEPLOY / "Dockerfile") if k == "COPY"]
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
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            names += [node.args[0].value for node in [node] if isinstance(node, ast.Call)
                      and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
                      and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)]
            offenders += [f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in names
                          if n.split(".")[0] in ("dagster", "testbed")]
    assert offenders == []


def test_constraints_pin_every_runtime_dependency_within_its_range():
    pins = {}
    for line in (DEPLOY / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            pins[canonicalize_name(name)] = version
    for spec in [*_pyproject()["project"]["dependencies"], f"dagster-postgres=={ADDON_VERSION}"]:
        requirement = Requirement(spec)
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{name} is not pinned: run deploy/pin_constraints.py"
        assert requirement.specifier.contains(pins[name], prereleases=True), f"{name}=={pins[name]} vs {requirement.specifier}"


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
    assert _project_pools() == {"gdelt_http", "article_fetch"}
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
    assert deployment["envSecrets"] and not {"MIRAI_ALERT_WEBHOOK_URL", "MIRAI_RELEASE_URI", "AWS_SECRET_ACCESS_KEY"} & env.keys()
    _validate_instance_config(values["additionalInstanceConfig"])
    _check_limits(values["additionalInstanceConfig"]["concurrency"], schedule_names)


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
    assert _project_pools() == {"gdelt_http", "article_fetch"}  # default_limit covers both
