"""torch.compile support for the emulated `neuron` device (backend and compile-artifact cache)."""
