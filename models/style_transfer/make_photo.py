"""Draw photo.png, the self-made test picture of this folder (a landscape: sky, sun, hills, a lake, a house).

Run: python make_photo.py  (needs numpy and Pillow). Deterministic; the picture is ours (CC0).
"""
from pathlib import Path

import numpy as np
from PIL import Image

H, W = 192, 256
y, x = np.mgrid[0:H, 0:W].astype(np.float32)
img = np.zeros((H, W, 3), np.float32)

sky = np.clip(y / (0.55 * H), 0, 1)[..., None]
img[:] = (1 - sky) * np.array([70, 130, 220]) + sky * np.array([250, 200, 150])
sun = (x - 0.72 * W) ** 2 + (y - 0.25 * H) ** 2 < (0.09 * H) ** 2
img[sun] = [255, 235, 120]
for amp, base, phase, colour in ((18, 0.58, 0.0, (60, 120, 60)), (12, 0.66, 1.7, (40, 95, 45))):
    ridge = H * base + amp * np.sin(x / W * 2 * np.pi * 1.5 + phase) + 6 * np.sin(x / 9.0)
    img[y > ridge] = colour
lake = (y > 0.78 * H) & ((x - 0.35 * W) ** 2 / (0.3 * W) ** 2 + (y - 0.86 * H) ** 2 / (0.1 * H) ** 2 < 1)
img[lake] = np.array([40, 90, 170]) + 25 * np.sin(x[lake] / 3.0)[..., None]
house = (np.abs(x - 0.8 * W) < 18) & (y > 0.64 * H) & (y < 0.76 * H)
roof = (y <= 0.64 * H) & (y > 0.64 * H - 16 + np.abs(x - 0.8 * W) * 0.8) & (np.abs(x - 0.8 * W) < 22)
img[house] = [200, 60, 50]
img[roof] = [90, 40, 30]
img += np.random.default_rng(0).normal(0, 4, img.shape)
Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(Path(__file__).with_name("photo.png"))
