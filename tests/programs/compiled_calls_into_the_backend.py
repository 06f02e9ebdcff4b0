"""Compiled functions that call into torch_neuronx from inside: backward (the backend's thread
wrapper, and under xla the backward graph's lazy compile), an optimizer step, a collective,
torch.neuron's queries and the diagnostics. Run with TORCH_LOGS=dynamo: no frame of torch_neuronx
may appear as traced. Prints the losses of the train step, and the other results, as JSON."""
import copy
import json
import sys

import torch
import torch.distributed as dist

import torch_neuronx
from torch_neuronx import diagnostics

N = "neuron"


def train(device, compiled):
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    model = copy.deepcopy(base).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    xd, yd = x.to(device), y.to(device)

    def train_step():
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(xd), yd)
        loss.backward()
        opt.step()
        return loss

    step = torch.compile(train_step, backend="neuron") if compiled else train_step
    return [step().item() for _ in range(3)], [p.detach().cpu().tolist() for p in model.parameters()]


def queries(t):
    # folded to constants, as torch.cuda's are: no graph break
    scale = torch.neuron.device_count() + torch.neuron.current_device() + int(torch.neuron.is_available())
    return t * scale + torch.neuron.get_device_properties(0).total_memory / 2 ** 40


def memory(t):
    before = torch.neuron.memory_allocated()  # a graph break, then eager, as torch.cuda.memory_allocated
    return t + 1, before


def observed(t):
    with diagnostics.phase("inside"):  # the diagnostics' own Python: a graph break, never traced
        t = t * 2
    return t + len(torch_neuronx.get_executed_ops()) * 0


def collective(t):
    t = t * 2
    dist.all_reduce(t)
    return t + 1


def main():
    results = {}
    results["eager"], params_eager = train("cpu", compiled=False)
    results["compiled"], params_compiled = train(N, compiled=True)
    results["params_difference"] = max(abs(a - b) for p, q in zip(params_eager, params_compiled)
                                       for a, b in zip(torch.tensor(p).flatten().tolist(),
                                                       torch.tensor(q).flatten().tolist()))
    t = torch.arange(4.0, device=N)
    results["queries"] = torch.compile(queries, backend="neuron", fullgraph=True)(t).cpu().tolist()
    out, before = torch.compile(memory, backend="neuron")(t)
    results["memory"] = [out.cpu().tolist(), before]
    diagnostics.start()
    results["observed"] = torch.compile(observed, backend="neuron")(t).cpu().tolist()
    diagnostics.stop()
    dist.init_process_group("neuron", init_method=f"file://{sys.argv[1]}", rank=0, world_size=1)
    # Under xla a graph with collectives does not lower (XLA:CPU has one device): it runs eagerly.
    results["collective"] = torch.compile(collective, backend="neuron", options={"fallback_execution": True})(
        t.clone()).cpu().tolist()
    dist.destroy_process_group()
    print("RESULTS " + json.dumps(results))


if __name__ == "__main__":
    main()
