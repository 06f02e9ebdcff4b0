"""The package's layout holds: no import cycles (imports inside functions counted), each layer
imports only from the layers below it, the public names of the compiler still import, and nothing
in the repository points outside it."""
import ast
import importlib
import importlib.metadata
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "torch_neuronx"

# Each layer may import from itself and from the layers after it in this list, never before it.
LAYERS = [
    ("torch_neuronx._registration", "torch_neuronx.run", "torch_neuronx.demo", "torch_neuronx.neuron_ls"),
    ("torch_neuronx.diagnostics",),
    ("torch_neuronx.neuron_dynamo_backend", "torch_neuronx.compile"),
    ("torch_neuronx.neuron", "torch_neuronx.distributed", "torch_neuronx.collective_checks", "torch_neuronx.threads",
     "torch_neuronx.dlpack", "torch_neuronx.dynamo_rules",
     "torch_neuronx.recurrent", "torch_neuronx.distribution_alias", "torch_neuronx.ecosystem_errors"),
    ("torch_neuronx.runtime",),
    ("torch_neuronx.topology", "torch_neuronx.version"),
]
# Modules of one layer that must not import each other (siblings, each reaching the runtime instead).
SIBLINGS = ("torch_neuronx.neuron", "torch_neuronx.distributed", "torch_neuronx.neuron_dynamo_backend")


def _modules() -> dict[str, str]:
    found = {}
    for directory, _, files in os.walk(os.path.join(ROOT, PACKAGE)):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(directory, name)
                module = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                found[module.removesuffix(".__init__")] = path
    return found


MODULES = _modules()


def _resolve(name: str) -> str:
    while name not in MODULES and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def _imports(module: str, path: str) -> set[str]:
    """Every torch_neuronx module ``module`` imports, at any depth of its code (functions included),
    with importlib.import_module of a constant name counted too."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    package = module if path.endswith("__init__.py") else module.rsplit(".", 1)[0]
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
            names.update(f"{base}.{alias.name}" for alias in node.names)
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module" and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            names.add(node.args[0].value)
    return {_resolve(n) for n in names if n.split(".")[0] == PACKAGE} - {module}


GRAPH = {module: _imports(module, path) for module, path in MODULES.items()}


def _owner(module: str, groups) -> str | None:
    return next((g for g in groups if module == g or module.startswith(g + ".")), None)


def test_the_import_graph_is_read():
    # The checks below must see real edges: a parser that found none would pass them all.
    assert "torch_neuronx.runtime.core" in GRAPH["torch_neuronx._registration"] or \
        "torch_neuronx.runtime" in GRAPH["torch_neuronx._registration"]
    assert "torch_neuronx.neuron_dynamo_backend.cache" in GRAPH["torch_neuronx.neuron_dynamo_backend.graph_cache"]
    assert len(MODULES) > 40


def test_no_import_cycles():
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for target in sorted(GRAPH.get(module, ())):
            if state.get(target) == 1:
                cycle = path[path.index(target):] + [target]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if target not in state:
                visit(target)
        path.pop()
        state[module] = 2

    for module in sorted(GRAPH):
        if module not in state:
            visit(module)


def test_layers_import_only_downward():
    groups = [g for layer in LAYERS for g in layer]
    rank = {g: i for i, layer in enumerate(LAYERS) for g in layer}
    upward = []
    for module, targets in GRAPH.items():
        source = _owner(module, groups)
        if source is None:
            continue  # the package's __init__: the top, which may import anything
        for target in targets:
            owner = _owner(target, groups)
            if owner is not None and rank[owner] < rank[source]:
                upward.append(f"{module} -> {target}")
            elif owner != source and owner in SIBLINGS and source in SIBLINGS:
                upward.append(f"{module} -> {target} (siblings)")
    assert not upward, "imports against the layers: " + ", ".join(sorted(upward))


def test_every_module_has_a_layer():
    groups = [g for layer in LAYERS for g in layer]
    assert not [m for m in MODULES if m != PACKAGE and _owner(m, groups) is None]


def test_the_compiler_does_not_import_the_diagnostics():
    compiler = [m for m in GRAPH if m.startswith("torch_neuronx.neuron_dynamo_backend")]
    assert compiler
    assert not {t for m in compiler for t in GRAPH[m] if t.startswith("torch_neuronx.diagnostics")}


def test_public_names_of_the_compiler_still_import():
    backend = importlib.import_module("torch_neuronx.neuron_dynamo_backend")
    for name in ("NEFFCompilationError", "NEFFExecutionError", "create_neuron_backend", "get_dynamo_metrics",
                 "get_model_name", "neuron_backend", "reset_dynamo_metrics", "set_model_name"):
        assert hasattr(backend, name), name
    assert set(backend.__all__) <= set(dir(backend))
    assert issubclass(backend.NEFFExecutionError, RuntimeError)
    (entry,) = importlib.metadata.entry_points(group="torch_dynamo_backends", name="neuron")
    assert entry.load() is backend.neuron_backend
    old = importlib.import_module("torch_neuronx.compile.cache")
    assert old is importlib.import_module("torch_neuronx.neuron_dynamo_backend.cache")
    import torch
    assert torch.neuron.get_dynamo_metrics is backend.get_dynamo_metrics


def test_nothing_in_the_repository_points_outside_it():
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    assert len(files) > 50
    outside = ["../" + "shared", "/" + "work/"]  # split: this file must not match itself
    hits = []
    for name in files:
        path = os.path.join(ROOT, name)
        if not os.path.isfile(path):
            continue
        try:
            text = open(path, encoding="utf-8").read()
        except UnicodeDecodeError:
            continue
        hits += [f"{name}: {needle}" for needle in outside if needle in text]
    assert not hits, hits
