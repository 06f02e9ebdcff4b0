"""The compiled path's errors, under TorchNeuron's names."""


class NEFFCompilationError(RuntimeError):
    """A graph could not be compiled (and fallback execution is disabled)."""


class NEFFExecutionError(RuntimeError):
    """A compiled graph failed while running (the cause is chained)."""
