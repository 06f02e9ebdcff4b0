"""Run code in a fresh interpreter: what happens at `import torch` depends on the environment."""
import os
import subprocess
import sys
import textwrap

# Variables that choose the emulated instance: tests start from none of them set.
TOPOLOGY_VARIABLES = ("TORCH_NEURONX_INSTANCE_TYPE", "NEURON_LOGICAL_NC_CONFIG", "NEURON_RT_VISIBLE_CORES",
                      "NEURON_RT_NUM_CORES", "TORCH_NEURONX_DEVICE_MEMORY")
# Set in this process by earlier compiles (Inductor records its cache directory in os.environ); and a
# benchmark's malloc tuning, which neuron leaves to the user.
INHERITED_VARIABLES = TOPOLOGY_VARIABLES + ("TORCHINDUCTOR_CACHE_DIR", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_",
                                            "GLIBC_TUNABLES")


def environment(**env) -> dict:
    """This process's environment without the inherited variables above, plus ``env``."""
    return {**{k: v for k, v in os.environ.items() if k not in INHERITED_VARIABLES}, **env}


def run(code: str, argv=(), **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *argv], env=environment(**env),
                          capture_output=True, text=True, timeout=300)


def torchrun(script: str, ranks: int, *args, launcher=(), **env) -> subprocess.CompletedProcess:
    """``torchrun --nproc_per_node=ranks [launcher options] script args`` in a fresh interpreter, on a
    free rendezvous port."""
    argv = ["torchrun", f"--nproc_per_node={ranks}", "--rdzv-endpoint=localhost:0", "--rdzv-backend=c10d",
            *launcher, script, *args]
    return run(f"import sys, runpy; sys.argv = {argv!r}; runpy.run_module('torch.distributed.run', run_name='__main__')",
               **env)
