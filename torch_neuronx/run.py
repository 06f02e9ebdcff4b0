"""``python -m torch_neuronx.run script.py``: the diagnostics' command line
(:mod:`torch_neuronx.diagnostics.cli`), under the short name users type."""
import sys

from torch_neuronx.diagnostics.cli import main

if __name__ == "__main__":
    sys.exit(main())
