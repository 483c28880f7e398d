"""Trains nothing: builds the book's MultiHeadAttention (d2l 0.17, the PyTorch code
in tests/reference/d2l_book.py) from seed 0, runs it on random queries and keys,
and saves what examples/load_python_weights.cpp needs to do the same in C++:

  mha_state_dict.pt  torch.save(model.state_dict()), as a Python user saves weights
  mha_io.pt          the inputs, the output and the attention weights

    /usr/bin/python3 examples/python_weights.py OUT_DIR     (make python-weights)
"""

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "reference"))
from d2l_book import MultiHeadAttention  # noqa: E402


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "python_weights"
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    net = MultiHeadAttention(100, 100, 100, 100, 5, 0.5)
    net.eval()
    queries = torch.randn(2, 4, 100)
    keys = torch.randn(2, 6, 100)
    valid_lens = torch.tensor([3, 2])
    with torch.no_grad():
        output = net(queries, keys, keys, valid_lens)
    torch.save(net.state_dict(), os.path.join(out, "mha_state_dict.pt"))
    torch.save({"queries": queries, "keys": keys, "valid_lens": valid_lens, "output": output,
                "attention_weights": net.attention.attention_weights},
               os.path.join(out, "mha_io.pt"))
    print(f"Python (torch {torch.__version__}): saved {list(net.state_dict())} to {out}/")
    print("output[0, 0, :5]:", " ".join(f"{v:.5f}" for v in output[0, 0, :5].tolist()))
    print("attention_weights[0]:")
    for row in net.attention.attention_weights[0].tolist():
        print("  " + " ".join(f"{v:.4f}" for v in row))


if __name__ == "__main__":
    main()
