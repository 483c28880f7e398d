"""d2l 1.0's FashionMNIST (d2l-en v1.0.3, section "The Image Classification
Dataset", sec_fashion_mnist; d2l/torch.py 1.0.3, MIT-0), and the same
transform without torchvision.

The book's class needs torchvision, which neither Python here has; its
transform, `transforms.Resize(resize)` then `transforms.ToTensor()` on the PIL
image that torchvision's FashionMNIST makes of each 28 x 28 byte array, comes
down to PIL's `Image.resize((W, H), Image.BILINEAR)` (torchvision's
`_functional_pil.resize` with a sequence size) and a division by 255 in
float32: `book_transform` below, which the fixture generator uses.
"""

import numpy as np
import torch

try:  # the book's imports; only the class below needs them
    import torchvision
    from torchvision import transforms
except ImportError:
    torchvision = transforms = None


class DataModule:
    """d2l.DataModule's part that FashionMNIST uses."""
    def __init__(self, root='../data', num_workers=4):
        self.root, self.num_workers = root, num_workers

    def train_dataloader(self):
        return self.get_dataloader(train=True)

    def val_dataloader(self):
        return self.get_dataloader(train=False)


class FashionMNIST(DataModule):
    """The Fashion-MNIST dataset (as in the book; save_hyperparameters spelt out)."""
    def __init__(self, batch_size=64, resize=(28, 28)):
        super().__init__()
        self.batch_size, self.resize = batch_size, resize
        trans = transforms.Compose([transforms.Resize(resize),
                                    transforms.ToTensor()])
        self.train = torchvision.datasets.FashionMNIST(
            root=self.root, train=True, transform=trans, download=True)
        self.val = torchvision.datasets.FashionMNIST(
            root=self.root, train=False, transform=trans, download=True)

    def text_labels(self, indices):
        """Return text labels."""
        labels = ['t-shirt', 'trouser', 'pullover', 'dress', 'coat',
                  'sandal', 'shirt', 'sneaker', 'bag', 'ankle boot']
        return [labels[int(i)] for i in indices]

    def get_dataloader(self, train):
        data = self.train if train else self.val
        return torch.utils.data.DataLoader(data, self.batch_size, shuffle=train,
                                           num_workers=self.num_workers)


def book_transform(image, resize):
    """The book's Compose([Resize(resize), ToTensor()]) on one 28 x 28 uint8
    array, as torchvision runs it: a PIL image of mode L, resized with
    BILINEAR to (W, H) (skipped by PIL when the size stays), then bytes / 255
    in float32, shape (1, H, W)."""
    from PIL import Image
    h, w = resize
    pil = Image.fromarray(np.ascontiguousarray(image), mode="L").resize((w, h), Image.BILINEAR)
    data = torch.from_numpy(np.array(pil, dtype=np.uint8))
    return data.to(torch.float32).div(255).unsqueeze(0)
