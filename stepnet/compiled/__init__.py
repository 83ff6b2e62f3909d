"""Compiled step nets: a RecurrentNetwork's step net, specialized to one run's shapes, as a straight-line
routine per timestep (program.py) of bound fast callables that write into buffers allocated once
(kernels.py: FC, Sum, links, the deferred FC gradient, the generic form; cells.py: the LSTM cell and its
gradient). A net with an op that has no compiled form runs op by op, as before."""
from .program import StepCompiler

__all__ = ["StepCompiler"]
