"""What would go wrong or be slow on a real Trainium, found in one call of an op on neuron.

Each finding names the op, how often it happened and the user's source line: the first frame
outside torch and torch_neuronx; a call made by backward also names the autograd node that
made it.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

from torch_neuronx.python_ops import multi_head_attention, op_classes, trainium_semantics
from torch_neuronx.runtime import BACKEND_NAME, frames, ops

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
SYNCS_IN_A_LOOP = 3  # a host sync at one line this often is in a loop
# Which later calls of a signature the core hands back (Detector.signature_flags, csrc/op_tracking.cpp).
CHECK_EVERY_CALL = 1  # each call makes a finding
CHECK_INT64_RANGE = 2  # a call makes one when its int64 values leave the int32 range (checked in the core)

# How bad a kind is on Trainium, worst first: the report lists findings in this order.
SEVERITIES = {
    "would-fail": "would fail on Trainium",
    "computes-differently": "computes differently on Trainium",
    "runs-slowly": "runs slowly on Trainium",
    "near-limit": "near a limit on Trainium",
}


@dataclass(frozen=True)
class Kind:
    severity: str  # a key of SEVERITIES
    meaning: str  # what happens on Trainium, in plain words
    fix: str  # the change to make


# Kinds, in the order the report lists them within a severity.
KINDS = {
    "inductor-on-neuron": Kind(
        "would-fail", "torch.compile's default backend (Inductor) has no code generator for neuron, on Trainium "
        "either: the compile fails", 'compile with backend="neuron": torch.compile(model, backend="neuron")'),
    "another-rank-core": Kind(
        "would-fail", "under torchrun each process has one NeuronCore, neuron:<LOCAL_RANK>: TorchNeuron refuses "
        "another index (a fixed neuron:0 on a local rank above 0, say) with this error",
        'name the process\'s own core: torch.device("neuron", int(os.environ["LOCAL_RANK"])), "neuron" or '
        'torch.neuron.current_device()'),
    "device-argument": Kind(
        "would-fail", "TorchNeuron's device API refuses this device: an index outside the devices the process "
        "sees, or a form it does not take (torch.neuron.set_device(\"neuron:1\"), get_device_name(\"neuron:1\"))",
        "pass an index from 0 to torch.neuron.device_count() - 1, or torch.device(\"neuron\", i); "
        "NEURON_RT_VISIBLE_CORES and NEURON_RT_NUM_CORES choose the visible devices"),
    "runtime-before-group": Kind(
        "would-fail", "a neuron tensor was made before init_process_group: TorchNeuron binds a torchrun process "
        "to its core when the group is created, and asserts the runtime has not started yet",
        'create neuron tensors after dist.init_process_group(backend="neuron")'),
    "collective-cpu-tensor": Kind(
        "would-fail", "TorchNeuron's process group takes neuron tensors only: a collective on a CPU tensor raises",
        'move the tensor to neuron first (t.to("neuron")), or give CPU tensors a Gloo group of their own: '
        'dist.new_group(backend="gloo")'),
    "collective-empty-tensor": Kind(
        "would-fail", "TorchNeuron's collectives refuse an empty tensor (all_reduce, reduce_scatter, all_to_all; "
        "a zero first dimension in the gathers): this call raises",
        "skip the collective for an empty tensor: if t.numel(): dist.all_reduce(t)"),
    "collective-uneven-split": Kind(
        "would-fail", "TorchNeuron's all_to_all_single takes even splits only (no split sizes, or all ones): "
        "these split sizes raise", "pad every rank's chunk to the same size and pass no split sizes"),
    "safetensors-device": Kind(
        "would-fail", "safetensors rejects device=\"neuron\" (its list of devices is fixed), on Trainium too",
        'load to CPU (device="cpu") and move with .to("neuron"), or pass device=torch.neuron.current_device()'),
    "stablehlo-lowering": Kind(
        "would-fail", "this op of a compiled graph does not lower to StableHLO, so neuronx-cc never gets the "
        "graph: the compile fails on Trainium",
        "replace the op with ones that lower, or run it outside the compiled function"),
    "layout-change": Kind(
        "would-fail", "TorchNeuron refuses a copy that changes the memory format of a neuron tensor (only "
        "contiguous or preserve): this copy raises", "keep the default memory format on neuron: drop "
        ".to(memory_format=torch.channels_last) / .contiguous(memory_format=...) for neuron tensors"),
    "cross-core-copy": Kind(
        "would-fail", "TorchNeuron copies between neuron tensors with the runtime's device-to-device copy, "
        "which takes one core: a copy_ from one NeuronCore to another raises (RuntimeError: "
        + trainium_semantics.CROSS_CORE_COPY_ERROR + ")", trainium_semantics.CROSS_CORE_COPY_FIX),
    "non-contiguous-write": Kind(
        "would-fail", "TorchNeuron's kernels take contiguous tensors only, and an op that writes in place (or "
        "into out=) runs its kernel on that tensor: writing into a slice, a transpose or another non-contiguous "
        "view raises (RuntimeError: " + trainium_semantics.NON_CONTIGUOUS_ERROR + ")",
        trainium_semantics.NON_CONTIGUOUS_FIX),
    "no-kernel": Kind(
        "would-fail", "PyTorch's LSTM and GRU take each time step through a fused cell on a PrivateUse1 device; "
        "TorchNeuron has no kernel for it and its CPU fallback finds no CPU kernel either: the call raises",
        "run the LSTM or GRU on the CPU (.to('cpu') for the layer and its inputs), or write its step from "
        "nn.Linear, torch.sigmoid and torch.tanh (nn.RNN runs on neuron)"),
    "mha-fast-path": Kind(
        "would-fail", "TorchNeuron's kernel for nn.MultiheadAttention's inference fast path "
        "(_native_multi_head_attention) takes neither a mask tensor nor attention weights (need_weights=True, "
        "the layer's default): the call raises NotImplementedError",
        "call the layer with need_weights=False and no attn_mask or key_padding_mask, or keep it off the fast "
        "path: torch.backends.mha.set_fastpath_enabled(False)"),
    "unsupported-dtype": Kind(
        "would-fail", "TorchNeuron lowers this op through JAX, which has no such dtype: the op raises "
        "ValueError (\"Unsupported PyTorch dtype\")",
        "use a dtype Trainium's eager ops take: float8_e5m2 for float8_e4m3fn, int32 for uint16/uint32/uint64"),
    "empty-reduction": Kind(
        "would-fail", "TorchNeuron has no result for a reduction without an identity (max, min, argmax, ...) "
        "over an empty tensor: it raises", "check for an empty tensor before reducing: if t.numel(): ..."),
    "memory": Kind(
        "would-fail", "the peak memory of this core exceeds its HBM: the program runs out of memory",
        "shard the model over more cores (FSDP, tensor parallel), or use a smaller batch"),
    "float64": Kind(
        "computes-differently", "Trainium has no float64: TorchNeuron computes these ops in float32 (about 7 "
        "significant digits instead of 16)",
        "keep float32: drop .double() / dtype=torch.float64, or compute this value on the CPU if it needs float64"),
    "compiled-rng": Kind(
        "computes-differently", "in a compiled graph TorchNeuron draws these random numbers on the device, from "
        "another stream than CPU's generator: the values differ from a CPU run with the same seed",
        "compare such runs statistically, or switch the randomness off (model.eval(), dropout p=0) to compare "
        "values"),
    "int64-range": Kind(
        "computes-differently", "TorchNeuron computes int64 in 32 bits: these values do not fit and wrap around",
        "keep the values within the int32 range (e.g. offsets instead of absolute ids), or compute them on the CPU"),
    "host-sync-in-loop": Kind(
        "runs-slowly", "each call stops the device's queue, waits for the queued work and copies to the host, "
        "so the NeuronCore idles",
        "move it out of the loop: keep values on the device (total += loss.detach()) and read them once, or "
        "every N steps"),
    "cpu-fallback": Kind(
        "runs-slowly", "TorchNeuron has no NeuronCore kernel for this op: every call copies its inputs to the "
        "host, runs on the CPU and copies the result back",
        "run it on the CPU once, outside the loop, or use an op that has a NeuronCore kernel"),
    "device-rng": Kind(
        "runs-slowly", "TorchNeuron draws random numbers on the CPU, then copies them to the device: a host "
        "round trip per call", 'create the tensor on CPU and move it: torch.randn(...).to("neuron")'),
    "recompile": Kind(
        "runs-slowly", "each new input shape compiles a new graph (a NEFF), which takes minutes on neuronx-cc",
        "pad or bucket the inputs to a few fixed shapes"),
    "graph-break": Kind(
        "runs-slowly", "the compiled graph is split here: more NEFFs to compile, and host work between them",
        "move the Python side effect (print, .item(), an if on a tensor) out of the compiled function; "
        "fullgraph=True names each break"),
    "memory-headroom": Kind(
        "near-limit", "the peak memory of this core is over 80% of its HBM",
        "leave headroom: a smaller batch, or shard the model over more cores"),
}


@dataclass
class Finding:
    kind: str
    op: str
    site: str
    count: int = 0
    detail: str = ""


def user_site() -> tuple[str, bool]:
    """(the user's file:line, whether the call came from printing a tensor)."""
    printing = False
    site = "<unknown>"
    for frame in frames.outward():
        filename = frame.f_code.co_filename
        if filename.endswith("_tensor_str.py") or frame.f_code.co_name in ("__repr__", "__format__"):
            printing = printing or filename.startswith(frames.TORCH_DIR)
        if not frames.is_library(filename):
            site = f"{filename}:{frame.f_lineno}"
            break
    # Inside backward the user's frame is the .backward() call: name the node that ran the op too.
    node = torch._C._current_autograd_node()
    if node is not None:
        return f"backward ({node.name()})" + ("" if site == "<unknown>" else f" from {site}"), printing
    return site, printing


# Errors a program stops on that TorchNeuron raises too, told apart by the words both use.
STOPPING_ERRORS = (("another-rank-core", ("for this process. ", "doesn't attach to this process")),
                   ("device-argument", ("Invalid device id: ", "is out of range. Valid range is 0 to",
                                        "expects a device index (int)", "Incorrect device argument found")),
                   ("runtime-before-group", ("should not be initialized before the init_process_group",)),
                   # the process group's refusals, by the fix distributed/rules.py puts after TorchNeuron's words
                   ("collective-cpu-tensor", ("takes neuron tensors only: move them with .to('neuron')",)),
                   ("collective-empty-tensor", ("TorchNeuron's collectives refuse empty tensors",)),
                   ("collective-uneven-split", ("alltoall_base: Only even split sizes are supported",
                                                "_split_sizes length (")))


def error_finding(error: BaseException) -> Finding | None:
    """The finding for an error the program stopped on, when Trainium raises it too: at the innermost
    line of the program's own code in its traceback."""
    text = str(error)
    kind = next((k for k, words in STOPPING_ERRORS if any(w in text for w in words)), None)
    if kind is None:
        return None
    site, tb = "<unknown>", error.__traceback__
    while tb is not None:
        if not frames.is_library(tb.tb_frame.f_code.co_filename, stdlib=True):
            site = f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}"
        tb = tb.tb_next
    return Finding(kind, type(error).__name__, site, 1, text.split(" Under torchrun")[0])


def _layout(t: torch.Tensor) -> str:
    if t.is_contiguous():
        return "contiguous"
    for name, fmt in (("channels_last", torch.channels_last), ("channels_last_3d", torch.channels_last_3d)):
        if t.dim() == (4 if fmt is torch.channels_last else 5) and t.is_contiguous(memory_format=fmt):
            return name
    return "strided"


def _computes(op: op_classes.OpClass) -> bool:
    """Whether TorchNeuron computes this op on a NeuronCore (in 32 bits): copies move int64 values as
    they are, and ops it runs on the CPU compute them in 64 bits."""
    return op.kind in ("device", "collective", "dropout")


def _may_change_layout(op: op_classes.OpClass, inputs) -> bool:
    """A copy of a 4-D or 5-D tensor: whether it changes the memory format shows in each call's strides,
    which the signature leaves out, so every such call is looked at."""
    return op.base == "_to_copy" and any(t.dim() in (4, 5) for t in inputs)


def _may_cross_cores(op: op_classes.OpClass, inputs) -> bool:
    """A copy between neuron tensors while the process sees several cores: which cores shows in each
    call's devices, which the signature leaves out, so every such call is looked at."""
    return op.base == "copy" and sum(t.device.type == BACKEND_NAME for t in inputs) >= 2 and ops._device_count() > 1


def trainium_hits(op: op_classes.OpClass, inputs, results) -> list[tuple[str, str]]:
    """What TorchNeuron's eager rules (python_ops/trainium_semantics.py) make of this call: a copy that
    changes the memory format, a dtype its JAX lowering lacks, a reduction without identity over
    nothing. Each raises on Trainium."""
    neuron = [t for t in (*inputs, *results) if t.device.type == BACKEND_NAME]
    if not neuron:
        return []
    kind, base = op.kind, op.base
    hits = []
    if base == "_to_copy" and inputs and results:
        before, after = _layout(inputs[0]), _layout(results[0])
        if after.startswith("channels_last") and before != after:
            hits.append(("layout-change", f"a copy to {after} memory format"))
    elif base in trainium_semantics.FUSED_CELL_OF:
        hits.append(("no-kernel", f"aten::{trainium_semantics.FUSED_CELL_OF[base]}, at its first time step"))
    elif base == multi_head_attention.NAME and len(results) == 2:
        weights = results[1]  # inputs: the 7 tensors, then the mask if one was given
        refused = trainium_semantics.mha_refusal(len(inputs) > 7, weights.numel() > 0, weights.dim() != 4)
        if refused is not None:
            hits.append(("mha-fast-path", "a mask tensor" if len(inputs) > 7 else "need_weights=True"))
    elif base == "copy" and len(inputs) >= 2 and trainium_semantics.crosses_cores(inputs):
        hits.append(("cross-core-copy", f"from {inputs[1].device} to {inputs[0].device}"))
    elif base == "contiguous" and inputs:  # observed only for a format TorchNeuron refuses (csrc/contiguous.cpp)
        fmt = "channels_last" if inputs[0].dim() == 4 else "channels_last_3d"
        hits.append(("layout-change", f"contiguous(memory_format=torch.{fmt})"))
    if kind == "device":
        target = next((t for t in op.written_tensors(inputs)
                       if trainium_semantics.refused_write_target(t)), None)
        if target is not None:
            hits.append(("non-contiguous-write", f"writes into a non-contiguous {tuple(target.shape)} tensor "
                                                 f"(strides {target.stride()})"))
        unsupported = sorted({str(t.dtype).replace("torch.", "") for t in neuron
                              if t.dtype in trainium_semantics.UNSUPPORTED_DTYPES})
        if unsupported:
            hits.append(("unsupported-dtype", f"{', '.join(unsupported)} tensors"))
        if base in trainium_semantics.NO_IDENTITY_REDUCTIONS and any(t.numel() == 0 for t in inputs):
            hits.append(("empty-reduction", "an empty input"))
    return hits


class Detector:
    """Turns observed calls into findings, aggregated by (kind, op, site)."""

    def __init__(self) -> None:
        self.findings: dict[tuple[str, str, str], Finding] = {}
        self.lock = threading.Lock()  # calls may come from several threads (the user's, autograd's, Gloo's)

    def add(self, kind: str, op: str, site: str, detail: str) -> None:
        key = (kind, op, site)
        with self.lock:
            finding = self.findings.get(key)
            if finding is None:
                finding = self.findings[key] = Finding(kind, op, site, detail=detail)
            finding.count += 1

    @staticmethod
    def _op_hits(op: op_classes.OpClass, wide: set[str]) -> list[tuple[str, str]]:
        """What the op itself, and the float64/complex128 dtypes it saw on neuron, would do on Trainium."""
        hits = []
        if op.draws:  # most are in the table too: one finding says it
            hits.append(("device-rng", "draws random numbers on neuron"))
        elif op.entry is not None:
            hits.append(("cpu-fallback", op.entry.reason))
        if wide:
            hits.append(("float64", f"{', '.join(sorted(wide))} tensors"))
        return hits

    def check_call(self, op: str, inputs: list[torch.Tensor], results: list[torch.Tensor]) -> None:
        """Look at one op call on neuron; computes the user's line only when something is found."""
        facts = op_classes.classify(op)
        wide: set[str] = set()
        out_of_range = None
        for t in (*inputs, *results):  # one pass; only neuron tensors are Trainium's business
            dtype = t.dtype
            if dtype is torch.float64 or dtype is torch.complex128:
                if t.device.type == BACKEND_NAME:
                    wide.add(str(dtype).replace("torch.", ""))
            elif dtype is torch.int64 and out_of_range is None and t.numel() > 0 and t.device.type == BACKEND_NAME \
                    and _computes(facts):
                low, high = (int(v) for v in torch.aminmax(t))
                if low < INT32_MIN or high > INT32_MAX:
                    out_of_range = f"values in [{low}, {high}] leave the int32 range"
        hits = self._op_hits(facts, wide) + trainium_hits(facts, inputs, results)
        if out_of_range is not None:
            hits.append(("int64-range", out_of_range if not op.startswith("c10d::") else
                         f"{out_of_range}: TorchNeuron's process group sends int64 as int32"))
        sync = self._sync(facts.base, inputs, results)
        if not hits and sync is None:
            return
        site, printing = user_site()
        for kind, detail in hits:
            self.add(kind, op, site, detail)
        if sync is not None:
            self.add("host-sync", op, site, "printing a tensor" if printing else sync)

    def signature_flags(self, op: str, inputs: list[torch.Tensor], results: list[torch.Tensor]) -> int:
        """Which later calls with this call's signature (op; dtypes, devices and shapes of its tensors
        and results) :meth:`check_call` can find something in: what it finds depends on the
        signature alone, except the int64 range, which depends on the values."""
        neuron = [t for t in (*inputs, *results) if t.device.type == BACKEND_NAME]
        wide = {str(t.dtype).replace("torch.", "") for t in neuron if t.dtype in (torch.float64, torch.complex128)}
        facts = op_classes.classify(op)
        flags = 0
        if self._op_hits(facts, wide) or self._sync(facts.base, inputs, results) is not None \
                or trainium_hits(facts, inputs, results) or _may_change_layout(facts, inputs) \
                or _may_cross_cores(facts, inputs):
            flags |= CHECK_EVERY_CALL
        if any(t.dtype is torch.int64 for t in neuron) and _computes(facts):
            flags |= CHECK_INT64_RANGE
        return flags

    def check_graph_op(self, op: str, inputs, results, site: str) -> None:
        """An op of a compiled graph (metadata only: values are unknown at compile time). TorchNeuron
        compiles a graph whole, into one NEFF, or the compile fails: no op in it falls back to the CPU
        (whether it lowers is the lowering's finding). What stays: its dtype pass narrows float64, and
        random ops draw from the device, not from CPU's generator; except dropout, whose mask its
        random_op_legalization samples before each call with CPU's own native_dropout
        (NativeDropoutOp.sample), so it draws what eager draws."""
        wide = {str(m.dtype).replace("torch.", "") for m in (*inputs, *results)
                if m.device == BACKEND_NAME and m.dtype in (torch.float64, torch.complex128)}
        facts = op_classes.classify(op)
        if facts.draws and facts.base != "native_dropout":
            self.add("compiled-rng", op, site, "in a compiled graph: drawn by the compiled program")
        if wide:
            self.add("float64", op, site, f"in a compiled graph: {', '.join(sorted(wide))} tensors, narrowed to "
                                          "float32 by TorchNeuron's dtype pass (dtype_conversion)")

    @staticmethod
    def _sync(base: str, inputs: list[torch.Tensor], results: list[torch.Tensor]) -> str | None:
        if base == "_local_scalar_dense":
            return ".item() (or bool/int/float of a tensor, e.g. `if t.any():`)"
        if base == "_to_copy" and inputs and inputs[0].device.type == BACKEND_NAME and not results:
            return ".cpu() / .to('cpu') / .numpy() / .tolist()"
        if base == "copy" and len(inputs) >= 2 and inputs[0].device.type == "cpu" \
                and inputs[1].device.type == BACKEND_NAME:
            return "a copy into a CPU tensor"
        return None

    def counts(self) -> dict[tuple[str, str, str], int]:
        """How often each finding was made so far: a mark to collect later findings since."""
        with self.lock:
            return {key: finding.count for key, finding in self.findings.items()}

    def collected(self, since: dict[tuple[str, str, str], int] | None = None) -> list[Finding]:
        """The findings worth reporting (made after the mark ``since``, when given): a host sync only
        where it repeats (a loop), every other kind."""
        out = []
        with self.lock:
            recorded = [Finding(f.kind, f.op, f.site, f.count - (since or {}).get(key, 0), f.detail)
                        for key, f in self.findings.items()]
        for finding in recorded:
            if finding.count <= 0:
                continue
            if finding.kind == "host-sync":
                if finding.count < SYNCS_IN_A_LOOP:
                    continue  # reading a result once per call of a program is what every program does
                finding = Finding("host-sync-in-loop", finding.op, finding.site, finding.count,
                                  f"{finding.detail}, {finding.count} times")
            out.append(finding)
        return out


# Ops a graph gets from PyTorch's fused fast paths, which TorchNeuron's decompositions do not cover,
# with the switch that keeps them out of the graph.
_FASTPATH_FIX = ("PyTorch's fused fast path (nn.TransformerEncoderLayer / nn.MultiheadAttention in eval under "
                 "no_grad), which TorchNeuron does not decompose: turn it off with "
                 "torch.backends.mha.set_fastpath_enabled(False)")
LOWERING_FIXES = {"aten._transformer_encoder_layer_fwd": _FASTPATH_FIX,
                  "aten._native_multi_head_attention": _FASTPATH_FIX}


def lowering_fix(op: str) -> str:
    """What to do about an op that does not lower, when there is a specific answer."""
    return LOWERING_FIXES.get(op.rsplit(".", 1)[0] if op.count(".") > 1 else op, "")


def compile_findings(earlier_compilations: list) -> list[Finding]:
    """Recompiles and graph breaks since collection started, from Dynamo's compilation metrics
    (`earlier_compilations`: the metrics objects that existed when it started)."""
    from torch._dynamo.utils import get_compilation_metrics

    earlier = {id(m) for m in earlier_compilations}
    metrics = [m for m in get_compilation_metrics() if id(m) not in earlier]
    resumes: dict[tuple[str, str], list[int]] = {}
    for m in metrics:  # a graph break resumes in torch_dynamo_resume_in_<fn>_at_<line>
        name = m.co_name or ""
        if name.startswith("torch_dynamo_resume_in_") and "_at_" in name:
            fn, _, line = name[len("torch_dynamo_resume_in_"):].rpartition("_at_")
            if line.isdigit():
                resumes.setdefault((m.co_filename or "", fn), []).append(int(line))
    found: dict[tuple[str, str, str], Finding] = {}

    def add(kind: str, site: str, op: str, detail: str) -> None:
        finding = found.setdefault((kind, op, site), Finding(kind, op, site, detail=detail))
        finding.count += 1

    for m in metrics:
        where = f"{m.co_filename}:{m.co_firstlineno}"
        if m.recompile_reason:
            add("recompile", where, f"{m.co_name}()", m.recompile_reason.splitlines()[0])
        for reason in sorted(m.restart_reasons or ()):
            lines = sorted(set(resumes.get((m.co_filename or "", m.co_name or ""), [])))
            site = f"{m.co_filename}:{lines[0]}" if lines else where
            add("graph-break", site, f"{m.co_name}()", " ".join(reason.split("\n")[:2]).strip())
    return list(found.values())
