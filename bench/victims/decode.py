"""Decode-and-augment: the input pipeline of an image model, over images held in memory."""

from __future__ import annotations

import numpy as np

MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)


class DecodeAugment:
    """Each sample: an 8-bit image (256x256x3) is decoded to float32, randomly cropped to
    224x224, flipped half the time, normalised per channel, and written into the batch.
    The images (about 100 MB) are well beyond the last-level cache, so every batch
    streams from memory, as a real loader's decoded buffers do."""

    name = "decode"

    def __init__(self, *, seed: int = 0, images: int = 512, side: int = 256, crop: int = 224, batch: int = 16):
        self.rng = np.random.default_rng(seed)
        self.images = self.rng.integers(0, 256, size=(images, side, side, 3), dtype=np.uint8)
        self.side, self.crop, self.batch = side, crop, batch
        self.out = np.empty((batch, crop, crop, 3), dtype=np.float32)
        self.scratch = np.empty((side, side, 3), dtype=np.float32)
        self.next = 0
        # Bytes read and written per sample: the 8-bit image, its float copy (written,
        # then the crop read back) and the normalised crop (written).
        self.bytes_per_sample = side * side * 3 * (1 + 4) + crop * crop * 3 * 4 * 2

    def step(self) -> tuple[int, int]:
        offsets = self.rng.integers(0, self.side - self.crop + 1, size=(self.batch, 2))
        flips = self.rng.random(self.batch) < 0.5
        for k in range(self.batch):
            np.multiply(self.images[self.next], np.float32(1 / 255), out=self.scratch)
            self.next = (self.next + 1) % len(self.images)
            y, x = offsets[k]
            view = self.scratch[y:y + self.crop, x:x + self.crop]
            if flips[k]:
                view = view[:, ::-1]
            np.subtract(view, MEAN, out=self.out[k])
            self.out[k] /= STD
        return self.batch, self.batch * self.bytes_per_sample
