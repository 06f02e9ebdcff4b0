"""Run under torchrun with 2 processes (PG_BACKEND: "neuron", or empty for no backend argument): every rank binds to its own core and the collectives of the
`neuron` backend work on neuron tensors (and CPU tensors of the same group). Used by
tests/test_distributed.py."""
import os, torch, torch.distributed as dist
backend = os.environ.get("PG_BACKEND", "neuron")
dist.init_process_group(backend or None)
rank, world = dist.get_rank(), dist.get_world_size()
local = int(os.environ["LOCAL_RANK"])
assert torch.neuron.device_count() == 1 and torch.neuron.get_device_properties(0).core_id == local
dev = torch.device("neuron", torch.neuron.current_device())
x = torch.full((4,), float(rank + 1), device=dev)
ptr = x.data_ptr()
dist.all_reduce(x); assert x.data_ptr() == ptr  # in place, no copies
assert x.device.type == "neuron" and x.cpu().tolist() == [3.0] * 4, x
out = torch.empty(2 * world, device=dev); dist.all_gather_into_tensor(out, torch.full((2,), float(rank), device=dev))
assert out.cpu().tolist() == [0.0, 0.0, 1.0, 1.0]
rs = torch.empty(2, device=dev); dist.reduce_scatter_tensor(rs, torch.arange(4.0, device=dev))
assert rs.cpu().tolist() == ([0.0, 2.0] if rank == 0 else [4.0, 6.0]), rs
b = torch.full((3,), float(rank), device=dev); dist.broadcast(b, src=1); assert b.cpu().tolist() == [1.0] * 3
if rank == 0: dist.send(torch.tensor([7.0], device=dev), dst=1)
else:
    r = torch.empty(1, device=dev); dist.recv(r, src=0); assert r.item() == 7.0
a2a = torch.empty(2, device=dev); dist.all_to_all_single(a2a, torch.tensor([rank * 10.0, rank * 10.0 + 1], device=dev))
assert a2a.cpu().tolist() == [float(rank), 10.0 + rank], a2a
work = dist.all_reduce(torch.ones(2, device=dev), async_op=True); work.wait()
c = torch.ones(2); dist.all_reduce(c); assert c.tolist() == [2.0, 2.0]   # CPU tensors, same group
dist.barrier()
with open(os.path.join(os.environ["RESULT_DIR"], f"rank{rank}.txt"), "w") as f:  # not stdout: ranks interleave
    f.write(f"{rank} {dist.get_backend()}")
dist.destroy_process_group()
