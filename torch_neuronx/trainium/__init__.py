"""The model of Trainium that the readiness report (``diagnostics``) and the plan simulator
(``simulate``) both stand on: what an op call costs on a NeuronCore (:mod:`.cost_model`: peak rates,
families, FLOPs, bytes), how long calls, compiled graphs and collectives take (:mod:`.time_model`),
which NEFFs an eager call compiles (:mod:`.neff_forecast`), attention as TorchNeuron's compiler
lowers it (:mod:`.attention`), and AWS's published figures the time model is fitted to
(:mod:`.calibration`). The chips and instances themselves are the runtime's table
(``torch_neuronx.runtime.hardware``), which the emulated device reads too.
"""
