"""Run code in a fresh interpreter: what happens at `import torch` depends on the environment."""
import os
import subprocess
import sys
import textwrap

# Variables that choose the emulated instance: tests start from none of them set.
TOPOLOGY_VARIABLES = ("TORCH_NEURONX_INSTANCE_TYPE", "NEURON_LOGICAL_NC_CONFIG", "NEURON_RT_VISIBLE_CORES",
                      "NEURON_RT_NUM_CORES", "TORCH_NEURONX_DEVICE_MEMORY")
# Set in this process by earlier compiles (Inductor records its cache directory in os.environ).
INHERITED_VARIABLES = TOPOLOGY_VARIABLES + ("TORCHINDUCTOR_CACHE_DIR",)


def environment(**env) -> dict:
    """This process's environment without the inherited variables above, plus ``env``."""
    return {**{k: v for k, v in os.environ.items() if k not in INHERITED_VARIABLES}, **env}


def run(code: str, argv=(), **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *argv], env=environment(**env),
                          capture_output=True, text=True, timeout=300)
