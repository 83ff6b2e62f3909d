"""The bottom layer: errors, what a model may read, write and allocate (limits), the array backends (numpy,
CuPy, emulated) and the tensor specs of static inference. Imports nothing else of stepnet."""
