"""The version of torch-neuronx-cpu (the wheel's version is read from here)."""
__version__ = "0.1.0"
