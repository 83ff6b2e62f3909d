"""The optional extras (pyproject.toml's optional-dependencies; a test keeps the two equal) and the one install
hint every message gives for them: the packages themselves, so that it works as printed wherever stepnet was
installed from (a checkout, a wheel, a copy)."""
from __future__ import annotations

import shlex

EXTRAS = {
    "fast": ("numba>=0.60",),
    "gpu": ("cupy>=12",),
    "image": ("Pillow>=9",),
    "plots": ("matplotlib>=3.5",),
    "onnx": ("onnx>=1.16", "onnxruntime>=1.18"),
    "mpi": ("mpi4py>=4", "mpich"),
    "databases": ("lmdb>=1.4", "plyvel>=1.5"),
}


def install_hint(extra: str) -> str:
    """'pip install PACKAGES (stepnet's `extra` extra)'."""
    return f"pip install {' '.join(shlex.quote(p) for p in EXTRAS[extra])} (stepnet's `{extra}` extra)"
