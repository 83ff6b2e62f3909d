"""The command line: `stepnet run | inspect | convert | ...` (run: the entry point and the run command; tools:
the commands that look at models without running them), progress and metrics output, the ONNX commands."""
from .run import main

__all__ = ["main"]
