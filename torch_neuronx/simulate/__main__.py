"""``python -m torch_neuronx.simulate``: the plan simulator's command line (:mod:`.cli`)."""
import sys

from torch_neuronx.simulate.cli import main

if __name__ == "__main__":
    sys.exit(main())
