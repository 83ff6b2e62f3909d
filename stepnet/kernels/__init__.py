"""The arithmetic, once: functions of arrays that write into caller-given outputs. An interpreted kernel
(stepnet.ops) allocates its results and calls them; a compiled form (stepnet.compiled) passes its buffers. So
the two runners compute the same thing by construction, on any CPU and BLAS kernel."""
