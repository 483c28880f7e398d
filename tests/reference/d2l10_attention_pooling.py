"""The PyTorch code of d2l 1.0's "Attention Pooling by Similarity" section
(d2l-en v1.0.3, chapter_attention-mechanisms-and-transformers/attention-pooling.md,
the pytorch tab), as the book prints it; sample code under MIT-0.

Written out here (no `d2l` import: `d2l.exp`, `d2l.abs`, `d2l.reshape`,
`d2l.reduce_sum`, `d2l.astype`, `d2l.sin`, `d2l.rand`, `d2l.randn` and
`d2l.arange` are torch's functions of those names) for
tests/fixtures/generate_fixtures_v1_pooling.py.

One function is added: `nadaraya_watson_in_dtype`, the book's
`nadaraya_watson` with the kernel cast to the distances' dtype instead of
float32. The book's cast makes float64 data fail (`y_train @ attention_w` of a
float64 vector and a float32 matrix); in float32 the two are the same
function, which the generator asserts.
"""

import torch


# Define some kernels
def gaussian(x):
    return torch.exp(-x**2 / 2)


def boxcar(x):
    return torch.abs(x) < 1.0


def constant(x):
    return 1.0 + 0 * x


def epanechikov(x):
    return torch.max(1 - torch.abs(x), torch.zeros_like(x))


def f(x):
    return 2 * torch.sin(x) + x


def book_data(n=40):
    """The section's data: 40 sorted points of U[0, 5), y = f(x) + N(0, 1), and
    the validation grid arange(0, 5, 0.1). Draws from torch's global generator,
    as the book does."""
    x_train, _ = torch.sort(torch.rand(n) * 5)
    y_train = f(x_train) + torch.randn(n)
    x_val = torch.arange(0, 5, 0.1)
    y_val = f(x_val)
    return x_train, y_train, x_val, y_val


def nadaraya_watson(x_train, y_train, x_val, kernel):
    dists = torch.reshape(x_train, (-1, 1)) - torch.reshape(x_val, (1, -1))
    # Each column/row corresponds to each query/key
    k = kernel(dists).type(torch.float32)
    # Normalization over keys for each query
    attention_w = k / torch.sum(k, 0)
    y_hat = y_train@attention_w
    return y_hat, attention_w


def nadaraya_watson_in_dtype(x_train, y_train, x_val, kernel):
    dists = torch.reshape(x_train, (-1, 1)) - torch.reshape(x_val, (1, -1))
    k = kernel(dists).type(dists.dtype)
    attention_w = k / torch.sum(k, 0)
    y_hat = y_train@attention_w
    return y_hat, attention_w


def gaussian_with_width(sigma):
    return (lambda x: torch.exp(-x**2 / (2*sigma**2)))


KERNELS = (gaussian, boxcar, constant, epanechikov)
NAMES = ('Gaussian', 'Boxcar', 'Constant', 'Epanechikov')
SIGMAS = (0.1, 0.2, 0.5, 1)
