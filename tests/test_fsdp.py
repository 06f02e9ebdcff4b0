"""FSDP2 on neuron in one process: its streams, events and collectives run on the emulated
device, and training matches plain CPU training."""
from helpers.isolated import run


def test_fsdp2_single_process_trains_like_cpu():
    r = run("""
        import copy, torch, torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        torch.manual_seed(0)
        cpu_model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
        model = copy.deepcopy(cpu_model).to("neuron")
        mesh = init_device_mesh("neuron", (1,))
        for layer in (model[0], model[2]):
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        assert type(model[0].weight).__name__ == "DTensor" and model[0].weight.device.type == "neuron"

        optims = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (cpu_model, model)]
        for step in range(3):
            x = torch.randn(8, 16)
            for m, opt, dev in zip((cpu_model, model), optims, ("cpu", "neuron")):
                loss = m(x.to(dev)).square().mean()
                loss.backward()
                opt.step()
                opt.zero_grad()
                if dev == "cpu":
                    cpu_loss = loss.item()
                else:
                    assert loss.item() == cpu_loss, (step, loss.item(), cpu_loss)
        for p_cpu, p in zip(cpu_model.parameters(), model.parameters()):
            torch.testing.assert_close(p.full_tensor().cpu(), p_cpu, rtol=0, atol=0)
        dist.destroy_process_group()
        print("OK")
    """)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == "OK"
