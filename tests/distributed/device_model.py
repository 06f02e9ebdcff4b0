"""Run under torchrun (2 or more processes): TorchNeuron's device numbering (its NeuronDevice.cpp and
distributed/backend.py). Before init_process_group the process sees every core; its first neuron
group binds it to the core of its LOCAL_RANK, numbered neuron:<LOCAL_RANK> of LOCAL_WORLD_SIZE
devices, and another rank's index is refused with TorchNeuron's words. Each rank writes
"<rank> <checks>" to RESULT_DIR. Used by tests/test_distributed.py."""
import os
import threading

import torch
import torch.distributed as dist

from torch_neuronx import diagnostics

local, local_world = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
other = (local + 1) % local_world
checks = []


def check(name, condition, detail=""):
    assert condition, f"{name} on local rank {local}: {detail}"
    checks.append(name)


def refused(name, call, says):
    try:
        call()
    except (RuntimeError, ValueError) as error:  # set_device: ValueError, as TorchNeuron
        check(name, says in str(error) and f"(here neuron:{local})" in str(error), str(error))
    else:
        raise AssertionError(f"{name}: not refused on local rank {local}")


# Before the group: every core of the instance is visible, and set_device(LOCAL_RANK) neither fails nor
# starts the runtime (the CUDA habit, before init_process_group).
check("before: every core", torch.neuron.device_count() == 4, torch.neuron.device_count())
torch.neuron.set_device(local)
check("before: runtime not started", not torch.neuron.is_initialized())
dist.init_process_group("neuron")

check("device_count is the local world", torch.neuron.device_count() == local_world == torch.accelerator.device_count())
check("current device is the local rank",
      torch.neuron.current_device() == local == torch.accelerator.current_device_index())
seen = []
thread = threading.Thread(target=lambda: seen.append(torch.neuron.current_device()))
thread.start()
thread.join()
check("every thread's current device", seen == [local], seen)
own = torch.device("neuron", local)
x = torch.ones(2, 3, device="neuron")
check("bare 'neuron' is neuron:<local rank>", x.device == own == torch.zeros(1).to("neuron").device
      == torch.zeros(1).neuron().device == torch.empty(1, device=local).device)
check("properties of the own core", torch.neuron.get_device_properties().core_id == local
      == torch.neuron.get_device_properties(local).core_id)
check("properties of another index: that rank's core", torch.neuron.get_device_properties(other).core_id == other)
check("memory counted on the own index", torch.neuron.memory_allocated() == torch.neuron.memory_allocated(local) == 24)
check("another index reads empty", torch.neuron.memory_allocated(other) == 0 == torch.neuron.max_memory_allocated(other))
free, total = torch.neuron.mem_get_info()
check("mem_get_info", total == torch.neuron.get_device_properties().total_memory and free == total - 24)
torch.neuron.manual_seed_all(3)
check("a generator per device", len(torch.neuron.get_rng_state_all()) == local_world)
with torch.neuron.device_of(x):
    check("device_of", torch.neuron.current_device() == local)

wrong = f"Device index {other} is out of range. Valid range is {local} to {local} for this process"
refused("set_device(another)", lambda: torch.neuron.set_device(other), wrong)
refused("a tensor on another index", lambda: torch.ones(1, device=f"neuron:{other}"), wrong)
refused("a move to another index", lambda: x.to(f"neuron:{other}"), wrong)
refused("device(another)", lambda: torch.neuron.device(other).__enter__(), wrong)
refused("torch.accelerator.set_device_index", lambda: torch.accelerator.set_device_index(other), wrong)
attach = f"Attempted to access device that doesn't attach to this process, received {other}"
refused("a stream of another index", lambda: torch.neuron.Stream(other), attach)
refused("synchronize(another)", lambda: torch.neuron.synchronize(other), attach)
check("nothing moved", torch.neuron.current_device() == local and torch.neuron.memory_allocated() == 24)
report = diagnostics.report()
check("the report's memory row is this core's", [(m.device, m.emulated_capacity_bytes) for m in report.memory]
      == [(f"neuron:{local}", torch.neuron.get_device_properties().total_memory)], report.memory)

with open(os.path.join(os.environ["RESULT_DIR"], f"rank{dist.get_rank()}.txt"), "w") as f:
    f.write(f"{dist.get_rank()} {len(checks)}")
dist.destroy_process_group()
