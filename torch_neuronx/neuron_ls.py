"""``neuron-ls`` and ``python -m torch_neuronx.neuron_ls``: the emulated instance, laid out like AWS's
``neuron-ls`` (:mod:`torch_neuronx.runtime.cli`), under the name users type."""
import sys

from torch_neuronx.runtime.cli import main

if __name__ == "__main__":
    sys.exit(main())
