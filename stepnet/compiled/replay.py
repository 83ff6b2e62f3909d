"""A run of a step net whose timesteps all ran compiled, kept to run again (stepnet.runtime.steps.StepLoop.keep):
for inputs of the same signature (type, shape and dtype of every input) a rerun copies the initial states into
their rows, runs each timestep's compiled routine and points the aliases at their views, with every check and
lookup of the first run already done. A rerun that does not apply (another signature, a state blob given
another value, a step net whose compiled program no longer matches its inputs) changes nothing and says so;
the op then runs in full."""
from __future__ import annotations

import numpy as np

from .inputs import external_blobs


def timesteps(T: int) -> np.ndarray:
    """One run's timestep values: row t (a view, t:t+1) is timestep t's int32 [t], one allocation per run."""
    return np.arange(T, dtype=np.int32)


class Replay:
    """states: (blob, state array, its first rows, the shape an input takes there or None, input index) per
    recurrent state; aliases: (blob, view); scratch: (the step-workspaces blob, its value); steps: (timestep
    blob, bound step net) per timestep in the order they ran."""
    __slots__ = ("signature", "states", "scratch", "steps", "aliases", "compiler", "T", "covered", "routines",
                 "timesteps")

    def __init__(self, signature, states, scratch, steps, aliases, compiler, T, covered, fixed):
        self.signature, self.states, self.scratch, self.steps = signature, states, scratch, steps
        self.aliases, self.compiler, self.T, self.covered = aliases, compiler, T, covered
        self.routines = None   # each timestep's compiled routine, looked up on the first rerun
        self.timesteps = fixed   # each timestep's [t], kept when no step op writes the timestep blob

    @classmethod
    def of(cls, compiler, steps, inputs, known, states, aliases, scratch, writes_timestep: bool) -> "Replay | None":
        """known: the op's input blobs and the state blobs. covered: whether every blob the step net reads
        before writing it is one of those or the timestep, so that the op's signature and the state arrays
        decide the step net's: then a rerun skips the compiler's own signature check (StepCompiler.start)
        and only begins its program. writes_timestep: a step op writes the timestep blob (then each rerun
        puts [t] there again)."""
        if any(type(x) is not np.ndarray for x in inputs) or not steps:
            return None
        known = {id(b) for b in (*known, *(blob for blob, _ in steps))}
        covered = all(id(b) in known for _, bound in steps for b in external_blobs(bound))
        T = len(steps)
        whole = None if writes_timestep else timesteps(T)
        fixed = None if whole is None else tuple(whole[t:t + 1] for t in range(T))
        return cls(tuple((x.shape, x.dtype) for x in inputs), tuple(states), scratch, tuple(steps), tuple(aliases),
                   compiler, T, covered, fixed)

    def run(self, inputs, checked: bool = False) -> bool:
        """checked: the caller knows the inputs have this signature (a compiled plain net's own check)."""
        if not checked:
            if len(inputs) != len(self.signature):
                return False
            for x, (shape, dtype) in zip(inputs, self.signature):
                if type(x) is not np.ndarray or x.shape != shape or x.dtype != dtype:
                    return False
        scratch_blob, scratch = self.scratch
        if scratch_blob.value is not scratch:
            return False
        for blob, state, _, _, _ in self.states:
            if blob.value is not state:
                return False
        compiler, steps = self.compiler, self.timesteps
        if steps is None:
            whole = timesteps(self.T)
            steps = [whole[t:t + 1] for t in range(self.T)]
        blob, bound = self.steps[0]
        if self.covered:
            compiler.program.begin(bound)
        else:
            blob.value = steps[0]
            if not compiler.start(bound):     # the step net's own inputs changed: run in full (and recompile)
                return False
        for _, _, rows, shape, r in self.states:
            rows[...] = inputs[r] if shape is None else inputs[r].reshape(shape)
        if self.routines is None:
            self.routines = tuple((blob, compiler.routine(bound, t)) for t, (blob, bound) in enumerate(self.steps))
        for (blob, routine), timestep in zip(self.routines, steps):
            blob.value = timestep
            routine()
        for blob, view in self.aliases:
            if blob.value is not view or not blob.view:
                blob.set_view(view)
        return True
