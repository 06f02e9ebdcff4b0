"""Autoload: `import torch` registers neuron; TORCH_DEVICE_BACKEND_AUTOLOAD=0 leaves it to
`import torch_neuronx`; a PrivateUse1 already taken is left alone with one warning."""

from helpers.isolated import run


def test_import_torch_registers_neuron():
    r = run("""
        import torch
        assert torch._C._get_privateuse1_backend_name() == "neuron"
        assert torch.neuron.is_available() and not torch.neuron.is_initialized()
        x = torch.ones(2, device="neuron")
        assert torch.neuron.is_initialized()
        assert x.is_neuron and torch.nn.Linear(2, 2).neuron().weight.is_neuron
        print("OK", torch.accelerator.current_accelerator())
    """, TORCH_DEVICE_BACKEND_AUTOLOAD="1")
    assert r.returncode == 0, r.stderr
    assert "OK neuron" in r.stdout


def test_autoload_off_then_explicit_import():
    r = run("""
        import torch
        assert torch._C._get_privateuse1_backend_name() == "privateuseone"
        assert not hasattr(torch, "neuron")
        import torch_neuronx
        assert torch.neuron.device_count() == 4
        print((torch.ones(2, device="neuron") * 3).sum().item())
    """, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "6.0"


def test_importing_torch_neuronx_first_works():
    r = run("""
        import torch_neuronx, torch
        print(torch.randn(2, 2, device="neuron").device)
    """, TORCH_DEVICE_BACKEND_AUTOLOAD="1")
    assert r.returncode == 0, r.stderr
    assert "neuron:0" in r.stdout


def test_taken_privateuse1_warns_once_and_is_left_alone():
    r = run("""
        import warnings
        import torch
        torch.utils.rename_privateuse1_backend("otherdev")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import torch_neuronx
            from torch_neuronx import _registration
            _registration.register(on_conflict="warn")
        messages = [str(w.message) for w in caught if "did not register" in str(w.message)]
        assert len(messages) == 1, messages
        assert "otherdev" in messages[0]
        assert torch._C._get_privateuse1_backend_name() == "otherdev"
        assert not hasattr(torch, "neuron") and not torch_neuronx.is_registered()
        try:
            _registration.register(on_conflict="raise")
        except RuntimeError as e:
            print("RAISED", e)
    """, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    # autoload off + explicit import + conflict => the import itself raises a clear error
    assert r.returncode != 0
    assert "did not register the 'neuron' device" in r.stderr and "otherdev" in r.stderr


def test_taken_privateuse1_under_autoload_warns_and_import_torch_survives(tmp_path):
    # Another backend whose torch.backends entry point takes PrivateUse1 before ours runs.
    (tmp_path / "other_backend.py").write_text(
        "def load():\n    import torch\n    torch.utils.rename_privateuse1_backend('otherdev')\n")
    info = tmp_path / "other_backend-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: other-backend\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[torch.backends]\nother = other_backend:load\n")
    r = run("""
        import torch
        print("imported", torch._C._get_privateuse1_backend_name(), hasattr(torch, "neuron"))
    """, TORCH_DEVICE_BACKEND_AUTOLOAD="1", PYTHONPATH=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "imported otherdev False" in r.stdout
    assert r.stderr.count("did not register the 'neuron' device") == 1, r.stderr


def test_broken_install_under_autoload_warns_and_import_torch_survives():
    # Simulate a core that fails to load (e.g. built against another torch): the loader is pointed
    # at a file that is no shared library, as soon as its module is imported (during `import torch`).
    r = run("""
        import importlib.abc, importlib.machinery, sys, tempfile
        broken = tempfile.NamedTemporaryFile(suffix=".so", delete=False)
        broken.write(b"not a shared library"); broken.close()

        class PointCoreAtBrokenFile(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name != "torch_neuronx.runtime.core":
                    return None
                spec = importlib.machinery.PathFinder.find_spec(name, path)
                execute = spec.loader.exec_module
                def exec_module(module):
                    execute(module)
                    module.core_path = lambda: broken.name
                spec.loader.exec_module = exec_module
                return spec

        sys.meta_path.insert(0, PointCoreAtBrokenFile())
        import torch
        print("imported", hasattr(torch, "neuron"), torch.ones(2).sum().item())
    """, TORCH_DEVICE_BACKEND_AUTOLOAD="1")
    assert r.returncode == 0, r.stderr
    assert "imported False 2.0" in r.stdout
    assert r.stderr.count("failed to register the 'neuron' device") == 1, r.stderr
    assert "does not load with torch" in r.stderr and "pip install --no-build-isolation" in r.stderr, r.stderr
