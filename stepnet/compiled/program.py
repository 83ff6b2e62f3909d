"""The step-net compiler: a bound step net, specialized to the shapes of one run, as a straight-line routine.

A RecurrentNetwork op (forward or gradient) keeps a StepCompiler. At the first timestep of a run it compares
the signature of the step net's external inputs (type, shape and dtype of every blob the net reads before
writing it) with the compiled one. When they differ, that timestep runs op by op (every kernel check, every
error message as before) and the program is built from its arrays, as each op saw and left them (the trace
of Net.run_ops: a blob written twice holds only the later op's value at the end): each op's compiled form
(kernels.compiled_form) and what each output is:

- a view: a link internal, whose rows the link op points at each timestep; the op writes into it (what
  Blob.set's write-through does);
- in place: the op's input blob too (Sum into a gradient, the RNN accumulate ops), of the same shape and dtype;
- a buffer: a blob of the step workspace or of the workspace the steps share, allocated once per step
  workspace and rewritten every timestep (each op's result used to be a fresh array); a blob two ops write
  as buffers only where both wrote the same shape and dtype.

An op without a compiled form, an output in an outer workspace written other than in place, a view output
overlapping an input, or a non-numpy input leaves the net interpreted. Every later timestep runs the routine
of its step workspace: one call per op on the blobs' current arrays, no dispatch, checks or allocation.

Plain nets run many times (a predict net called per character, per image) compile the same way, per run
instead of per timestep (`StepCompiler(main=True)`, kept by every top-level executor.Net): the first two runs
with a new signature of the net's external inputs run op by op and the program is built from the second's
arrays; later runs of that signature run the routine. Their buffers are the net's own blobs, reused from run to run as
Caffe2 reuses a tensor's memory, but only while nothing else holds one (a user's reference, another blob: then
that run gets a fresh array, so no earlier value ever changes under its holder); a blob the net reads before
writing it keeps being written only by ops that write it in place in the interpreted net too. An op of a
plain net with no form of its own (none for these arrays, Conv, Print, the gradient ops) runs by its
`results` form: its bound kernel called as the executor calls it, its results stored into its blobs, no
dispatch. An op whose output shapes follow its inputs' values (schema.shapes_from_inputs false) is checked
after each call against the run the program was built from, and a form that meets values it does not cover
(a Reshape's new shape input, a read-only weight for WeightedSum) says so before it changes anything: either
way (Unsettled) the rest of that run goes op by op, as the interpreted net would run it.
"""
from __future__ import annotations

import sys
import types

import numpy as np

from ..ops.binding import failure as _failure
from .entries import BUFFER, LINKS, fused_group, fused_pair, kinds_of
from .forms import Unsettled, compiled_form, results, sets_blobs
from .inputs import Inputs, external_blobs
from .prebound import Prebound

class Program:
    """Per op of the step net: its compiled form and what each of its outputs is."""

    def __init__(self, ops, begins=(), main: bool = False):
        self.ops = ops   # [(Fast, [(kind, shape, dtype) per output], (op index, ...))]: in the order they run
        self.begins = tuple(begins)   # [(op index, input index, fn)]: each op's per-run setup (Fast.begin)
        self.main = main              # a plain net's program: its buffers are checked out per run
        self.buffers: dict = {}       # id(blob) -> (blob, buffer) of a step net's buffer blobs (Program._buffer)
        self.codes: dict = {}         # the bound step routines' generated code (compiled.prebound), by source

    @classmethod
    def of(cls, net, trace: list, main: bool = False, steps: int = 1) -> "Program | None":
        """The program of a bound step net that has just run one timestep of a run of `steps` (main: a plain net
        that has just run; trace: each op's input and output values then, Net.run_ops), or None when it cannot
        be compiled.
        With the fused kernels on, an FC whose output a Sum reads next takes that Sum into its entry (FC bias +
        Sum), and the GRU step's eleven ops are one entry (compiled.gru_step); not under --profile, which times
        every op."""
        if net.check_nan or net.mixed_devices:
            return None
        fused, profiled = net.workspace.jit_kernels(), net.workspace.profiler is not None   # --profile: op by op
        ops, views, buffers, taken = [], set(), {}, set()
        outer = ({id(b) for b in external_blobs(net)},) if main else None
        limit = net.workspace.limits.max_blob_bytes
        for i, bop in enumerate(net.ops):
            if i in taken:
                continue
            group = fused_group(net, i, views, buffers, outer, trace, steps) if fused and not profiled else None
            if group is not None:      # (the GRU step's eleven ops as one entry: compiled.gru_step)
                ops.append(group)
                taken.update(group[2])
                continue
            ins, outs = trace[i]
            arrays = all(type(v) is np.ndarray for v in ins)
            fast = compiled_form(bop, ins, outs, fused, main, steps) if arrays and (
                all(type(v) is np.ndarray for v in outs) or sets_blobs(bop)) else None
            if fast is None and main:
                fast = results(bop, limit, outs)
            if fast is None:
                return None
            if fast.blobs:
                if any(id(b) in buffers for b in bop.outputs):
                    return None      # (a buffer's blob replaced by another op's result: see entries.kinds_of's views)
                views.update(id(b) for b in bop.outputs)
                ops.append((fast, [(LINKS, None, None)] * len(outs), (i,)))
                continue
            kinds = kinds_of(net, bop, ins, outs, views, buffers, outer, fast.reads_first)
            if kinds is None:
                return None
            indices = (i,)
            pair = fused_pair(net, i, fast, views, buffers, outer, trace) if fused and not profiled else None
            if pair is not None:
                fast, kinds, indices = pair[0]._replace(begin=fast.begin), kinds + pair[1], (i, pair[2])
                taken.add(pair[2])
            ops.append((fast, kinds, indices))
        written = {id(b) for bop in net.ops for b in bop.outputs}
        begins = [(at[j], index, fn) for fast, _, at in ops
                  for j, index, fn in ((() if fast.begin is None else ((0, *fast.begin),)) + fast.begins)
                  if id(net.ops[at[j]].inputs[index]) not in written]
        return cls(ops, begins, main)

    def _buffer(self, net, blob, shape, dtype):
        """The blob's buffer. A step net's blob has one, made at its first routine, that every routine writing
        the blob shares: all the routines of its bound net (a forward-only op's few workspaces run one routine per
        timestep) and, for a blob of the workspace the steps share (a backward-only temporary), every step
        workspace's (each step binds its arrays: compiled.prebound). A plain net's blob keeps the array its op
        made in the run the program was built from where it fits (its own memory, C-contiguous, writeable): no
        second copy of it while the first is still held (_checkout replaces it at the first run if anything
        besides the blob holds it)."""
        if self.main:
            cur = blob.value
            if (type(cur) is np.ndarray and not blob.view and cur.shape == shape and cur.dtype == dtype
                    and cur.base is None and cur.flags.c_contiguous and cur.flags.writeable):
                return cur
            return np.empty(shape, dtype)
        found = self.buffers.get(id(blob))
        if found is None or found[0] is not blob:
            found = self.buffers[id(blob)] = (blob, np.empty(shape, dtype))
        return found[1]

    def begin(self, net) -> None:
        """Once per run, before its compiled timesteps: each op's per-run setup from its input's array (an
        input the step net never writes, so it holds for every timestep of the run)."""
        for k, index, fn in self.begins:
            fn(net.ops[k].inputs[index].value)

    def routine(self, net, constant: frozenset = frozenset()):
        """The routine of one step workspace's bound net (or of a plain net): its buffers allocated (and bound
        to its blobs) now. run() -> False when it does not apply to this run (a plain net's buffer blob made a
        view by another net): the net then runs op by op. A step net's routine (run for one timestep of every
        run) binds each entry to its arrays once (compiled.prebound); constant: names of blobs whose value is
        the same each run (its timestep)."""
        entries, profiler, starts, ends, buffers, forms = [], net.workspace.profiler, [], [], {}, []
        for k, (fast, kinds, at) in enumerate(self.ops):
            bops = [net.ops[k] for k in at]
            inputs = tuple(b for bop in bops for b in bop.inputs)
            outputs = tuple(b for bop in bops for b in bop.outputs)
            for blob, (kind, shape, dtype) in zip(outputs, kinds):
                if kind == BUFFER:
                    blob.value = self._buffer(net, blob, shape, dtype)
                    blob.view = False
                    buffers.setdefault(id(blob), (blob, shape, dtype, k))     # (k: the entry that writes it)
            fn = fast.fn if fast.rebind is None else fast.rebind(bops[0])
            if profiler is not None:   # --profile: each compiled op timed as its interpreted op would be
                fn = profiler.timed(fn, net.name, bops[0].index, bops[0].opdef.type)
            entries.append((fn, inputs, outputs, fast.blobs))
            forms.append(fast)
            starts.append(at[0])
            ends.append(at[-1])
        ops, (checkout, restore) = net.ops, _checkout(list(buffers.values())) if self.main else (None, None)
        n = len(entries)
        bound = None
        if self.main or profiler is not None:
            body, at = _straight_line(entries)
        else:
            at = [0]
            bound = Prebound(entries, forms, {id(b) for b in external_blobs(net) if b.name not in constant}, at,
                             self.codes)
            body = bound.run

        def run() -> bool:
            if checkout is not None and not checkout():
                return False
            try:
                body()
            except Unsettled as e:      # (a plain net's op met other values: the rest of this run op by op)
                restore(n)
                net.run_ops(start=starts[at[0]] if e.redo else ends[at[0]] + 1)
            except Exception as e:  # noqa: BLE001 - named after the op, as the executor does
                if restore is not None:
                    restore(at[0])      # (the blobs of the ops not run hold what they held, as op by op)
                bop = ops[starts[at[0]]]
                error = _failure(bop, [b.value for b in bop.inputs], e)
                if error is e:
                    raise
                raise error from e
            else:
                if restore is not None:
                    restore(n)          # (lets go of what checkout took)
            return True
        run.bound = bound     # (its Prebound, for tests and profiles; None: straight-line)
        return run


def _straight_line(entries) -> tuple:
    """(body, at): body() calls every entry's fn in order on its blobs' current values, as straight-line code
    generated once (no loop over entries, no building of argument lists by iteration); at[0] is the index of
    the entry running, for the error of one that raises. The source holds only generated names (f0, i0_1,
    ...), never a blob's or op's name."""
    names, lines, at = {}, [], [0]
    for i, (fn, ins, outs, blobs) in enumerate(entries):
        names[f"f{i}"] = fn
        names.update((f"i{i}_{j}", b) for j, b in enumerate(ins))
        if blobs:
            names[f"o{i}"], out = outs, f"o{i}"
        else:
            names.update((f"o{i}_{j}", b) for j, b in enumerate(outs))
            out = "[" + ", ".join(f"o{i}_{j}.value" for j in range(len(outs))) + "]"
        args = ", ".join(f"i{i}_{j}.value" for j in range(len(ins)))
        lines += [f"    at[0] = {i}", f"    f{i}([{args}], {out})"]
    names["at"] = at
    exec("def body():\n" + "\n".join(lines or ["    pass"]) + "\n", names)   # noqa: S102 - generated names only
    return names["body"], at


def _checkout(buffers) -> tuple:
    """(checkout, restore) of a plain net's buffers [(blob, shape, dtype, the entry writing it)].

    checkout() -> bool, before each run: every buffer blob gets its buffer back (a value fed in between is
    replaced, as the op would replace it), or a new one when something besides the blob holds the buffer (a
    reference the user kept, another blob it was given to), so no value an earlier run made changes under its
    holder. False, changing nothing, when a buffer blob has been made a view (interpreted, an op writes through
    it). restore(at) after the run's entries: the blobs of entries from `at` on get back the values checkout
    took from them (a run that fails at entry `at` leaves the later ops' blobs as op by op would);
    restore(number of entries) lets go of them."""
    held = [blob.value for blob, _, _, _ in buffers]
    refs = sys.getrefcount
    taken = []         # (entry, blob, the value checkout took from it) in this run

    def others(i: int, blob) -> int:
        """References to buffer i besides the blob's, counted the same way each time (the count of a buffer
        nothing else holds is taken below through this same function, so an interpreter that counts the
        references of a frame differently still compares like with like)."""
        buf = held[i]
        return refs(buf) - (blob.value is buf)

    held.append(np.empty(0))              # a buffer nothing else holds, counted the same way
    alone = others(len(held) - 1, types.SimpleNamespace(value=held[-1]))
    held.pop()

    def restore(at: int) -> None:
        for k, blob, value in taken:
            if k >= at:
                blob.value = value
        taken.clear()

    def checkout() -> bool:
        i = 0
        for blob, shape, dtype, k in buffers:
            if blob.view:
                restore(0)
                return False
            if others(i, blob) > alone:
                held[i] = np.empty(shape, dtype)
            if blob.value is not held[i]:
                taken.append((k, blob, blob.value))
                blob.value = held[i]
            i += 1
        return True
    return checkout, restore


class StepCompiler:
    """What a RecurrentNetwork op keeps to run its step net compiled (main: what a plain net keeps to run
    compiled): the program for the current input signature and one routine per bound step net (per step
    workspace).

    Per run: `start(net)` at the first timestep says whether the routine runs it; when it does not, the caller
    has `interpret(net)` run it op by op (and compile from it when due); `run(net)` runs a timestep compiled
    (False: it did not apply this time, and the caller runs the net op by op)."""

    def __init__(self, enabled: bool = True, main: bool = False, constant: frozenset = frozenset()):
        self.enabled = enabled
        self.main = main
        self.constant = constant     # blobs whose value is the same each run (a step net's timestep)
        self.cycle = False           # step workspaces run several timesteps (forward-only): a routine per timestep
        self.signature = None
        self.program: Program | None = None
        self.pending = False
        self.again = False     # main: this signature has run once op by op (it compiles after its second run)
        self.routines: dict[int, tuple] = {}
        self.externals: dict[int, Inputs] = {}

    def start(self, net) -> bool:
        if not self.enabled:
            return False
        entry = self.externals.get(id(net))
        if entry is None or entry.net is not net:
            entry = self.externals[id(net)] = Inputs(net)
        sig = entry.signature()
        if sig is not None and sig == self.signature and not self.pending:
            if self.program is None:
                return False
            self.program.begin(net)
            return True
        self.again = self.again and sig is not None and sig == self.signature
        self.signature, self.program, self.routines, self.pending = sig, None, {}, sig is not None
        return False

    def interpret(self, net, steps: int = 1) -> None:
        """Run the net (the first timestep of a run, a plain net's run) op by op when start() said no, and
        compile from the arrays each op saw and made (once per signature). A plain net compiles on its second
        run of a signature (a net run once, as run_net_once and RunOperatorOnce do, never pays for it); its ops
        without a form of their own run by their `results` form. steps: the timesteps of the run (1 for a plain net)."""
        due = self.pending and self.enabled and (self.again or not self.main)
        trace = [] if due else None
        net.run_ops(trace)
        if not self.pending:
            return
        if trace is None:
            self.again = True
        else:
            self.pending = False
            self.program = Program.of(net, trace, self.main, steps)
            if self.program is not None:
                self.program.begin(net)

    def routine(self, net, t: int = 0):
        """The routine of this bound net for timestep t under the current program (made the first time it is
        asked for): one per bound net, or with `cycle` one per timestep, each bound to that timestep's arrays
        (its buffers the net's: Program._buffer)."""
        key = (id(net), t if self.cycle else None)
        entry = self.routines.get(key)
        if entry is None or entry[0] is not net:
            entry = self.routines[key] = (net, self.program.routine(net, self.constant))
        return entry[1]

    def run(self, net, t: int = 0) -> bool:
        return self.routine(net, t)()
