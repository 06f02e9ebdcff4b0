"""One rank of a 2-rank `neuron` group that goes wrong (FAILURE): "dead_peer" (rank 1 exits
after joining), "never_joins" (only rank 0 is started), "shape_mismatch" (the ranks all_reduce
tensors of different sizes), "op_mismatch" (rank 0 all_reduces, rank 1 broadcasts). The group's
timeout is 5 s. Prints one JSON line: the error this rank got, and after how many seconds.
Started by tests/test_distributed.py with RANK/WORLD_SIZE/MASTER_* set, without torchrun, which
would kill the survivors itself."""
import json
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist

failure = os.environ["FAILURE"]
rank = int(os.environ["RANK"])
start = time.monotonic()
error = None
try:
    dist.init_process_group("neuron", timeout=timedelta(seconds=5))
    dev = torch.device("neuron", torch.neuron.current_device())
    if failure == "dead_peer" and rank == 1:
        os._exit(3)
    size = 5 if failure == "shape_mismatch" and rank == 1 else 4
    t = torch.ones(size, device=dev)
    if failure == "op_mismatch" and rank == 1:
        dist.broadcast(t, src=0)
    else:
        dist.all_reduce(t)
except Exception as e:  # the point: which error, and how soon
    error = f"{type(e).__name__}: {e}"
print(json.dumps({"rank": rank, "error": error, "seconds": time.monotonic() - start}), flush=True)
