"""``python -m torch_neuronx.demo`` and ``neuronx-demo``: the main job's command line (:mod:`.cli`)."""
import sys

from torch_neuronx.demo.cli import main

if __name__ == "__main__":
    sys.exit(main())
