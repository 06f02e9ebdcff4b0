"""neuron-ls, run as a program (python -m torch_neuronx.neuron_ls) in a controlled environment."""
import json
import os
import subprocess
import sys

import pytest

GiB, MiB = 1 << 30, 1 << 20
VARIABLES = ("TORCH_NEURONX_INSTANCE_TYPE", "NEURON_LOGICAL_NC_CONFIG", "NEURON_RT_VISIBLE_CORES",
             "NEURON_RT_NUM_CORES", "TORCH_NEURONX_DEVICE_MEMORY", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


def run(*args, **variables):
    env = {k: v for k, v in os.environ.items() if k not in VARIABLES}
    env.update(variables)
    return subprocess.run([sys.executable, "-m", "torch_neuronx.neuron_ls", *args], env=env,
                          capture_output=True, text=True, timeout=300)


def chips(**variables):
    result = run("-j", **variables)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def table_rows(stdout):
    """The cells of the table's body rows."""
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in stdout.splitlines()
            if line.startswith("|")]
    return [row for row in rows if row[0].isdigit()]


# Memory per logical core: its share of the chip's HBM minus 96 MiB per physical core.
assert 24 * GiB - 2 * 96 * MiB == 25568477184
PROFILES = [  # instance, NEURON_LOGICAL_NC_CONFIG (set, in effect), chips, logical cores, HBM/chip, memory/core
    ("trn2.3xlarge", "", 2, 1, 4, 96 * GiB, 25568477184),
    ("trn2.48xlarge", "2", 2, 16, 64, 96 * GiB, 25568477184),
    ("trn2.48xlarge", "1", 1, 16, 128, 96 * GiB, 12 * GiB - 96 * MiB),  # beyond torch's 127 devices
    ("trn3", "", 2, 1, 4, 144 * GiB, 36 * GiB - 2 * 96 * MiB),
    ("trn1.2xlarge", "", 1, 1, 2, 32 * GiB, 16 * GiB - 96 * MiB),
]


@pytest.mark.parametrize("instance, lnc_set, lnc, n_chips, n_cores, hbm, per_core", PROFILES)
def test_json_describes_each_chip(instance, lnc_set, lnc, n_chips, n_cores, hbm, per_core):
    result = chips(TORCH_NEURONX_INSTANCE_TYPE=instance, NEURON_LOGICAL_NC_CONFIG=lnc_set)
    assert [c["neuron_device"] for c in result] == list(range(n_chips))
    assert [c["nc_count"] for c in result] == [n_cores // n_chips] * n_chips
    assert sum(c["nc_count"] for c in result) == n_cores
    assert [i for c in result for i in c["neuroncore_ids"]] == list(range(n_cores))
    assert all(c["visible_neuroncore_ids"] == c["neuroncore_ids"] for c in result)
    assert {c["memory_size"] for c in result} == {hbm}
    assert {c["memory_per_neuroncore"] for c in result} == {per_core}
    assert {c["logical_neuroncore_config"] for c in result} == {lnc}
    assert {c["physical_nc_count"] for c in result} == {n_cores * lnc // n_chips}
    assert {c["instance_type"] for c in result} == {instance}
    assert all(c["neuron_processes"] == [] for c in result)
    assert len({c["bdf"] for c in result}) == n_chips
    links = {c["neuron_device"]: set(c["connected_to"]) for c in result}
    if n_chips == 1:
        assert links == {0: set()}
    else:  # a 4x4 torus: four neighbours each, and wires go both ways
        assert all(len(peers) == 4 and chip not in peers for chip, peers in links.items())
        assert all(chip in links[peer] for chip, peers in links.items() for peer in peers)
        assert links[0] == {1, 3, 4, 12} and links[5] == {1, 4, 6, 9}


@pytest.mark.parametrize("variables, visible, per_core", [
    ({"NEURON_RT_VISIBLE_CORES": "0,2", "TORCH_NEURONX_DEVICE_MEMORY": "2GiB"}, [[0, 2]], 2 * GiB),
    ({"TORCH_NEURONX_INSTANCE_TYPE": "trn2.48xlarge", "NEURON_RT_NUM_CORES": "3"},
     [[0, 1, 2]] + [[]] * 15, 25568477184),
])
def test_json_visible_cores_and_memory_override(variables, visible, per_core):
    result = chips(**variables)
    assert [c["visible_neuroncore_ids"] for c in result] == visible
    assert {c["memory_per_neuroncore"] for c in result} == {per_core}


def test_table_and_topology_of_a_multi_chip_instance():
    result = run("-t", TORCH_NEURONX_INSTANCE_TYPE="trn2.48xlarge", NEURON_RT_VISIBLE_CORES="2-5")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.startswith("instance-type: trn2.48xlarge (emulated on the host by torch-neuronx-cpu)\n"
                          "logical-neuroncore-config: 2\n+---")
    assert "| NEURON | NEURON |" in out and "| DEVICE | CORES  |" in out
    rows = table_rows(out)
    assert [row[0] for row in rows] == [str(chip) for chip in range(16)]
    assert rows[0] == ["0", "4", "0-3", "96 GB", "1, 3, 4, 12", "2-3"]
    assert rows[1] == ["1", "4", "4-7", "96 GB", "0, 2, 5, 13", "4-5"]
    assert rows[15][2] == "60-63" and rows[15][5] == "-"
    assert ("memory per logical core: 23.81 GiB (HBM share minus the runtime's 96 MiB per physical core)"
            in out)
    assert "16 Trainium2 chips wired as a 4x4 2D torus" in out
    assert "neuron device  0 <-> 1, 3, 4, 12\n" in out and "neuron device 15 <-> 3, 11, 12, 14\n" in out


def test_table_and_topology_of_a_single_chip_with_memory_override():
    result = run("--topology", TORCH_NEURONX_INSTANCE_TYPE="trn1.2xlarge", TORCH_NEURONX_DEVICE_MEMORY="1GiB")
    assert result.returncode == 0, result.stderr
    assert "instance-type: trn1.2xlarge " in result.stdout
    assert "logical-neuroncore-config: 1\n" in result.stdout
    assert table_rows(result.stdout) == [["0", "2", "0-1", "32 GB", "-", "0-1"]]
    assert "memory per logical core: 1.00 GiB (set by TORCH_NEURONX_DEVICE_MEMORY)" in result.stdout
    assert "trn1.2xlarge has one Trainium chip" in result.stdout


@pytest.mark.parametrize("variables, visible, says", [
    ({"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}, [1], "logical core 1, which torch calls neuron:1"),
    # the launcher's core count gives way to the rank's one core; a core the user gave the rank stays its
    ({"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "NEURON_RT_NUM_CORES": "2"}, [1], "logical core 1"),
    ({"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "NEURON_RT_VISIBLE_CORES": "3"}, [3],
     "logical core 3, which torch calls neuron:1 (torch.neuron.device_count() is 2)"),
    ({"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "NEURON_RT_VISIBLE_CORES": "0-1"}, [0, 1],
     "refuses more than one per process"),
])
def test_inside_a_torchrun_job_it_shows_the_ranks_core_and_its_number(variables, visible, says):
    assert [i for c in chips(**variables) for i in c["visible_neuroncore_ids"]] == visible
    result = run(**variables)
    assert result.returncode == 0 and f"under torchrun (LOCAL_RANK={variables['LOCAL_RANK']}" in result.stdout
    assert says in result.stdout, result.stdout


def test_neuron_ls_run_by_torchrun_shows_each_rank_its_own_core():
    from helpers.isolated import torchrun

    r = torchrun(os.path.join(os.path.dirname(sys.executable), "neuron-ls"), 2, launcher=["--no-python"])
    assert r.returncode == 0, r.stderr[-2000:]
    for rank in (0, 1):
        assert f"this process's one NeuronCore is logical core {rank}, which torch calls neuron:{rank}" in r.stdout


@pytest.mark.parametrize("variables, named", [
    ({"NEURON_RT_VISIBLE_CORES": "9"}, "NEURON_RT_VISIBLE_CORES='9'"),
    ({"TORCH_NEURONX_INSTANCE_TYPE": "trn1.2xlarge", "NEURON_LOGICAL_NC_CONFIG": "2"},
     "NEURON_LOGICAL_NC_CONFIG='2'"),
])
def test_bad_environment_is_an_error(variables, named):
    result = run("-j", **variables)
    assert result.returncode == 2
    assert result.stdout == ""
    assert f"neuron-ls: error: {named} is invalid" in result.stderr
    assert "Traceback" not in result.stderr
