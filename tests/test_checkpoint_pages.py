"""A CPU tensor that a private mapping of its safetensors checkpoint holds moves to neuron by mapping the
same file pages privately, copy-on-write (csrc/checkpoint_pages.cpp): no copy, the device still charged
the full bytes, writes private to each side, a file replaced by a rename never seen, and a torch.save
into the mapped file first detaches the pages (torch_neuronx/runtime/checkpoint_pages.py)."""
import os
import signal

import pytest
import torch
from safetensors.torch import load_file, save_file

import torch_neuronx
from torch_neuronx.runtime import host_memory

from helpers import isolated

N = "neuron"
MIB = 1 << 20


def _blocks():
    return torch.ops.neuron._checkpoint_blocks()


def _mapped_path(t):
    """The file /proc/self/maps names for the mapping holding t's bytes, or None."""
    address = t.data_ptr()
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            if lo <= address < hi:
                return fields[5] if len(fields) > 5 else None
    return None


@pytest.fixture
def checkpoint(tmp_path):
    torch.manual_seed(0)
    tensors = {"big": torch.randn(4096, 1024), "odd": torch.randn(300, 1001), "small": torch.randn(10)}
    path = tmp_path / "model.safetensors"
    save_file(tensors, path)
    return path, tensors


def test_a_loaded_checkpoint_moves_by_mapping_its_pages(checkpoint):
    path, tensors = checkpoint
    loaded = load_file(path)
    torch.ones(1).to(N)  # the device's first use allocates what it keeps
    before_blocks, before_bytes, before_anon = _blocks(), torch.neuron.memory_allocated(), host_memory.resident_bytes()[0]
    torch_neuronx.clear_op_tracking()
    moved = {name: t.to(N) for name, t in loaded.items()}
    assert sorted(torch_neuronx.get_executed_ops()) == ["aten::_to_copy", "aten::copy_", "aten::empty_strided"]
    assert _blocks() - before_blocks == 2  # the two above 1 MiB; the small one is copied
    assert _mapped_path(moved["big"]) == str(path) and _mapped_path(moved["odd"]) == str(path)
    # HBM is charged in full; the host holds no second copy.
    assert torch.neuron.memory_allocated() - before_bytes == sum(t.nbytes for t in tensors.values())
    assert host_memory.resident_bytes()[0] - before_anon < (tensors["big"].nbytes + tensors["odd"].nbytes) / 4
    for name, t in tensors.items():
        assert torch.equal(moved[name].cpu(), t)
    del moved
    assert _blocks() == before_blocks and torch.neuron.memory_allocated() == before_bytes


def test_writes_stay_private_to_each_side(checkpoint):
    path, tensors = checkpoint
    loaded = load_file(path)
    first, second = loaded["big"].to(N), loaded["big"].to(N)
    first.add_(1)
    loaded["odd"].to(N).mul_(0)
    assert torch.equal(second.cpu(), tensors["big"]) and torch.equal(first.cpu(), tensors["big"] + 1)
    assert torch.equal(loaded["big"], tensors["big"]) and torch.equal(loaded["odd"], tensors["odd"])
    assert torch.equal(load_file(path)["big"], tensors["big"])  # the file never changes
    loaded["big"].zero_()  # the source's own pages, copied on write, are not the neuron tensor's
    assert torch.equal(second.cpu(), tensors["big"])


def test_a_source_written_in_memory_is_copied_with_its_new_values(checkpoint):
    path, tensors = checkpoint
    loaded = load_file(path)
    loaded["big"][7].fill_(3.0)
    before = _blocks()
    moved = loaded["big"].to(N)
    assert _blocks() == before  # its pages differ from the file's now
    assert torch.equal(moved.cpu(), loaded["big"])


def test_a_file_replaced_by_a_rename_leaves_the_moved_tensor(checkpoint, tmp_path):
    path, tensors = checkpoint
    moved = load_file(path)["big"].to(N)
    replacement = tmp_path / "new.safetensors"
    save_file({"big": torch.zeros(4096, 1024)}, replacement)
    os.replace(replacement, path)
    save_file({"big": torch.ones(4096, 1024)}, path)  # safetensors' own save into the same file
    assert torch.equal(moved.cpu(), tensors["big"])
    assert _blocks() >= 1  # still mapped: the old inode


def test_torch_save_of_a_mapped_tensor_writes_its_current_values(checkpoint, tmp_path):
    path, tensors = checkpoint
    moved = load_file(path)["big"].to(N)
    moved[0].fill_(5.0)
    torch.save(moved, tmp_path / "t.pt")
    expected = tensors["big"].clone()
    expected[0] = 5.0
    assert torch.equal(torch.load(tmp_path / "t.pt").cpu(), expected)
    save_file({"big": moved.cpu()}, tmp_path / "t.safetensors")
    assert torch.equal(load_file(tmp_path / "t.safetensors")["big"], expected)


def test_saving_over_the_mapped_file_in_place_detaches_it_first(tmp_path):
    """torch.save truncates and rewrites its file: the pages are made the tensor's own before, so the
    values stay and nothing past the new end can fault. In a child process: a fault would kill it."""
    r = isolated.run(f"""
        import os, torch, torch_neuronx, safetensors.torch
        from safetensors.torch import save_file, load_file
        path = {str(tmp_path / "model.safetensors")!r}
        save_file({{"w": torch.arange(1 << 20, dtype=torch.float32)}}, path)
        model = torch.nn.Linear(1024, 1024)
        model.weight = torch.nn.Parameter(load_file(path)["w"].view(1024, 1024))
        model.to("neuron")
        assert torch.ops.neuron._checkpoint_blocks() == 1
        assert hasattr(safetensors.torch.save_file, "__neuron_guarded__")
        torch.save({{"tiny": 1}}, path)                      # truncates the mapped file
        assert torch.ops.neuron._checkpoint_blocks() == 0
        assert torch.equal(model.weight.cpu().flatten(), torch.arange(1 << 20, dtype=torch.float32))
        model.weight.data.add_(1)
        safetensors.torch.save_file({{"w": model.weight.data.cpu()}}, path)
        print(sorted(os.listdir(os.path.dirname(path))))
    """)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == "['model.safetensors']"  # and the exit left nothing beside it


@pytest.mark.long  # two child processes: make test-long (CI runs it)
def test_truncation_by_another_writer_faults_as_on_cpu(tmp_path):
    """A writer we do not wrap truncating the file: reading a page past its new end faults (SIGBUS), as
    reading CPU's own mapping of it does. The README says so."""
    script = f"""
        import sys, torch, torch_neuronx
        from safetensors.torch import save_file, load_file
        path = {str(tmp_path / "model.safetensors")!r}
        save_file({{"w": torch.randn(1 << 20)}}, path)
        cpu = load_file(path)["w"]
        held = cpu.to("neuron") if sys.argv[1] == "neuron" else cpu
        open(path, "wb").close()
        print(float(held.sum()))
    """
    for side in ("cpu", "neuron"):
        r = isolated.run(script, argv=[side])
        assert r.returncode == -signal.SIGBUS, (side, r.returncode, r.stderr[-2000:])


def test_mapping_can_be_turned_off(tmp_path):
    r = isolated.run(f"""
        import torch, torch_neuronx
        from safetensors.torch import save_file, load_file
        path = {str(tmp_path / "model.safetensors")!r}
        save_file({{"w": torch.randn(1 << 20)}}, path)
        moved = load_file(path)["w"].to("neuron")
        print(torch.ops.neuron._checkpoint_blocks(), torch.equal(moved.cpu(), load_file(path)["w"]))
    """, TORCH_NEURONX_MAP_CHECKPOINTS="0")
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["0", "True"]


@pytest.mark.long  # a child process loading diffusers and transformers: make test-long (CI runs it)
def test_from_pretrained_then_to_neuron_maps_the_weights_and_save_pretrained_keeps_them(tmp_path):
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    config = dict(block_out_channels=(128, 256), layers_per_block=1, latent_channels=4,
                  down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2)
    AutoencoderKL(**config).save_pretrained(tmp_path)
    reference = AutoencoderKL.from_pretrained(tmp_path)
    model = AutoencoderKL.from_pretrained(tmp_path)
    large = sum(p.nbytes >= MIB for p in model.parameters())
    before = _blocks()
    model.to(N)
    assert large > 0 and _blocks() - before == large
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        expected = reference(x).sample
        assert torch.equal(model(x.to(N)).sample.cpu(), expected)
        model.save_pretrained(tmp_path)  # into the directory it was loaded from
        assert torch.equal(model(x.to(N)).sample.cpu(), expected)


def test_torch_load_mmap_tensors_map_too_and_a_save_over_them_detaches(tmp_path):
    r = isolated.run(f"""
        import torch, torch_neuronx
        path = {str(tmp_path / "weights.pt")!r}
        torch.save({{"w": torch.arange(1 << 20, dtype=torch.float32)}}, path)
        moved = torch.load(path, mmap=True)["w"].to("neuron")
        assert torch.ops.neuron._checkpoint_blocks() == 1
        torch.save({{"tiny": 1}}, path)  # truncates the file the tensor maps
        assert torch.ops.neuron._checkpoint_blocks() == 0
        assert torch.equal(moved.cpu(), torch.arange(1 << 20, dtype=torch.float32))
        print("ok")
    """)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]
