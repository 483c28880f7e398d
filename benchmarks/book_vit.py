#!/usr/bin/python3
"""The book's Vision Transformer trained on Fashion-MNIST in the book's own
PyTorch code (d2l 1.0, "Transformers for Vision"): the Python side of the
speed comparison with examples/vit_fashion_mnist (docs/vit.md, "Speed").

    /usr/bin/python3 benchmarks/book_vit.py --threads 2 --epochs 1 --train-size 2048 --val-size 1024

The model is tests/reference/d2l10_vit.py's copy of the book's classes; the
training loop is d2l 1.0's Trainer.fit / fit_epoch with the ViT's Classifier
methods (SGD at lr 0.1 made by configure_optimizers before the first batch,
cross-entropy loss, accuracy), the book's recipe by default: img 96, patch 16,
512 hidden, 2048 MLP, 8 heads, 2 blocks, dropouts 0.1, batch 128.

The data are the images examples/vit_fashion_mnist reads: Debian's
dataset-fashion-mnist IDX files (--data), the first --train-size training and
--val-size test images, each transformed as the book's torchvision pipeline
does (Resize on the PIL image, bilinear, then ToTensor), the training set
reshuffled each epoch as the book's DataLoader does; the batches are made in
the training process (the book's DataLoader uses 4 worker processes). The
progress board is left out (it only plots).

It prints, per epoch, the training loss, the validation loss and accuracy and
the epoch's seconds, then `final val_acc A` and the wall time of all epochs.
"""

import argparse
import gzip
import os
import struct
import sys
import time
import warnings

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "tests",
                                "reference"))
from d2l10_vit import ViT  # noqa: E402  (the book's classes)

warnings.filterwarnings("ignore", message="Lazy modules are a new feature")


def read_idx(path):
    """An IDX file (gzipped or not) as a numpy array of uint8."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    zero, dtype, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype != 0x08:
        raise ValueError(f"{path}: not an IDX file of unsigned bytes")
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load_split(root, train, size):
    prefix = "train" if train else "t10k"
    find = lambda name: next(p for p in (os.path.join(root, name + ".gz"), os.path.join(root, name))
                             if os.path.exists(p))
    images = read_idx(find(f"{prefix}-images-idx3-ubyte"))
    labels = read_idx(find(f"{prefix}-labels-idx1-ubyte"))
    if size:
        images, labels = images[:size], labels[:size]
    return images, torch.from_numpy(labels.astype(np.int64))


def to_tensor(image, img_size):
    """torchvision's Resize((img_size, img_size)) on the PIL image, then ToTensor."""
    resized = Image.fromarray(image).resize((img_size, img_size), Image.BILINEAR)
    return torch.from_numpy(np.asarray(resized, dtype=np.float32) / 255).unsqueeze(0)


def batches(images, labels, batch_size, shuffle, img_size):
    order = torch.randperm(len(labels)) if shuffle else torch.arange(len(labels))
    for start in range(0, len(labels), batch_size):
        idx = order[start:start + batch_size]
        X = torch.stack([to_tensor(images[i], img_size) for i in idx.tolist()])
        yield X, labels[idx]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--train-size", type=int, default=0, help="first N training images (0: all)")
    parser.add_argument("--val-size", type=int, default=0, help="first N test images (0: all)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--img-size", type=int, default=96)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    img_size, patch_size = args.img_size, 16
    num_hiddens, mlp_num_hiddens, num_heads, num_blks = 512, 2048, 8, 2
    emb_dropout, blk_dropout, lr = 0.1, 0.1, 0.1
    model = ViT(img_size, patch_size, num_hiddens, mlp_num_hiddens, num_heads,
                num_blks, emb_dropout, blk_dropout, lr)
    train = load_split(args.data, True, args.train_size)
    val = load_split(args.data, False, args.val_size)

    start = time.perf_counter()
    optim = model.configure_optimizers()  # Trainer.fit
    for epoch in range(args.epochs):
        tic = time.perf_counter()
        model.train()  # Trainer.fit_epoch
        total, count = 0.0, 0
        for X, y in batches(*train, args.batch_size, True, img_size):
            loss = model.loss(model(X), y)
            optim.zero_grad()
            with torch.no_grad():
                loss.backward()
                optim.step()
            total += loss.item() * len(y)
            count += len(y)
        model.eval()
        val_loss, val_acc, n = 0.0, 0.0, 0
        for X, y in batches(*val, args.batch_size, False, img_size):
            with torch.no_grad():
                Y_hat = model(X)
                val_loss += model.loss(Y_hat, y).item() * len(y)
                val_acc += model.accuracy(Y_hat, y).item() * len(y)
                n += len(y)
        print(f"epoch {epoch + 1}: train_loss {total / count:.4f}, val_loss {val_loss / n:.4f}, "
              f"val_acc {val_acc / n:.4f}, {time.perf_counter() - tic:.1f} s", flush=True)
    print(f"final val_acc {val_acc / n:.4f}")
    print(f"{args.epochs} epochs in {time.perf_counter() - start:.1f} s "
          f"({args.threads} threads, torch {torch.__version__})")


if __name__ == "__main__":
    main()
