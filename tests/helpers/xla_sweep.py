"""The faithful compiled path swept over PyTorch's own op_db and module_db: each case compiled with
``backend="neuron", options={"executor": "xla"}`` (TorchNeuron's front end: its decompositions,
torch-mlir, StableHLO, run by XLA:CPU), forward and backward, against CPU eager (the oracle).

A case passes when its graphs compile and its outputs (and gradients) equal eager within float32
tolerances (``RTOL``/``ATOL``: XLA sums in its own order); random ops are compared by shape and dtype
only (XLA draws its own numbers). A case that fails is classified: ``lowering`` (an op does not lower,
with the op and the stage), ``crash`` (torch-mlir crashed on it), ``mismatch`` (it runs, but computes
something else), ``error`` (anything else). A case whose eager call raises on CPU, or whose failing
compiled call raises eagerly on neuron as well, is not counted.

    python tests/helpers/xla_sweep.py --json out.json [--ops add mul ...] [--modules nn.Linear ...]

``make sweep-xla`` runs every case and writes docs/xla-sweep.md (see ``markdown``).
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import re
import sys
import time
import traceback
import warnings

import torch

RTOL, ATOL = 1e-4, 1e-4
N = "neuron"
OPTIONS = {"executor": "xla"}
_RANDOM_NAME = re.compile(r"(rand|normal|bernoulli|dropout|multinomial|uniform|exponential|geometric|"
                          r"cauchy|log_normal|poisson)")
# Ops whose outputs are uninitialized memory: like random ops, compared by shape and dtype only.
_UNINITIALIZED = {"empty", "empty_like", "new_empty", "new_empty_strided", "empty_permuted", "empty_strided"}


def _flatten(x):
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)) and not isinstance(x, torch.Size):
        return [t for v in x for t in _flatten(v)]
    if isinstance(x, dict):
        return [t for v in x.values() for t in _flatten(v)]
    return []


def _replace(x, tensors):
    """``x`` with its tensors taken, in order, from the iterator ``tensors``."""
    if isinstance(x, torch.Tensor):
        return next(tensors)
    if isinstance(x, (list, tuple)) and not isinstance(x, torch.Size):
        items = [_replace(v, tensors) for v in x]
        return type(x)(*items) if hasattr(x, "_fields") else type(x)(items)
    if isinstance(x, dict):
        return {k: _replace(v, tensors) for k, v in x.items()}
    return x


def _to(t: torch.Tensor, device: str) -> torch.Tensor:
    moved = t.detach().to(device)
    return moved.requires_grad_(t.requires_grad) if t.dtype.is_floating_point or t.is_complex() else moved


def _classify(error: BaseException) -> tuple[str, str]:
    """(status, detail) of a failed case: the lowering error's op and stage when there is one."""
    chain, seen = [], set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        chain.append(error)
        error = error.__cause__ or getattr(error, "inner_exception", None) or error.__context__
    for e in chain:
        if type(e).__name__ == "LoweringError":
            return ("crash" if e.stage == "crash" else "lowering"), f"{e.op} ({e.stage})"
    text = " ".join(str(chain[0]).split())
    match = re.search(r"(aten\.[\w.]+) (?:at .*? )?does not lower to StableHLO \(stage: ([\w-]+)\)", text)
    if match:
        return ("crash" if match.group(2) == "crash" else "lowering"), f"{match.group(1)} ({match.group(2)})"
    last = chain[-1]
    return "error", f"{type(last).__name__}: {' '.join(str(last).split())[:160]}"


def _compare(got, expected, random: bool) -> str | None:
    """None when equal within the tolerances, else what differs."""
    got, expected = _flatten(got), _flatten(expected)
    if len(got) != len(expected):
        return f"{len(got)} outputs, eager {len(expected)}"
    for i, (g, e) in enumerate(zip(got, expected)):
        if g is None or e is None:
            if g is not e:
                return f"output {i}: None on one side"
            continue
        g = g.detach().cpu()
        if g.shape != e.shape or g.dtype != e.dtype:
            return f"output {i}: {g.dtype}{list(g.shape)}, eager {e.dtype}{list(e.shape)}"
        if random:
            continue
        if g.is_complex() or g.dtype.is_floating_point:
            if not torch.allclose(g, e.detach(), rtol=RTOL, atol=ATOL, equal_nan=True):
                diff = (g.double() - e.detach().double()).abs()
                diff = diff[~diff.isnan()]
                return f"output {i}: max difference {diff.max().item() if diff.numel() else float('nan'):.3g}"
        elif not torch.equal(g, e.detach()):
            return f"output {i}: values differ"
    return None


def _no_graph(fn, forward_input, args=()) -> dict:
    """A case Dynamo compiled no graph for: ``dynamo-skips`` when it compiles none on CPU either (not
    the device's doing; not counted), else ``no-graph`` (a failure)."""
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    counter = CompileCounter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            if forward_input is not None:
                torch.compile(fn, backend=counter)(*forward_input.args, **forward_input.kwargs)
            else:
                torch.compile(fn, backend=counter)(*args)
        except Exception:  # noqa: BLE001 - only the count matters
            pass
    if counter.frame_count == 0:
        return {"status": "dynamo-skips", "detail": "Dynamo compiles no graph for it on CPU either"}
    return {"status": "no-graph", "detail": "Dynamo compiled no graph on neuron, but does on CPU"}


def _graphs() -> int:
    from torch_neuronx.neuron_dynamo_backend import get_dynamo_metrics

    return len(get_dynamo_metrics())


def _expected_gradients(expected, wrt: list, wanted: bool):
    """(whether there is a backward to check, the weights w_i, CPU's gradients of sum(out_i * w_i))."""
    outs = [o for o in _flatten(expected) if o.requires_grad] if wanted else []
    if not (outs and wrt):
        return False, [], []
    gen = torch.Generator().manual_seed(7)
    weights = [torch.randn(o.shape, dtype=o.dtype, generator=gen) for o in outs]
    return True, weights, torch.autograd.grad(outs, wrt, weights, allow_unused=True)


def _raises(call) -> bool:
    """Whether ``call()`` raises: a failing compiled call that raises eagerly on neuron too is the
    call's error (an argument ATen wants on the CPU, say), and no compiler's."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            call()
    except Exception:  # noqa: BLE001 - only whether it raises matters
        return True
    return False


def run_compiled(fn, cpu_args: list, backward: bool, random: bool) -> dict:
    """``fn(*args)`` eager on CPU, then compiled (xla) on neuron; with ``backward``, the gradients of
    sum(out_i * w_i) too."""
    torch.manual_seed(0)
    try:
        expected = fn(*cpu_args)
    except Exception:  # noqa: BLE001 - nothing to compare against
        return {"status": "eager-raises"}
    wrt = [a for a in cpu_args if isinstance(a, torch.Tensor) and a.requires_grad]
    backward, weights, expected_grads = _expected_gradients(expected, wrt, backward)
    try:
        neuron_args = [_to(a, N) if isinstance(a, torch.Tensor) else a for a in cpu_args]
    except Exception as error:  # noqa: BLE001 - a layout neuron refuses (sparse), eager too
        return {"status": "device-eager-raises", "detail": f"its inputs cannot be on neuron: {type(error).__name__}"}
    return _outcome(lambda: torch.compile(fn, backend="neuron", options=OPTIONS, dynamic=False)(*neuron_args),
                    lambda: [a for a in neuron_args if isinstance(a, torch.Tensor) and a.requires_grad],
                    expected, (backward, weights, expected_grads), random,
                    no_graph=lambda: _no_graph(fn, None, cpu_args), eager_on_neuron=lambda: fn(*neuron_args))


def _outcome(compiled_call, wrt, expected, gradients, random: bool, no_graph, eager_on_neuron=None) -> dict:
    """Run ``compiled_call`` on neuron and compare with eager's ``expected`` (and, when ``gradients``
    says so, the gradients with respect to ``wrt()``); a failure classified."""
    from torch_neuronx.neuron_dynamo_backend import reset_dynamo_metrics

    backward, weights, expected_grads = gradients
    torch._dynamo.reset()
    reset_dynamo_metrics()
    start = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.manual_seed(0)
            got = compiled_call()
            if _graphs() == 0:
                return no_graph()
            problem = _compare(got, expected, random)
            if problem is None and backward:
                g_outs = [o for o in _flatten(got) if o.requires_grad]
                grads = torch.autograd.grad(g_outs, wrt(), [w.to(N) for w in weights], allow_unused=True)
                problem = _compare(list(grads), list(expected_grads), random)
                problem = problem and f"gradient {problem}"
    except Exception as error:  # noqa: BLE001 - classified
        if eager_on_neuron is not None and _raises(eager_on_neuron):
            return {"status": "device-eager-raises", "detail": f"{type(error).__name__}, eager too"}
        status, detail = _classify(error)
        return {"status": status, "detail": detail, "seconds": time.perf_counter() - start}
    if problem is not None:
        return {"status": "mismatch", "detail": problem, "seconds": time.perf_counter() - start}
    return {"status": "pass", "graphs": _graphs(), "seconds": time.perf_counter() - start}


# ---- op_db ----------------------------------------------------------------------------------------

def op_infos(names=None):
    from torch.testing._internal.common_methods_invocations import op_db

    ops = [op for op in op_db if op.supports_dtype(torch.float32, "cpu")]
    return [op for op in ops if names is None or op.full_name in names or op.name in names]


def op_case(op, backward: bool) -> dict:
    """The op's first sample (with gradients when ``backward``), compiled."""
    requires_grad = backward and op.supports_autograd and torch.float32 in op.supported_backward_dtypes("cpu")
    if backward and not requires_grad:
        return {"status": "no-backward"}
    torch.manual_seed(0)
    try:
        sample = next(iter(op.sample_inputs("cpu", torch.float32, requires_grad=requires_grad)))
    except StopIteration:
        return {"status": "no-sample"}
    structure = (sample.input, sample.args, sample.kwargs)
    leaves = _flatten(structure)

    def fn(*tensors):
        inp, args, kwargs = _replace(structure, iter(tensors))
        return op(inp, *args, **kwargs)

    return run_compiled(fn, leaves, backward, bool(_RANDOM_NAME.search(op.name)) or op.name in _UNINITIALIZED)


# ---- module_db ------------------------------------------------------------------------------------

def module_infos(names=None):
    from torch.testing._internal.common_modules import module_db

    return [m for m in module_db if torch.float32 in m.dtypes and (names is None or m.name in names)]


def module_case(info, training: bool) -> dict:
    """The module's first input, compiled, in training (forward and backward) or eval mode."""
    torch.manual_seed(0)
    inputs = [m for m in info.module_inputs_func(info, device="cpu", dtype=torch.float32, requires_grad=True,
                                                 training=training) if m.forward_input is not None]
    if not inputs:
        return {"status": "no-sample"}
    module_input = inputs[0]
    ctor = module_input.constructor_input
    kwargs = dict(ctor.kwargs)
    if "_random_samples" in kwargs:
        kwargs["_random_samples"] = kwargs["_random_samples"].float()
    torch.manual_seed(0)
    cpu_module = info.module_cls(*ctor.args, **kwargs).train(training)
    fwd = module_input.forward_input
    structure = (fwd.args, fwd.kwargs)
    leaves = _flatten(structure)
    params = [p for p in cpu_module.parameters()]
    random = bool(_RANDOM_NAME.search(info.name.lower())) or "Fractional" in info.name or (
        training and "Dropout" in info.name)

    class Call(torch.nn.Module):
        """The module and its inputs' structure; the parameters are arguments, so gradients flow to them."""

        def __init__(self, module):
            super().__init__()
            self.module = module

        def forward(self, *tensors):
            args, kw = _replace(structure, iter(tensors[len(params):]))
            return self.module(*args, **kw)

    cpu_call = Call(cpu_module)

    def fn(*tensors):  # eager on CPU: the parameters are the module's own
        return cpu_call(*tensors)

    torch.manual_seed(0)
    try:
        expected = fn(*params, *leaves)
    except Exception:  # noqa: BLE001
        return {"status": "eager-raises"}
    backward, weights, expected_grads = _expected_gradients(expected, params + [t for t in leaves if t.requires_grad],
                                                            training)
    neuron_module = copy.deepcopy(cpu_module).to(N)
    neuron_leaves = [_to(t, N) for t in leaves]
    arg_count = len(_flatten(fwd.args))
    return _outcome(lambda: torch.compile(neuron_module, backend="neuron", options=OPTIONS, dynamic=False)(
                        *_replace(fwd.args, iter(neuron_leaves[:arg_count])),
                        **_replace(fwd.kwargs, iter(neuron_leaves[arg_count:]))),
                    lambda: list(neuron_module.parameters()) + [t for t in neuron_leaves if t.requires_grad],
                    expected, (backward, weights, expected_grads), random, no_graph=lambda: _no_graph(cpu_module, fwd))


def run(op_names=None, module_names=None, progress=True, shard=(0, 1), save=None) -> dict:
    """Every case (or those named); ``shard`` (i, n): only every n-th op and module, from the i-th."""
    results = {"ops": {}, "modules": {}}
    torch.set_num_threads(1)
    index, count = shard
    for op in op_infos(op_names)[index::count]:
        for direction in ("forward", "backward"):
            try:
                outcome = op_case(op, direction == "backward")
            except Exception:  # noqa: BLE001 - the harness itself
                outcome = {"status": "error", "detail": traceback.format_exc(limit=1).splitlines()[-1][:160]}
            results["ops"][f"{op.full_name} {direction}"] = outcome
            if save is not None:
                save(results)  # a long sweep cut short keeps what it ran
            if progress:
                print(f"op {op.full_name} {direction}: {outcome['status']} {outcome.get('detail', '')}", flush=True)
    for info in module_infos(module_names)[index::count]:
        for training in (True, False):
            try:
                outcome = module_case(info, training)
            except Exception:  # noqa: BLE001
                outcome = {"status": "error", "detail": traceback.format_exc(limit=1).splitlines()[-1][:160]}
            results["modules"][f"{info.name} {'train' if training else 'eval'}"] = outcome
            if progress:
                print(f"module {info.name} {'train' if training else 'eval'}: {outcome['status']} "
                      f"{outcome.get('detail', '')}", flush=True)
    return results


# Statuses that are not the compiler's: not counted in the pass rate.
NOT_COUNTED = ("eager-raises", "device-eager-raises", "no-sample", "no-backward", "dynamo-skips")


def summary(cases: dict) -> tuple[int, int]:
    """(passed, counted) over the cases whose status is the compiler's."""
    counted = [c for c in cases.values() if c["status"] not in NOT_COUNTED]
    return sum(c["status"] == "pass" for c in counted), len(counted)


def _portable(text: str) -> str:
    """``text`` without this machine's paths: installed files from site-packages/, ours from the repository."""
    text = re.sub(r"/\S*?/site-packages/", "site-packages/", text)
    return text.replace(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + "/", "")


def _reason(name: str, status: str, reasons: dict[str, str], default: dict[str, str]) -> str:
    """The reason for ``name`` or for its longest dotted prefix listed (nn.functional.pad.circular,
    nn.functional.pad, ...), else the status's default."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in reasons:
            return reasons[".".join(parts[:end])]
    return default.get(status, "not classified")


def markdown(results: dict, reasons: dict[str, str], default: dict[str, str]) -> str:
    """The sweep as docs/xla-sweep.md: totals, then every failing case with its detail and, from
    ``reasons`` (keyed by the op or module name), whether TorchNeuron would fail it too."""
    lines = ["# The faithful compiler swept over PyTorch's op_db and module_db", "",
             "Generated by `make sweep-xla` (`tests/helpers/xla_sweep.py`): each case compiled with",
             '`torch.compile(..., backend="neuron", options={"executor": "xla"})` (TorchNeuron\'s',
             "decompositions, torch-mlir, StableHLO, XLA:CPU), forward, and backward where it has one,",
             "against CPU eager within float32 tolerance. OpInfo: each op's first float32 sample.",
             "ModuleInfo: each module's first input, in training (forward and backward) and in eval mode.",
             "Cases that are not the compiler's are not counted: eager raises on CPU (or on neuron too,",
             "or neuron refuses the inputs), no sample, no backward, or Dynamo compiles no graph for them",
             "on CPU either. Which ops TorchNeuron's private pipeline is taken to lower, and why:",
             "[compiled-coverage.md](compiled-coverage.md). Agreement with TorchNeuron's own compile: the",
             "counted cases that pass, and those that fail here and fail on Trainium too (by the reasons",
             "below), of all counted cases.", ""]
    for kind, title in (("modules", "ModuleInfo cases"), ("ops", "OpInfo ops")):
        cases = results[kind]
        if kind == "ops":  # an op passes when both its directions do
            by_op: dict[str, list] = {}
            for name, case in cases.items():
                by_op.setdefault(name.rsplit(" ", 1)[0], []).append(case)
            passed = sum(all(c["status"] in ("pass", *NOT_COUNTED) for c in cs) and
                         any(c["status"] == "pass" for c in cs) for cs in by_op.values())
            counted = sum(any(c["status"] not in NOT_COUNTED for c in cs) for cs in by_op.values())
        else:
            passed, counted = summary(cases)
        failing = {n.rsplit(" ", 1)[0] if kind == "ops" else n: c for n, c in sorted(cases.items())
                   if c["status"] not in ("pass", *NOT_COUNTED)}
        shared = sum(_reason(n.rsplit(" ", 1)[0] if kind == "modules" else n, c["status"], reasons,
                             default).startswith("fails on Trainium too") for n, c in failing.items())
        if counted:
            agree = passed + shared
            lines.append(f"- {title}: **{passed} of {counted} pass ({100 * passed / counted:.1f}%)**; agreement with "
                         f"TorchNeuron's compile **{agree} of {counted} ({100 * agree / counted:.1f}%)**")
        if failing:
            lines.append(f"  - of the {len(failing)} that do not, {shared} fail on Trainium too (by TorchNeuron's "
                         f"own source and the lowering it uses: reasons below), {len(failing) - shared} are ours")
    for kind, title in (("modules", "ModuleInfo"), ("ops", "OpInfo")):
        failing = {n: c for n, c in results[kind].items() if c["status"] not in ("pass", *NOT_COUNTED)}
        lines += ["", f"## {title}: what does not pass", ""]
        if not failing:
            lines.append("Nothing.")
            continue
        lines += ["| case | status | detail | on Trainium |", "|---|---|---|---|"]
        for name, case in sorted(failing.items()):
            base = name.rsplit(" ", 1)[0]
            reason = _reason(base, case["status"], reasons, default)
            detail = _portable(case.get("detail", "")).replace("|", "\\|")
            lines.append(f"| {name} | {case['status']} | {detail} | {reason} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", required=True)
    parser.add_argument("--markdown", help="also write the tables here")
    parser.add_argument("--shard", default="0/1", help="i/n: run every n-th case from the i-th (parallel runs)")
    parser.add_argument("--from-json", nargs="*", help="write the tables from earlier runs' JSON instead of running")
    parser.add_argument("--ops", nargs="*", default=None, help="op names (default: all); none: no ops")
    parser.add_argument("--modules", nargs="*", default=None, help="module names (default: all); none: no modules")
    args = parser.parse_args(argv)
    if args.from_json:
        results = {"ops": {}, "modules": {}}
        for path in args.from_json:
            earlier = json.load(open(path))
            results["ops"].update(earlier["ops"])
            results["modules"].update(earlier["modules"])
    else:
        index, count = (int(v) for v in args.shard.split("/"))
        def save(partial):
            with open(args.json, "w") as f:
                json.dump(partial, f, indent=1)

        results = run(args.ops, args.modules, shard=(index, count), save=save)
    with open(args.json, "w") as f:
        json.dump(results, f, indent=1)
    if args.markdown:
        from xla_sweep_reasons import DEFAULT, REASONS

        with open(args.markdown, "w") as f:
            f.write(markdown(results, REASONS, DEFAULT))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.exit(main())
