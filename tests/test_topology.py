"""The emulated instance: profiles, NEURON_* / TORCH_NEURONX_* variables and their bad values.

The environment is read at the first use of a device (not at import), so each case runs in a fresh
interpreter (one interpreter walks all profiles through apply_topology before the runtime initializes).
"""
import json

import pytest

from helpers.isolated import run

GiB, MiB = 1 << 30, 1 << 20

# (instance, lnc) -> (logical cores, bytes per logical core, TorchNeuron's device name (the runtime's
# instance family), chip and core, capability), from AWS's numbers:
# Trn2 chip 8 physical cores, 96 GiB; Trn3 chip 8 cores, 144 GiB; Trn1 chip 2 cores, 32 GiB;
# the runtime reserves 96 MiB per physical core.
EXPECTED = {
    ("trn2.3xlarge", 2): (4, 24 * GiB - 192 * MiB, "trn2", "Trainium2 NeuronCore-v3", [3, 0]),
    ("trn2.3xlarge", 1): (8, 12 * GiB - 96 * MiB, "trn2", "Trainium2 NeuronCore-v3", [3, 0]),
    ("trn2.48xlarge", 2): (64, 24 * GiB - 192 * MiB, "trn2", "Trainium2 NeuronCore-v3", [3, 0]),
    ("trn2u.48xlarge", 2): (64, 24 * GiB - 192 * MiB, "trn2u", "Trainium2 NeuronCore-v3", [3, 0]),
    ("trn3", 2): (4, 36 * GiB - 192 * MiB, "trn3", "Trainium3 NeuronCore-v4", [4, 0]),
    ("trn3", 1): (8, 18 * GiB - 96 * MiB, "trn3", "Trainium3 NeuronCore-v4", [4, 0]),
    ("trn1.2xlarge", 1): (2, 16 * GiB - 96 * MiB, "trn1", "Trainium NeuronCore-v2", [2, 0]),
    ("trn1.32xlarge", 1): (32, 16 * GiB - 96 * MiB, "trn1", "Trainium NeuronCore-v2", [2, 0]),
}


def test_every_profile_device_count_capacity_and_properties():
    r = run(f"""
        import json, os, torch
        from torch_neuronx import runtime
        out = {{}}
        for instance, lnc in {list(EXPECTED)!r}:
            os.environ["TORCH_NEURONX_INSTANCE_TYPE"] = instance
            os.environ["NEURON_LOGICAL_NC_CONFIG"] = str(lnc)
            runtime.apply_topology()
            last = torch.neuron.device_count() - 1
            p = torch.neuron.get_device_properties(last)
            out[f"{{instance}}/{{lnc}}"] = [torch.neuron.device_count(), torch.accelerator.device_count(),
                                          p.total_memory, torch.neuron.mem_get_info(last)[1],
                                          p.name, f"{{p.chip}} {{p.core_arch}}", torch.neuron.get_device_name(last),
                                          list(torch.neuron.get_device_capability(last)),
                                          p.core_id, p.chip_index, p.logical_nc_config, p.instance_type]
        assert not torch.neuron.is_initialized()
        print(json.dumps(out))
    """)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    for (instance, lnc), (cores, memory, name, core_name, capability) in EXPECTED.items():
        count, accel_count, total, mem_total, got_name, got_core, device_name, got_cap, core, chip, got_lnc, \
            got_instance = out[f"{instance}/{lnc}"]
        assert count == accel_count == cores
        assert total == mem_total == memory
        assert (got_name, got_core, got_cap, got_lnc, got_instance) == (name, core_name, capability, lnc, instance)
        assert device_name == f"neuron:{cores - 1}"  # TorchNeuron's get_device_name
        chips = 16 if instance.endswith("48xlarge") or instance.endswith("32xlarge") else 1
        assert core == cores - 1 and chip == chips - 1


def test_default_is_trn2_3xlarge_with_lnc2():
    r = run("""
        import torch
        p = torch.neuron.get_device_properties(0)
        print(torch.neuron.device_count(), p.instance_type, p.logical_nc_config, p.total_memory)
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["4", "trn2.3xlarge", "2", str(24 * GiB - 192 * MiB)]


VISIBLE_CASES = [
    ({"NEURON_RT_VISIBLE_CORES": "0-3"}, [0, 1, 2, 3]),
    ({"NEURON_RT_VISIBLE_CORES": "2"}, [2]),
    ({"NEURON_RT_VISIBLE_CORES": "0,2"}, [0, 2]),
    ({"NEURON_RT_VISIBLE_CORES": " 1-2, 3"}, [1, 2, 3]),
    ({"NEURON_RT_NUM_CORES": "3"}, [0, 1, 2]),
    ({"NEURON_RT_VISIBLE_CORES": "2,3", "NEURON_RT_NUM_CORES": "2"}, [2, 3]),
    ({"TORCH_NEURONX_INSTANCE_TYPE": "trn2.48xlarge", "NEURON_RT_VISIBLE_CORES": "60-63"}, [60, 61, 62, 63]),
    ({"TORCH_NEURONX_INSTANCE_TYPE": "trn2.48xlarge", "NEURON_LOGICAL_NC_CONFIG": "1",
      "NEURON_RT_NUM_CORES": "127"}, list(range(127))),
]

BAD_CASES = [
    ({"NEURON_RT_VISIBLE_CORES": "4"}, "NEURON_RT_VISIBLE_CORES='4' is invalid: logical core ids on trn2.3xlarge "
                                       "with LNC=2 are 0 to 3"),
    ({"NEURON_RT_VISIBLE_CORES": "0-"}, "NEURON_RT_VISIBLE_CORES='0-' is invalid: expected a core id"),
    ({"NEURON_RT_VISIBLE_CORES": "3-1"}, "NEURON_RT_VISIBLE_CORES='3-1' is invalid"),
    ({"NEURON_RT_VISIBLE_CORES": "1,1"}, "NEURON_RT_VISIBLE_CORES='1,1' is invalid: a core is listed twice"),
    ({"NEURON_RT_NUM_CORES": "0"}, "NEURON_RT_NUM_CORES='0' is invalid: valid values are 1 to 4"),
    ({"NEURON_RT_NUM_CORES": "x"}, "NEURON_RT_NUM_CORES='x' is invalid: valid values are 1 to 4"),
    ({"NEURON_RT_VISIBLE_CORES": "0-1", "NEURON_RT_NUM_CORES": "3"}, "NEURON_RT_NUM_CORES='3' is invalid"),
    ({"NEURON_LOGICAL_NC_CONFIG": "4"}, "NEURON_LOGICAL_NC_CONFIG='4' is invalid: valid values on trn2.3xlarge "
                                        "are 2 or 1"),
    ({"TORCH_NEURONX_INSTANCE_TYPE": "trn1.2xlarge", "NEURON_LOGICAL_NC_CONFIG": "2"},
     "NEURON_LOGICAL_NC_CONFIG='2' is invalid: valid values on trn1.2xlarge are 1"),
    ({"TORCH_NEURONX_INSTANCE_TYPE": "p4d.24xlarge"}, "TORCH_NEURONX_INSTANCE_TYPE='p4d.24xlarge' is invalid: "
                                                      "the emulated instance types are trn2.3xlarge"),
    ({"TORCH_NEURONX_DEVICE_MEMORY": "lots"}, "TORCH_NEURONX_DEVICE_MEMORY='lots' is invalid"),
    ({"TORCH_NEURONX_DEVICE_MEMORY": "0"}, "TORCH_NEURONX_DEVICE_MEMORY='0' is invalid"),
    ({"TORCH_NEURONX_INSTANCE_TYPE": "trn2.48xlarge", "NEURON_LOGICAL_NC_CONFIG": "1"},
     "has 128 logical cores, but torch can index at most 127"),
]

# Walks environments in one interpreter: apply_topology re-reads them until the runtime initializes.
WALK = """
    import json, os, sys, torch
    from torch_neuronx import runtime
    out = []
    for env in json.loads(sys.argv[1]):
        for name in {variables!r}:
            os.environ.pop(name, None)
        os.environ.update(env)
        runtime.apply_topology()
        row = [torch.neuron.is_available()]
        for use in ({uses}):
            try:
                row.append(["ok", use()])
            except Exception as error:
                row.append([type(error).__name__, str(error)])
        out.append(row)
    assert not torch.neuron.is_initialized()
    print(json.dumps(out))
"""


def walk(cases, uses):
    from helpers.isolated import TOPOLOGY_VARIABLES
    code = WALK.format(variables=TOPOLOGY_VARIABLES, uses=uses)
    r = run(code, argv=[json.dumps([env for env, _ in cases])])
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_visible_cores_select_devices():
    rows = walk(VISIBLE_CASES, "lambda: [torch.neuron.get_device_properties(i).core_id "
                               "for i in range(torch.neuron.device_count())],")
    for (env, cores), row in zip(VISIBLE_CASES, rows):
        assert row == [True, ["ok", cores]], env


def test_last_visible_device_works():
    r = run("""
        import torch
        n = torch.neuron.device_count()
        x = torch.arange(3.0, device=f"neuron:{n - 1}") * 2
        print(n, torch.neuron.get_device_properties(n - 1).core_id, x.device, x.sum().item())
    """, NEURON_RT_VISIBLE_CORES="1,3")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["2", "3", "neuron:1", "6.0"]


def test_bad_environment_names_variable_value_and_range():
    # neuron is unavailable; device_count() and every use of a device raise the same message.
    rows = walk(BAD_CASES, "torch.neuron.device_count, lambda: torch.ones(1, device='neuron'), "
                           "lambda: torch.empty(2, device='neuron:0').device.index")
    for (env, says), row in zip(BAD_CASES, rows):
        assert row[0] is False, env
        assert row[1][0] == "TopologyError" and says in row[1][1], (env, row)
        for kind, message in row[2:]:
            assert kind == "RuntimeError" and message.startswith("neuron is unusable: ") and says in message, \
                (env, row)


def test_bad_environment_keeps_import_torch_working():
    r = run("""
        import torch
        print(torch.neuron.is_available(), torch.ones(2).sum().item())
        torch.ones(1, device="neuron")
    """, NEURON_RT_VISIBLE_CORES="9")
    assert r.returncode == 1 and r.stdout.split() == ["False", "2.0"]
    assert "warn" not in r.stderr.lower()
    assert "RuntimeError: neuron is unusable: NEURON_RT_VISIBLE_CORES='9' is invalid" in r.stderr


def test_device_memory_override_and_units():
    r = run("""
        import torch
        print(torch.neuron.get_device_properties(0).total_memory, torch.neuron.mem_get_info(3))
    """, TORCH_NEURONX_DEVICE_MEMORY="1.5GiB")
    assert r.returncode == 0, r.stderr
    size = 3 * GiB // 2
    assert r.stdout.strip() == f"{size} ({size}, {size})"


def test_topology_cannot_change_after_initialization():
    r = run("""
        import os, torch
        from torch_neuronx import runtime
        torch.ones(1, device="neuron")
        os.environ["NEURON_RT_VISIBLE_CORES"] = "1"
        try:
            runtime.apply_topology()
        except RuntimeError as error:
            print(error)
        print(torch.neuron.device_count())
    """)
    assert r.returncode == 0, r.stderr
    assert "already initialized" in r.stdout and r.stdout.split()[-1] == "4"


@pytest.mark.long  # subprocesses for seconds each: make test-long (CI runs it)
def test_visible_cores_are_read_at_the_first_use_of_a_device_not_at_import():
    # TorchNeuron's runtime reads NEURON_RT_* when it starts: its own test conftest sets
    # NEURON_RT_NUM_CORES=1 after `import torch`, then creates the first tensor.
    r = run("""
        import os, torch
        read_at_import = torch.ops.neuron._topology_read()
        os.environ["NEURON_RT_NUM_CORES"] = "1"
        x = torch.empty(1, device="neuron")  # the first use
        os.environ["NEURON_RT_NUM_CORES"] = "3"  # too late: the devices are fixed
        print(read_at_import, torch.neuron.device_count(), torch.accelerator.device_count())
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "1", "1"]
    for first_use in ("torch.accelerator.device_count()", "torch.neuron.is_available()",
                      "torch.neuron.set_device(0)", "torch.ones(1).to('neuron')"):
        r = run(f"""
            import os, torch
            os.environ["NEURON_RT_VISIBLE_CORES"] = "1,3"
            {first_use}
            os.environ["NEURON_RT_VISIBLE_CORES"] = "0"
            print(torch.neuron.device_count(), torch.neuron.get_device_properties(1).core_id)
        """)
        assert r.returncode == 0, (first_use, r.stderr)
        assert r.stdout.split() == ["2", "3"], first_use


def test_a_bad_variable_set_after_import_makes_neuron_unusable_at_first_use():
    r = run("""
        import os, torch
        os.environ["NEURON_RT_NUM_CORES"] = "9"
        print(torch.neuron.is_available())
        torch.ones(1, device="neuron")
    """)
    assert r.returncode == 1 and r.stdout.split() == ["False"]
    assert "RuntimeError: neuron is unusable: NEURON_RT_NUM_CORES='9' is invalid" in r.stderr
