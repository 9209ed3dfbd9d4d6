"""The house's layers, read from the code: each package imports only those below it (by the one
import name, ``swarm_queue.X``), and the queue core (worker/, common/) imports no workflow:
it knows batches, jobs and the flows' seam, and a workflow is a folder of flows/ with its
registry line. A wheel puts nothing but ``swarm_queue`` at the top of
site-packages."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "swarm_queue"
# Each package with the packages it may import (its own included).
MAY_IMPORT = {
    "common": {"common"},
    "sim": {"sim", "common"},
    "flows": {"flows", "common"},
    "worker": {"worker", "flows", "common"},
    "tools": {"tools", "common"},
    # The demo starts swarm-sim, the stand-in server; a Python session runs its own tools.
    "producer": {"producer", "worker", "flows", "tools", "sim", "common"},
}


def _sources(*folders: str) -> list[Path]:
    return sorted(p for f in folders for p in (PACKAGE / f).rglob("*.py"))


def _imports(path: Path) -> Iterator[tuple[int, str]]:
    """Every module ``path`` imports by its absolute name, anywhere in it: (line, name)."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module


@pytest.mark.parametrize("package", sorted(MAY_IMPORT))
def test_each_package_imports_only_those_below_it(package: str) -> None:
    wrong = []
    for path in _sources(package):
        for line, name in _imports(path):
            parts = name.split(".")
            if parts[0] in MAY_IMPORT:  # one import name: never the folder's own
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
            elif parts[0] == "swarm_queue":
                # swarm_queue itself is the public API, the producer's face
                top = parts[1] if len(parts) > 1 else "producer"
                if top not in MAY_IMPORT[package]:
                    wrong.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    assert not wrong, "\n".join(wrong)


# arq is the worker's entry (``arq swarm_queue.worker.WorkerSettings``) and nothing more: no
# work goes through arq's queue and no module reads a key of arq's.
ARQ_ENTRY = {"common/arqconf.py", "worker/app.py", "worker/main.py"}


def test_only_the_worker_entry_imports_arq() -> None:
    wrong = [
        f"{path.relative_to(PACKAGE).as_posix()}:{line} imports {name}"
        for path in _sources(".")
        for line, name in _imports(path)
        if name.split(".")[0] == "arq" and path.relative_to(PACKAGE).as_posix() not in ARQ_ENTRY
    ]
    assert not wrong, "\n".join(wrong)


def _module_of(path: Path) -> str:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(("swarm_queue", *parts[: -1 if parts[-1] == "__init__" else None]))


def _imports_at_load(path: Path) -> set[str]:
    """The swarm_queue modules ``path`` imports as it loads: at its top level (an import inside
    a function, or under ``if TYPE_CHECKING``, runs later or never)."""
    out: set[str] = set()
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("swarm_queue.")}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("swarm_queue."):
            out.add(str(node.module))
    return out


def test_no_module_imports_itself_in_a_circle() -> None:
    """No circle of imports between modules (within a package too: the layers alone allow
    one), which would make a module's names depend on which of the circle loads first."""
    graph = {_module_of(p): _imports_at_load(p) for p in _sources(*MAY_IMPORT)}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    circles: list[str] = []

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for dep in sorted(graph.get(module, ())):
            if dep not in graph:
                continue
            if state.get(dep) == 1:
                circles.append(" -> ".join([*path[path.index(dep) :], dep]))
            elif dep not in state:
                visit(dep, [*path, dep])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert len(graph) > 100 and not circles, "\n".join(circles)


# The flows' seam, which the worker's pumps run without naming any flow: the base and the
# registry. Every other module of flows/ belongs to one workflow's folder.
FLOW_SEAM = {"swarm_queue.flows", "swarm_queue.flows.flow", "swarm_queue.flows.registry"}


def _workflows() -> list[str]:
    """The workflows' folders: each package under flows/."""
    return sorted(p.parent.name for p in (PACKAGE / "flows").glob("*/__init__.py"))


def test_the_queue_core_imports_no_workflow() -> None:
    """The drain path (worker/), the store and the models (common/) know batches, jobs and the
    flows' seam: no module of theirs imports a workflow's folder, or any part of flows/ but
    the seam."""
    assert {"agents", "pipeline", "reduce"} <= set(_workflows())
    wrong = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for path in _sources("worker", "common")
        for line, name in _imports(path)
        if name.startswith("swarm_queue.flows") and name not in FLOW_SEAM
    ]
    assert not wrong, "\n".join(wrong)


def test_each_workflow_is_a_folder_of_flows_and_nothing_else_is() -> None:
    """flows/ holds the seam, the later steps as the commands speak of them, and one folder
    per workflow: a new workflow is one folder and its registry line."""
    loose = {p.name for p in (PACKAGE / "flows").glob("*.py")}
    assert loose == {"__init__.py", "flow.py", "registry.py", "steps.py"}, loose


@pytest.mark.slow
def test_a_wheel_puts_one_import_name_in_site_packages(tmp_path: Path) -> None:
    """Built and installed as a user's pip does: the top of site-packages holds swarm_queue
    (and its metadata) alone, the commands run its modules, and its public API imports there
    (not from this checkout)."""
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", tmp_path / "w", ROOT],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "w").glob("swarm_queue-*.whl")
    site = tmp_path / "site"
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", site, wheel],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert installed.returncode == 0, installed.stderr
    tops = {p.name for p in site.iterdir() if not p.name.endswith(".dist-info")}
    assert tops == {"swarm_queue", "bin"}, tops
    scripts = {p.name for p in (site / "bin").iterdir()}
    assert {"swarm-enqueue", "swarm-worker", "swarm-collect", "swarm-sim"} <= scripts
    with zipfile.ZipFile(wheel) as z:
        entry = z.read(next(n for n in z.namelist() if n.endswith("entry_points.txt"))).decode()
        assert {n.split("/")[1] for n in z.namelist() if n.startswith("swarm_queue/")} >= {
            "common", "flows", "producer", "sim", "tools", "worker"
        }  # fmt: skip
    targets = [ln.split("=", 1)[1].strip() for ln in entry.splitlines() if "=" in ln]
    assert targets and all(t.startswith("swarm_queue.") for t in targets), targets
    probe = (
        "import swarm_queue, swarm_queue.common.store as s; print(swarm_queue.Swarm, s.__file__)"
    )
    ran = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(site)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ran.returncode == 0, ran.stderr
    assert "swarm_queue.producer.api.Swarm" in ran.stdout and str(site) in ran.stdout


def test_the_repository_holds_no_symlink() -> None:
    """One path per file: a checkout without symlinks (Windows' default) is whole, and editors,
    debuggers and coverage see each module once."""
    listed = subprocess.run(
        ["git", "ls-files", "-s"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    links = [line.split("\t", 1)[1] for line in listed.splitlines() if line.startswith("120000")]
    assert links == []


@pytest.mark.slow
def test_an_sdist_installs_the_whole_package(tmp_path: Path) -> None:
    """The source distribution pip builds from holds every module and data file: installed
    from it, the store's Lua scripts and the dashboard's page are there, and py.typed."""
    made = subprocess.run(  # (in an isolated environment, with the backend pyproject names)
        [sys.executable, "-m", "build", "--sdist", "--outdir", tmp_path / "d", ROOT],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    (sdist,) = (tmp_path / "d").glob("swarm_queue-*.tar.gz")
    site = tmp_path / "site"
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", site, sdist],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr
    package = site / "swarm_queue"
    assert (package / "py.typed").is_file()
    assert (package / "common" / "store" / "lua" / "commit.lua").is_file()
    assert (package / "common" / "store" / "lua" / "lib" / "jobs.lua").is_file()
    assert (package / "producer" / "dashboard.html").is_file()
    ours = {p.relative_to(PACKAGE) for p in PACKAGE.rglob("*.py")}
    theirs = {p.relative_to(package) for p in package.rglob("*.py")}
    assert ours <= theirs, sorted(map(str, ours - theirs))[:10]


def test_the_public_api_is_typed_for_users() -> None:
    """Every name of ``swarm_queue.__all__`` is imported where a type checker reads it, so a
    user's ``swarm_queue.Swarm`` is the class, not ``Any``; and the package says it is typed."""
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    checked = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING":
            for sub in ast.walk(node):
                if isinstance(sub, ast.ImportFrom):
                    checked |= {a.asname or a.name for a in sub.names}
    import swarm_queue

    assert set(swarm_queue.__all__) <= checked
    assert (PACKAGE / "py.typed").is_file()


def test_no_product_module_is_over_450_lines() -> None:
    """One concern a module: a module past 450 lines holds more than one (house style)."""
    long = [
        f"{p.relative_to(ROOT)}: {n} lines"
        for p in sorted(PACKAGE.rglob("*.py"))
        if (n := len(p.read_text().splitlines())) > 450
    ]
    assert not long, "\n".join(long)


def test_the_architecture_page_names_every_module_and_only_files_that_exist() -> None:
    """docs/ARCHITECTURE.md read against the code: each product module named (by its path, or
    by its name within a room's row where no other module has that name), each ``.py``/``.lua``
    it names present."""
    doc = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    named = set(re.findall(r"`([^`\s]+\.(?:py|lua))`", doc))
    present = {p.name for p in PACKAGE.rglob("*") if p.suffix in (".py", ".lua")}
    present |= {p.name for p in (ROOT / "tests").rglob("*.py")}
    present |= {p.name for p in (ROOT / "bench").rglob("*.py")}
    gone = sorted(n for n in named if "*" not in n and Path(n).name not in present)
    gone += sorted(n for n in named if "/" in n and "*" not in n and not _exists(n))
    modules = [p for p in PACKAGE.rglob("*.py") if p.name not in ("__init__.py", "__main__.py")]
    names = [p.name for p in modules]
    paths = [n for n in named if "/" in n]
    unnamed = sorted(
        str(p.relative_to(ROOT))
        for p in modules
        if not any(("/" + p.relative_to(ROOT).as_posix()).endswith("/" + n) for n in paths)
        and not (p.name in named and names.count(p.name) == 1)
    )
    assert not gone and not unnamed, f"named but gone: {gone}; not named: {unnamed}"


def _exists(named: str) -> bool:
    """Whether a path the page names is a file: from the repository's top, or from a room
    (``worker/app.py``, ``lua/commit.lua``)."""
    return (ROOT / named).is_file() or any(
        p.as_posix().endswith("/" + named) for p in PACKAGE.rglob(Path(named).name)
    )
