"""The package's layout holds: no import cycles (imports inside functions counted), each layer
imports only from the layers below it, the public names of the compiler still import, and nothing
in the repository points outside it."""
import ast
import importlib
import importlib.metadata
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "torch_neuronx"

# The layers, top to bottom, each the folders (or root modules) under torch_neuronx/ that hold it. A
# module imports only from its own layer and the layers below it.
LAYERS = [
    ("run", "neuron_ls", "neuron_cache", "demo", "simulate"),  # tools
    ("_registration",),  # registration: the ordered list of installs
    ("diagnostics",),  # readiness: observer, findings, estimate, report
    ("neuron_dynamo_backend",),  # the compiler
    ("distributed", "interop"),  # where torch.distributed and other libraries meet the device
    ("trainium",),  # the model of Trainium: costs, time, NEFFs, attention, calibration
    ("neuron", "python_ops"),  # the device: torch.neuron and the aten kernels written in Python
    ("runtime", "version", "utils"),  # the core, the emulated hardware, shared helpers; TorchNeuron's utils
]
# Folders of one layer that must not import each other (siblings, each reaching lower layers instead).
SIBLINGS = (("distributed", "interop"), ("neuron", "python_ops"))
# Modules at the root besides the folders: the package's entry, registration, version and the tools.
ROOT_MODULES = {"__init__", "_registration", "version", "run", "neuron_ls"}
MAX_OTHER_ROOT_MODULES = 2


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


GROUPS = {f"{PACKAGE}.{name}": rank for rank, layer in enumerate(LAYERS) for name in layer}
SIBLING_OF = {f"{PACKAGE}.{a}": f"{PACKAGE}.{b}" for pair in SIBLINGS for a, b in (pair, pair[::-1])}


def test_the_import_graph_is_read():
    # The checks below must see real edges: a parser that found none would pass them all.
    assert "torch_neuronx.runtime.core" in GRAPH["torch_neuronx._registration"] or \
        "torch_neuronx.runtime" in GRAPH["torch_neuronx._registration"]
    assert "torch_neuronx.neuron_dynamo_backend.caching.neff_cache" in \
        GRAPH["torch_neuronx.neuron_dynamo_backend.caching.graph_cache"]
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
    upward = []
    for module, targets in GRAPH.items():
        source = _owner(module, GROUPS)
        if source is None:
            continue  # the package's __init__: the top, which may import anything
        for target in targets:
            owner = _owner(target, GROUPS)
            if owner is not None and GROUPS[owner] < GROUPS[source]:
                upward.append(f"{module} -> {target}")
            elif owner is not None and SIBLING_OF.get(source) == owner:
                upward.append(f"{module} -> {target} (siblings)")
    assert not upward, "imports against the layers: " + ", ".join(sorted(upward))


def test_every_module_has_a_layer():
    assert not [m for m in MODULES if m != PACKAGE and _owner(m, GROUPS) is None]
    listed = {name for layer in LAYERS for name in layer}
    on_disk = {name.removesuffix(".py") for name in os.listdir(os.path.join(ROOT, PACKAGE))
               if name.endswith(".py") or os.path.isfile(os.path.join(ROOT, PACKAGE, name, "__init__.py"))}
    assert on_disk - {"__init__"} == listed, "folders and root modules must match LAYERS"


def test_few_modules_are_loose_at_the_root():
    loose = {name.removesuffix(".py") for name in os.listdir(os.path.join(ROOT, PACKAGE)) if name.endswith(".py")}
    assert len(loose - ROOT_MODULES) <= MAX_OTHER_ROOT_MODULES, sorted(loose - ROOT_MODULES)


def test_the_compiler_does_not_import_the_diagnostics():
    compiler = [m for m in GRAPH if m.startswith("torch_neuronx.neuron_dynamo_backend")]
    assert compiler
    assert not {t for m in compiler for t in GRAPH[m] if t.startswith("torch_neuronx.diagnostics")}


def test_the_simulator_does_not_import_the_diagnostics():
    """Both stand on the model of Trainium (torch_neuronx/trainium), not one on the other."""
    simulator = [m for m in GRAPH if m.startswith("torch_neuronx.simulate")]
    assert simulator
    assert not {t for m in simulator for t in GRAPH[m] if t.startswith("torch_neuronx.diagnostics")}


def _reachable(module: str) -> set[str]:
    seen, todo = set(), [module]
    while todo:
        for target in GRAPH.get(todo.pop(), ()):
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


FAITHFUL = "torch_neuronx.neuron_dynamo_backend.faithful"


def test_the_backend_names_no_executor_and_config_imports_none():
    """The backend takes one path for every graph; what differs is each executor's Executor object."""
    from torch_neuronx.neuron_dynamo_backend import config

    source = open(MODULES["torch_neuronx.neuron_dynamo_backend.backend"], encoding="utf-8").read()
    words = {n.value for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    assert not words & set(config.EXECUTORS)
    assert not {t for t in GRAPH["torch_neuronx.neuron_dynamo_backend.config"] if ".executors" in t}


@pytest.mark.long  # subprocesses for seconds each: make test-long (CI runs it)
def test_the_default_executor_does_not_depend_on_the_faithful_front_end():
    executors = importlib.import_module("torch_neuronx.neuron_dynamo_backend.executors")
    config = importlib.import_module("torch_neuronx.neuron_dynamo_backend.config")
    assert config.EXECUTORS == ("inductor", "xla")
    assert [executors.executor(name).name for name in config.EXECUTORS] == list(config.EXECUTORS)
    inductor = _reachable("torch_neuronx.neuron_dynamo_backend.executors.inductor")
    assert inductor and not {m for m in inductor if m.startswith(FAITHFUL)}
    assert any(m.startswith(FAITHFUL) for m in _reachable("torch_neuronx.neuron_dynamo_backend.executors.xla"))
    # At run time: a default compile loads no part of it; one the readiness report observes lowers
    # the graph, and so loads it.
    code = (f"import sys, torch\nf = torch.compile(lambda x: x.sin() * 2, backend='neuron')\n"
            f"f(torch.ones(3, device='neuron'))\nprint(any(m.startswith('{FAITHFUL}') for m in sys.modules))")
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH_NEURONX_COMPILE_EXECUTOR", "TORCH_NEURONX_REPORT",
                                                            "TORCH_NEURONX_PRESERVE_COMPILATION_ARTIFACTS")}
    plain = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    observed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                              env={**env, "TORCH_NEURONX_REPORT": "1"})
    assert (plain.stdout.strip(), observed.stdout.strip()) == ("False", "True"), plain.stderr + observed.stderr


MAX_FILE_LINES, MAX_FUNCTION_LINES = 500, 40


def test_no_file_is_over_500_lines_and_no_function_over_40():
    """What a newcomer can read at once: a module of one subject, a function of one step."""
    long_files, long_functions = [], []
    for module, path in MODULES.items():
        text = open(path, encoding="utf-8").read()
        if text.count("\n") > MAX_FILE_LINES:
            long_files.append((module, text.count("\n")))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long_functions.append(f"{module}.{node.name} ({length} lines)")
    assert MODULES and not long_files and not long_functions, (long_files, long_functions)


def test_public_names_of_the_compiler_still_import():
    backend = importlib.import_module("torch_neuronx.neuron_dynamo_backend")
    for name in ("NEFFCompilationError", "NEFFExecutionError", "create_neuron_backend", "get_dynamo_metrics",
                 "get_model_name", "neuron_backend", "reset_dynamo_metrics", "set_model_name"):
        assert hasattr(backend, name), name
    assert set(backend.__all__) <= set(dir(backend))
    assert issubclass(backend.NEFFExecutionError, RuntimeError)
    (entry,) = importlib.metadata.entry_points(group="torch_dynamo_backends", name="neuron")
    assert entry.load() is backend.neuron_backend
    with pytest.raises(ImportError):  # the old name of the cache module, never released, is gone
        importlib.import_module("torch_neuronx.compile")
    (cli,) = importlib.metadata.entry_points(group="console_scripts", name="neuron-cache")
    assert cli.load() is importlib.import_module("torch_neuronx.neuron_cache").main
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


def test_every_result_has_one_shape_and_one_writer(tmp_path):
    """The report, a structure plan and a numerics plan share to_dict, text and html, and
    runtime.outputs.write writes any of them: <stem>.txt/.json/.html, the JSON being to_dict."""
    import json

    from torch_neuronx.diagnostics.report import Report
    from torch_neuronx.runtime import outputs
    from torch_neuronx.simulate.numerics import NumericsPlan
    from torch_neuronx.simulate.plan import Plan
    from torch_neuronx.simulate.rows import Numerics

    for cls, stem in ((Report, "report"), (Plan, "plan"), (NumericsPlan, "plan")):
        assert cls.stem == stem and all(callable(getattr(cls, name)) for name in ("to_dict", "text", "html"))
    plan = NumericsPlan(script="/x/train.py", args=[], instance="trn2.3xlarge", lnc=2, nnodes=1, nproc_per_node=2,
                        world_size=2, numerics=Numerics(True, {}, [], "1 x trn2.3xlarge", "rtol 1e-05", 0.0))
    paths = outputs.write(plan, str(tmp_path))
    assert sorted(paths) == ["html", "json", "txt"]
    assert json.loads((tmp_path / "plan.json").read_text()) == plan.to_dict()
    assert (tmp_path / "plan.txt").read_text() == plan.text()
    assert (tmp_path / "plan.html").read_text().startswith("<!DOCTYPE html>")
    with pytest.raises(ValueError, match="unknown plan format sarif"):
        outputs.write(plan, str(tmp_path), ("sarif",))
