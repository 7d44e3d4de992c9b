"""Fashion-MNIST as towerlab's loader reads it (samples/fashion_mnist), for the Python
scripts that train or evaluate the PyTorch twins on the same inputs: the tests of
tools/torch_convert.py and bench/models_accuracy.py."""

import gzip
import os

import numpy as np


def load_split(data, prefix):
    """Images [N,1,28,28] standardized exactly as towerlab's loader, labels [N]."""
    with gzip.open(os.path.join(data, f"{prefix}-images-idx3-ubyte.gz")) as f:
        pixels = np.frombuffer(f.read(), dtype=np.uint8, offset=16)
    with gzip.open(os.path.join(data, f"{prefix}-labels-idx1-ubyte.gz")) as f:
        labels = np.frombuffer(f.read(), dtype=np.uint8, offset=8).astype(np.int64)
    unit = pixels.astype(np.float32) / np.float32(255)
    images = (unit - np.float32(0.2860)) / np.float32(0.3530)
    return images.reshape(-1, 1, 28, 28), labels
