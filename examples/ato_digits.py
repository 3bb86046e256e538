"""Auto-Train-Once on scikit-learn's digits: train an MLP 64-128-128-10 once, let the ATO
controller pick which hidden units to drop for half the FLOPs, and cut them out. No
fine-tuning (thesis 002 ch. 4, METHODS card "ATO").

    cd /work/main && PYTHONPATH=. .venv/bin/python examples/ato_digits.py
"""
import torch

from asyncopt.deep import GatedNet, train_ato
from asyncopt.deep.ato import accuracy, digits_train_test

torch.set_num_threads(1)
Xtr, ytr, Xte, yte = digits_train_test()     # standardised, stratified 80 / 20 split

torch.manual_seed(0)
net = GatedNet.mlp((64, 128, 128, 10))
res = train_ato(net, Xtr, ytr, epochs=30, p=0.5, lam=10.0, gamma=4.0, verbose=True)

print(f"kept units per block {[int(m.sum()) for m in res.masks]}, "
      f"FLOPs kept {res.flops_kept:.3f}")
print(f"compact model {res.compact.widths}: test accuracy {accuracy(res.compact, Xte, yte):.4f}")
x = torch.as_tensor(Xte[:100], dtype=torch.float32)
with torch.no_grad():
    print("compact == masked:", torch.allclose(res.compact(x), net(x, res.masks), atol=1e-5))
