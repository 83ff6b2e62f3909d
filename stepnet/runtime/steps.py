"""Running a step net once per timestep: what RecurrentNetwork and its gradient ask their context for
(OpContext.step_loop), as ONNX's Scan holds an evaluator. The op prepares the step workspaces and the state
tensors and says in what order the timesteps run; the loop binds the step net in each timestep's workspace,
writes t into its timestep blob and runs it, op by op or compiled (stepnet.compiled): the first timestep of a
run with a new signature runs op by op, and the program is compiled from it; later timesteps run its routine.
A forward run whose timesteps all ran compiled may be kept (keep) and run again for inputs of the same
signature (rerun: stepnet.compiled.replay). Which of these a run takes is decided here, never in the op."""
from __future__ import annotations

from ..compiled.program import StepCompiler
from ..compiled.replay import Replay, timesteps
from ..core.errors import MissingBlobError
from .profile import active_observers


def missing_step_input(e: MissingBlobError, timestep: str) -> MissingBlobError:
    """A step net's missing input, reported with the timestep blob's name: a step net reading another timestep
    name than the op's `timestep` argument is the usual cause (Caffe2 fails the same way: "Encountered a
    non-existing input blob")."""
    return MissingBlobError(f"{e.message}. The step net's inputs must be op inputs, link internals, blobs made by "
                            f"earlier step ops, or the timestep blob, which argument 'timestep' names {timestep!r}",
                            at=e.at, detail=e.detail)


class StepLoop:
    """One step net of one op, run over the timesteps of each of the op's runs."""

    def __init__(self, net, local, timestep: str, strict: bool, level: int, compile: bool):
        self.net, self.local, self.timestep, self.strict, self.level = net, tuple(local), timestep, strict, level
        # [t] in step t's timestep blob every run, unless a step op writes it; one that writes it other than in
        # place keeps the net op by op: a compiled routine would take the blob for a buffer of its own, where the
        # loop puts [t] before every timestep
        writers = [op for op in net.op if timestep in op.output]
        in_place = all(timestep in op.input for op in writers)
        self.writes_timestep = bool(writers)
        self.compiler = StepCompiler(compile and in_place, constant=frozenset(() if writers else (timestep,)))
        self.replay: Replay | None = None
        self.steps: list = []        # (timestep blob, bound net) of the last run, in the order its timesteps ran
        self.compiled = False        # whether every timestep of the last run ran compiled

    def run(self, workspaces, order) -> None:
        """Run the step net for each t of `order` (ascending or descending), bound in workspaces[t], with [t] in
        its timestep blob."""
        compiler, fast, first, steps = self.compiler, False, True, []
        observed = bool(active_observers())   # an observed run goes op by op, every op told to the observers
        compiler.cycle = len(workspaces) != len({id(w) for w in workspaces})   # (forward-only: a few, in turn)
        values = timesteps(len(workspaces))
        net, local, strict, level = self.net, self.local, self.strict, self.level
        for t in order:
            ws = workspaces[t]
            blob = ws.create_blob(self.timestep)
            blob.value = values[t:t + 1]
            try:
                bound = ws.bind(net, local, strict, level)   # once per workspace
            except MissingBlobError as e:
                raise missing_step_input(e, self.timestep) from None
            steps.append((blob, bound))
            if observed:
                bound.run_ops()
            elif first:
                first, fast = False, compiler.start(bound)
                if fast:
                    compiler.run(bound, t)
                else:
                    compiler.interpret(bound, len(workspaces))   # op by op, and compiled from it when due
                    fast = compiler.program is not None
            elif fast:
                compiler.run(bound, t)
            else:
                bound.run()
        self.steps, self.compiled = steps, fast

    def keep(self, inputs, known, states, aliases, scratch) -> None:
        """After a forward run: keep it for rerun when every timestep ran compiled (Replay.of says what the
        arguments are); otherwise forget any earlier one."""
        self.replay = Replay.of(self.compiler, self.steps, inputs, known, states, aliases, scratch,
                                self.writes_timestep) if self.compiled else None

    def rerun(self, inputs, checked: bool = False) -> bool:
        """Run the kept run again for these inputs; False, having changed nothing, when none applies."""
        replay = self.replay
        if replay is None or active_observers():   # observers are told of every op: the op runs in full
            return False
        if replay.run(inputs, checked):
            return True
        self.replay = None
        return False
