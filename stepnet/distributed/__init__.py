"""Many processes, one job: the ranks of an MPI job (world), the collectives over them (MPI, NCCL) and the
`mpiexec` launcher the command line uses."""
