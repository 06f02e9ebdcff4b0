"""A small training loop as a new user writes it: the readiness report's worked example."""
import torch

torch.manual_seed(0)
x = torch.randn(64, 16, device="neuron")
y = torch.randn(64, 1, device="neuron")
w = torch.zeros(16, 1, device="neuron", requires_grad=True)
optimizer = torch.optim.SGD([w], lr=0.1)
for step in range(10):
    optimizer.zero_grad()
    loss = ((x @ w - y) ** 2).mean()
    loss.backward()
    optimizer.step()
    print(f"step {step}: loss {loss.item():.4f}")
with torch.no_grad():
    check = (w.double() * 3).sum()
print("check", float(check))
