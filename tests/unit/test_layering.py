"""Layering rules of the source tree (docs/architecture.md).

Goal: the tree keeps the architecture it shows. The pure core stays pure, the engine
reaches the world only through the ``Env`` seam, imports point one way (core <- engine <-
backends <- runtime <- the ``deferq`` facade <- cli), nothing of the library imports the
crash simulator, the power harness or the demos (the CLI loads them in the handler of
their own command), and no module takes part in an import cycle.

Method: parse each module's imports with ``ast`` (every import, also those inside
functions, but not those under ``if TYPE_CHECKING:``, which only mypy runs) and compare
them with the rules below; then import the library and run an
operator command in fresh interpreters and list the modules they loaded.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = SRC / "deferq"

# The layers of the library, lowest first; a module may import its own layer and lower ones.
LAYERS = ("deferq._core", "deferq._engine", "deferq.backends", "deferq._runtime", "deferq",
          "deferq.integrations", "deferq.testing", "deferq._cli")
# Tools around the library: they may import any of it; the library never imports them,
# except that the CLI modules named in LAZY_TOOL_IMPORTS load them inside a handler.
TOOLS = ("deferq.crashtest", "deferq.powertest", "deferq._demos", "deferq.conformance")
LAZY_TOOL_IMPORTS = {
    "deferq._cli.crash": "deferq.crashtest",
    "deferq._cli.power": "deferq.powertest",
    "deferq._cli.demos": "deferq._demos",
    "deferq._cli.conformance": "deferq.conformance",
}
# Modules that reach the world: the pure core imports none of them, the engine only
# through its one OS adapter.
WORLD = {"os", "io", "fcntl", "time", "random", "pathlib", "shutil", "tempfile", "socket",
         "subprocess", "signal", "mmap", "glob", "posix", "datetime", "secrets"}
CORE_ALSO_FORBIDDEN = {"threading", "logging", "asyncio"}
ENGINE_OS_ADAPTER = "deferq._engine.osenv"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _resolve(name: str) -> str:
    """The deferq module an imported name refers to (``from a.b import c``: ``a.b.c`` when
    that is a module, else ``a.b``)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def _runtime_nodes(body: list[ast.stmt], *, top_level_only: bool) -> list[ast.AST]:
    """The statements of ``body`` and, unless ``top_level_only``, every node nested in them,
    leaving out ``if TYPE_CHECKING:`` blocks: imports that only mypy runs are not edges."""
    out: list[ast.AST] = []
    for node in body:
        if (isinstance(node, ast.If) and isinstance(node.test, ast.Name)
                and node.test.id == "TYPE_CHECKING"):
            out.extend(_runtime_nodes(node.orelse, top_level_only=top_level_only))
            continue
        if top_level_only:
            out.append(node)
            continue
        stack: list[ast.AST] = [node]
        while stack:
            current = stack.pop()
            out.append(current)
            for child in ast.iter_child_nodes(current):
                if isinstance(child, ast.If) and isinstance(child.test, ast.Name) \
                        and child.test.id == "TYPE_CHECKING":
                    stack.extend(child.orelse)
                else:
                    stack.append(child)
    return out


def imports(module: str, *, top_level_only: bool = False) -> set[str]:
    """Every name ``module`` imports at run time (at load or inside a function): stdlib
    roots as written, deferq modules resolved."""
    tree = ast.parse(MODULES[module].read_text())
    nodes = _runtime_nodes(tree.body, top_level_only=top_level_only)
    out: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            out.update(_resolve(a.name) if a.name.startswith("deferq") else a.name
                       for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.startswith("deferq"):
                out.update(_resolve(f"{node.module}.{a.name}") for a in node.names)
            else:
                out.add(node.module)
    out.discard(module)
    return out


def layer_of(module: str) -> str | None:
    """The library layer or tool a module belongs to (the longest matching prefix)."""
    if module == "deferq.__main__":
        return "deferq._cli"  # ``python -m deferq`` is the command line
    best = None
    for prefix in (*LAYERS, *TOOLS):
        if module == prefix or module.startswith(prefix + "."):
            if best is None or len(prefix) > len(best):
                best = prefix
    return best


def test_every_module_is_in_a_layer_or_a_tool() -> None:
    assert len(MODULES) > 40
    unplaced = [m for m in MODULES if layer_of(m) is None]
    assert unplaced == []
    # The facade layer "deferq" holds only the package itself and its version (read by
    # setuptools at build time, re-exported as deferq.__version__).
    assert [m for m in MODULES if layer_of(m) == "deferq"] == ["deferq", "deferq._version"]


@pytest.mark.parametrize("module", sorted(m for m in MODULES if layer_of(m) in LAYERS))
def test_library_modules_import_only_their_own_layer_and_lower_ones(module: str) -> None:
    own = LAYERS.index(str(layer_of(module)))
    allowed_tool = LAZY_TOOL_IMPORTS.get(module)
    for target in sorted(i for i in imports(module) if i.startswith("deferq")):
        layer = layer_of(target)
        if layer in TOOLS:
            assert layer == allowed_tool, f"{module} imports the tool {target}"
            assert target not in imports(module, top_level_only=True), (
                f"{module} imports {target} at load time; import it in the handler")
            continue
        assert layer is not None and LAYERS.index(layer) <= own, (
            f"{module} ({LAYERS[own]}) imports {target} ({layer}), a higher layer")


@pytest.mark.parametrize("module", sorted(m for m in MODULES if layer_of(m) == "deferq._core"))
def test_the_pure_core_imports_no_io_and_nothing_outside_the_core(module: str) -> None:
    roots = {i.split(".")[0] for i in imports(module) if not i.startswith("deferq")}
    assert not roots & (WORLD | CORE_ALSO_FORBIDDEN), f"{module} imports {roots & WORLD}"
    outside = {i for i in imports(module) if i.startswith("deferq")
               and layer_of(i) != "deferq._core"}
    assert not outside, f"{module} imports {outside}"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if layer_of(m) == "deferq._engine"
                                          and m != ENGINE_OS_ADAPTER))
def test_engine_modules_reach_the_world_only_through_env(module: str) -> None:
    roots = {i.split(".")[0] for i in imports(module) if not i.startswith("deferq")}
    assert not roots & WORLD, f"{module} imports {roots & WORLD}; use the Env seam"
    assert ENGINE_OS_ADAPTER not in imports(module), f"{module} imports the OS adapter"


def test_only_the_os_adapter_and_the_front_ends_import_os() -> None:
    # The OS adapter, option checks (os.PathLike), the command line (it shows files and
    # reads the environment) and the tools (which drive real processes, mounts and ioctls)
    # are around the engine.
    allowed = {ENGINE_OS_ADAPTER, "deferq.backends._options", "deferq.backends.disk",
               "deferq.backends.memory"}
    for module in MODULES:
        if layer_of(module) in (*TOOLS, "deferq._cli"):
            continue
        roots = {i.split(".")[0] for i in imports(module)}
        if roots & {"os", "fcntl"}:
            assert module in allowed, f"{module} imports os/fcntl"


def _cycle() -> list[str] | None:
    graph = {m: sorted(i for i in imports(m) if i in MODULES) for m in MODULES}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in graph[node]:
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for module in graph:
        if module not in state:
            found = visit(module)
            if found:
                return found
    return None


def test_no_module_takes_part_in_an_import_cycle() -> None:
    assert _cycle() is None, " -> ".join(_cycle() or [])


def test_the_cycle_check_finds_a_cycle() -> None:
    # The check above must be able to fail: plant a cycle and see it found.
    original = imports
    try:
        globals()["imports"] = lambda m, **kw: original(m, **kw) | (
            {"deferq._cli.ops"} if m == "deferq._core.limits" else set())
        assert _cycle() is not None
    finally:
        globals()["imports"] = original


_PROBE = """
import json, sys
{setup}
print(json.dumps(sorted(m for m in sys.modules if m.startswith("deferq"))))
"""


def _loaded(setup: str, cwd: Path) -> list[str]:
    result = subprocess.run([sys.executable, "-c", _PROBE.format(setup=setup)], cwd=cwd,
                            capture_output=True, text=True, timeout=60, check=True)
    loaded: list[str] = json.loads(result.stdout.strip().splitlines()[-1])
    return loaded


@pytest.mark.slow
@pytest.mark.parametrize("setup", [
    "import deferq",
    "import deferq.backends",
    "from deferq._cli import main\nmain(['stats', '--path', 'store'])",
    "from deferq._cli import main\nmain(['dead', 'list', '--path', 'store'])",
    "from deferq._cli import main\nmain(['verify', '--path', 'store'])",
    "from deferq._cli import main\nmain(['pending', 'list', '--path', 'store'])",
])
def test_the_library_and_the_operator_commands_load_no_tool(setup: str, tmp_path: Path) -> None:
    from deferq.backends import Disk

    Disk(path=tmp_path / "store").close()
    loaded = _loaded(setup, tmp_path)
    assert "deferq" in loaded
    tools = [m for m in loaded if layer_of(m) in TOOLS]
    assert tools == [], f"{setup!r} loaded {tools}"


# What a reading command has no use for: the queue runtime, the PostgreSQL backend, the
# context codec (pickle), asyncio; and for the dead-task reads, logging until a message
# (stats also scans the WAL files, which log). Each was on `deferq dead list`'s start-up
# before the package and the CLI loaded them on first use (issue #17 item 8).
_NOT_FOR_READS = ("deferq._runtime.queue", "deferq._runtime.serialize", "deferq.backends.postgres",
                  "deferq.backends.disk", "deferq._engine.wal", "asyncio", "pickle", "shutil")

_ALL_MODULES = """
import json, sys
{setup}
print(json.dumps(sorted(sys.modules)))
"""


@pytest.mark.slow
@pytest.mark.parametrize(("setup", "also_not"), [
    ("import deferq", ("logging",)),
    ("from deferq._cli import main\nmain(['stats', '--path', 'store'])", ()),
    ("from deferq._cli import main\nmain(['dead', 'list', '--path', 'store'])", ("logging",)),
    ("from deferq._cli import main\nmain(['dead', 'show', 'x', '--path', 'store'])",
     ("logging",)),
])
def test_the_package_and_the_reading_commands_load_only_what_they_use(
        setup: str, also_not: tuple[str, ...], tmp_path: Path) -> None:
    from deferq.backends import Disk

    Disk(path=tmp_path / "store").close()
    result = subprocess.run([sys.executable, "-c", _ALL_MODULES.format(setup=setup)],
                            cwd=tmp_path, capture_output=True, text=True, timeout=60, check=True)
    loaded = set(json.loads(result.stdout.strip().splitlines()[-1]))
    assert "deferq" in loaded
    assert sorted(loaded.intersection(_NOT_FOR_READS + also_not)) == [], setup
    # The names are still there, loaded on first use.
    import deferq
    assert deferq.Queue.__module__ == "deferq._runtime.queue"
    assert set(dir(deferq)) >= set(deferq.__all__)
    # What this file imports for itself is not shown as the package's (dir, tab completion).
    assert not {"Final", "TYPE_CHECKING", "annotations", "importlib"} & set(dir(deferq))
    import deferq.backends
    assert "backends" in dir(deferq)


@pytest.mark.slow
def test_the_probe_sees_a_tool_when_one_is_loaded(tmp_path: Path) -> None:
    loaded = _loaded("import deferq.crashtest", tmp_path)
    assert "deferq.crashtest" in loaded and layer_of("deferq.crashtest") in TOOLS


def test_the_cli_repeats_the_simulators_names_exactly() -> None:
    from deferq._cli import crash
    from deferq.crashtest import cli as crash_cli
    from deferq.crashtest._explore import BOUNDS
    from deferq.crashtest._persistence import MODELS

    assert crash.MODELS == tuple(MODELS)
    assert crash.BOUND_NAMES == tuple(sorted(BOUNDS))
    assert crash.EXIT_INCOMPLETE == crash_cli.EXIT_INCOMPLETE
