"""The emulated Trainium instance: how many logical NeuronCores (devices) are visible.

Default: trn2.3xlarge, one Trainium2 chip with 8 physical NeuronCores grouped two
per logical core (NEURON_LOGICAL_NC_CONFIG=2), so 4 ``neuron`` devices.
"""

TRN2_3XLARGE_LOGICAL_CORES = 4


def visible_core_count() -> int:
    return TRN2_3XLARGE_LOGICAL_CORES
