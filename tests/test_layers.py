"""The layers of the package (docs/architecture.md): every module's folder is its layer, and imports flow one way,
down this list, never in a circle. Imports inside functions count like any other: a module may import only from
its own layer or the ones below it, and no chain of imports between stepnet modules comes back to where it
started. So `import stepnet` works whatever order its modules are imported in."""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "stepnet"

# From the bottom up. "schema" is the generated caffe2_pb2, hsm_pb2 and caffe_pb2; "top" is the package's own
# __init__, __main__ and the public test helpers (stepnet.testing).
LAYERS = ("schema", "core", "io", "graph", "distributed", "kernels", "ops", "passes", "compiled", "runtime", "builders",
          "export", "cli", "compat", "top")

# Imports against the direction that the layering work has not removed yet: (importer, imported). Only shrinks.
AGAINST_FOR_NOW: set[tuple[str, str]] = set()


def module_names() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name)."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def layer_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1 or parts[1] in ("__main__", "testing"):
        return "top"
    if parts[1] in ("caffe2_pb2", "hsm_pb2", "caffe_pb2"):
        return "schema"
    return parts[1]


def imports(modules: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the stepnet modules it imports anywhere in its text (inside functions too). `from a import b`
    counts as importing a.b where that is a module, else a."""
    graph = {}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = name.split(".") if is_package else name.split(".")[:-1]
                    base = base[:len(base) - node.level + 1]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                targets = [f"{source}.{a.name}" if f"{source}.{a.name}" in modules else source for a in node.names]
            else:
                continue
            for target in targets:
                while target not in modules and "." in target:
                    target = target.rsplit(".", 1)[0]
                if target in modules and target != name:
                    found.add(target)
        graph[name] = found
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def against(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    rank = {layer: i for i, layer in enumerate(LAYERS)}
    return {(a, b) for a, targets in graph.items() for b in targets if rank[layer_of(a)] < rank[layer_of(b)]}


def test_every_folder_is_a_layer():
    assert {layer_of(m) for m in module_names()} <= set(LAYERS)


def test_no_import_cycle():
    found = cycles(imports(module_names()))
    assert not found, "import cycles between stepnet modules (counting imports inside functions): " + "; ".join(
        " <-> ".join(c) for c in found)


def test_imports_flow_down_the_layers():
    bad = sorted(against(imports(module_names())) - AGAINST_FOR_NOW)
    assert not bad, "imports against the layers (" + " <- ".join(reversed(LAYERS)) + "): " + ", ".join(
        f"{a} -> {b}" for a, b in bad)


def test_the_allowance_is_still_needed():
    gone = sorted(AGAINST_FOR_NOW - against(imports(module_names())))
    assert not gone, f"remove from AGAINST_FOR_NOW: {gone}"


def test_the_checks_catch_a_cycle_and_an_upward_import():
    graph = {"stepnet.core.a": {"stepnet.core.b"}, "stepnet.core.b": {"stepnet.core.a"},
             "stepnet.io.c": {"stepnet.runtime.d"}, "stepnet.runtime.d": set()}
    assert cycles(graph) == [["stepnet.core.a", "stepnet.core.b"]]
    assert against(graph) == {("stepnet.io.c", "stepnet.runtime.d")}


@pytest.mark.parametrize("first", ["stepnet.ops.recurrent_grad", "stepnet.runtime.executor", "stepnet.compiled.forms",
                                   "stepnet.passes.gradients", "stepnet.ops.lstm", "stepnet.io.checkpoints",
                                   "stepnet.builders.rnn"])
def test_any_module_imports_first(first):
    """A fresh interpreter importing this module before anything else of stepnet: no import order is load-bearing."""
    done = subprocess.run([sys.executable, "-c", f"import {first}; import stepnet"], cwd=ROOT, capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr


def test_import_stepnet_works_whatever_order_its_lists_give(tmp_path):
    """A copy of the package whose __init__ imports its names in reverse order and whose ops/__init__ lists the
    op families in reverse: it imports, registers every op, and runs an LSTM step net compiled."""
    import shutil

    copy = tmp_path / "stepnet"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    init = copy / "__init__.py"
    lines = init.read_text().split("\n")
    imports = [i for i, line in enumerate(lines) if line.startswith("from .") and line.rstrip().endswith(")") is False
               and "(" not in line]
    for a, b in zip(imports, reversed(imports)):
        if a < b:
            lines[a], lines[b] = lines[b], lines[a]
    init.write_text("\n".join(lines))
    ops = copy / "ops" / "__init__.py"
    text = ops.read_text()
    assert "for _family in FAMILIES:" in text
    ops.write_text(text.replace("for _family in FAMILIES:", "for _family in reversed(FAMILIES):"))
    script = ("import stepnet, numpy as np\n"
              "from stepnet.ops import REGISTRY\n"
              "assert 'RecurrentNetworkGradient' in REGISTRY and 'Mul' in REGISTRY\n"
              "from stepnet.builders.model import ModelBuilder\n"
              "from stepnet.builders.rnn import lstm\n"
              "m = ModelBuilder('m')\n"
              "h = lstm(m, 'X', 'seq', ['h0', 'c0'], 3, 4)\n"
              "ws = stepnet.Workspace(seed=1)\n"
              "ws.run_net_once(m.init_net.proto())\n"
              "for n, v in {'X': np.ones((2, 1, 3), np.float32), 'seq': np.array([2], np.int32),\n"
              "             'h0': np.zeros((1, 1, 4), np.float32), 'c0': np.zeros((1, 1, 4), np.float32)}.items():\n"
              "    ws.feed(n, v)\n"
              "net = ws.create_net(m.net.proto())\n"
              "for _ in range(3):\n"
              "    net.run()\n"
              "print(stepnet.__file__)\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(init)
