"""`make demo`: a small transformer trained and run on the neuron device, checked against CPU.

Run with ``python -m torch_neuronx.demo``.
"""
import copy
import time

import torch


class TinyTransformer(torch.nn.Module):
    def __init__(self, vocab=64, dim=64, heads=4, layers=2):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        layer = torch.nn.TransformerEncoderLayer(dim, heads, dim * 4, dropout=0.0, batch_first=True,
                                                 norm_first=True, activation="gelu")
        self.blocks = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = torch.nn.Linear(dim, vocab)

    def forward(self, tokens):
        return self.head(self.blocks(self.embed(tokens)))


def train(model, device, steps, tokens, targets):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        logits = model(tokens.to(device))
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.to(device).flatten())
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def main():
    torch.manual_seed(0)
    tokens = torch.randint(0, 64, (8, 32))
    targets = torch.roll(tokens, 1, dims=1)
    reference = TinyTransformer()
    model = copy.deepcopy(reference).to("neuron")

    # First calls pay one-time costs (torch._dynamo import, kernel warm-up) on whichever
    # device runs first: warm both up on throwaway copies before timing.
    for device in ("cpu", "neuron"):
        train(copy.deepcopy(reference).to(device), device, 1, tokens, targets)
    print(f"torch {torch.__version__}; accelerator: {torch.accelerator.current_accelerator()}; "
          f"neuron devices: {torch.neuron.device_count()}")
    start = time.perf_counter()
    losses = train(model, "neuron", 5, tokens, targets)
    neuron_seconds = time.perf_counter() - start
    start = time.perf_counter()
    reference_losses = train(reference, "cpu", 5, tokens, targets)
    cpu_seconds = time.perf_counter() - start

    with torch.no_grad():
        out = model(tokens.to("neuron"))
        out_cpu = reference(tokens)
    diff = (out.cpu() - out_cpu).abs().max().item()
    print(f"ran: TinyTransformer ({sum(p.numel() for p in model.parameters())} parameters), "
          f"5 AdamW steps + a forward, on {out.device}")
    print(f"loss on neuron: {' '.join(f'{v:.4f}' for v in losses)}")
    print(f"loss on cpu:    {' '.join(f'{v:.4f}' for v in reference_losses)}")
    print(f"max |neuron - cpu| of the logits: {diff:.3g}")
    print(f"time: neuron {neuron_seconds:.3f} s, cpu {cpu_seconds:.3f} s")
    print(f"neuron:0 memory allocated: {torch.neuron.memory_allocated(0) / 2**20:.2f} MiB "
          f"(peak {torch.neuron.max_memory_allocated(0) / 2**20:.2f} MiB)")
    if diff > 1e-4:
        raise SystemExit("neuron and cpu disagree")


if __name__ == "__main__":
    main()
