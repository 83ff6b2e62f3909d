"""The step-net compiler: a bound step net, specialized to the shapes of one run, as a straight-line routine.

A RecurrentNetwork op (forward or gradient) keeps a StepCompiler. At the first timestep of a run it compares
the signature of the step net's external inputs (type, shape and dtype of every blob the net reads before
writing it) with the compiled one. When they differ, that timestep runs op by op (every kernel check, every
error message as before) and the program is built from its arrays: each op's compiled form
(kernels.compiled_form) and what each output is:

- a view: a link internal, whose rows the link op points at each timestep; the op writes into it (what
  Blob.set's write-through does);
- in place: the op's input blob too (Sum into a gradient, the RNN accumulate ops);
- a buffer: a blob of the step workspace or of the workspace the steps share, allocated once per step
  workspace and rewritten every timestep (each op's result used to be a fresh array).

An op without a compiled form, an output in an outer workspace written other than in place, a view output
overlapping an input, or a non-numpy input leaves the net interpreted. Every later timestep runs the routine
of its step workspace: one call per op on the blobs' current arrays, no dispatch, checks or allocation.
"""
from __future__ import annotations

import numpy as np

from ..executor import _failure
from .fused import enabled
from .kernels import compiled_form

_BUFFER, _VIEW, _INPLACE, _LINKS = "buffer", "view", "in place", "links"


def external_blobs(net) -> list:
    """The Blobs a bound net reads before any of its ops writes them."""
    written, external, seen = set(), [], set()
    for bop in net.ops:
        for blob in bop.inputs:
            if id(blob) not in written and id(blob) not in seen:
                seen.add(id(blob))
                external.append(blob)
        written.update(id(b) for b in bop.outputs)
    return external


def signature(blobs) -> tuple | None:
    """(shape, dtype) of every external input, or None when one is not a numpy array."""
    sig = []
    for blob in blobs:
        v = blob.value
        if type(v) is not np.ndarray:
            return None
        sig.append((v.shape, v.dtype))
    return tuple(sig)


def _owned(ws, blob) -> bool:
    """Whether blob belongs to the step workspace or to the workspace shared by the steps."""
    return any(w is not None and w.local_blob(blob.name) is blob for w in (ws, ws.parent))


def _writes_in_place(bop, blob) -> bool:
    """Whether the interpreted op writes this input's array in place too (so an outer blob may be written)."""
    schema = bop.schema
    pairs = {(i, o) for i, b in enumerate(bop.inputs) for o, c in enumerate(bop.outputs) if b is blob and c is blob}
    return bool(pairs & set(schema.enforce_inplace)) or ((0, 0) in pairs and schema.inplace_kernel is not None)


def _kinds(net, bop, ins, outs, views, buffers) -> list | None:
    """What each output of a compiled op is (in place, a view, a buffer; see the module doc), or None when
    one cannot be written by a compiled routine."""
    kinds = []
    for blob, value in zip(bop.outputs, outs):
        if any(blob is b for b in bop.inputs):
            if not (id(blob) in views or _owned(net.workspace, blob) or _writes_in_place(bop, blob)):
                return None
            kinds.append((_INPLACE, None, None))
        elif id(blob) in views:
            if not blob.view or any(np.may_share_memory(value, x) for x in ins):
                return None
            kinds.append((_VIEW, None, None))
        elif _owned(net.workspace, blob):
            spec = (value.shape, value.dtype)
            if buffers.setdefault(id(blob), spec) != spec:
                return None
            kinds.append((_BUFFER, *spec))
        else:
            return None
    return kinds


def _fused_pair(net, i, fast, views, buffers) -> tuple | None:
    """(the fused form of op i with the Sum j that first reads op i's output, the kinds of the Sum's outputs,
    j), or None: only where op i's form can fuse, and no op between them touches the FC's output or the Sum's
    other input or output (so the Sum may run right after op i: the same values). Every output is written."""
    if fast.fuse is None:
        return None
    y = net.ops[i].outputs[0]
    j = next((k for k in range(i + 1, len(net.ops)) if any(b is y for b in net.ops[k].inputs)), None)
    if j is None or net.ops[j].opdef.type != "Sum":
        return None
    nxt = net.ops[j]
    touched = {id(b) for b in (*nxt.inputs, *nxt.outputs)}
    if any(id(b) in touched for k in range(i + 1, j) for b in (*net.ops[k].inputs, *net.ops[k].outputs)):
        return None
    ins, outs = [b.value for b in nxt.inputs], [b.value for b in nxt.outputs]
    if not all(type(v) is np.ndarray for v in ins + outs) or compiled_form(nxt, ins, outs) is None:
        return None
    kinds = _kinds(net, nxt, ins, outs, views, buffers)
    pair = fast.fuse(nxt, [b.value for b in net.ops[i].inputs] + ins, outs) if kinds is not None else None
    return None if pair is None else (pair, kinds, j)


class Program:
    """Per op of the step net: its compiled form and what each of its outputs is."""

    def __init__(self, ops, begins=()):
        self.ops = ops   # [(Fast, [(kind, shape, dtype) per output], (op index, ...))]: in the order they run
        self.begins = tuple(begins)   # [(op index, input index, fn)]: each op's per-run setup (Fast.begin)

    @classmethod
    def of(cls, net) -> "Program | None":
        """The program of a bound step net that has just run one timestep, or None when it cannot be
        compiled. With the fused kernels on, an FC whose output a Sum reads next takes that Sum into its entry
        (FC bias + Sum; not under --profile, which times every op)."""
        if net.check_nan or net.mixed_devices:
            return None
        fused, profiled = enabled(net.workspace), net.workspace.profiler is not None   # --profile: op by op
        ops, views, buffers, taken = [], set(), {}, set()
        for i, bop in enumerate(net.ops):
            if i in taken:
                continue
            ins, outs = [b.value for b in bop.inputs], [b.value for b in bop.outputs]
            if any(type(v) is not np.ndarray for v in ins):
                return None
            fast = compiled_form(bop, ins, outs, fused) if all(type(v) is np.ndarray for v in outs) or \
                bop.opdef.type == "rnn_internal_apply_links" else None
            if fast is None:
                return None
            if fast.blobs:
                views.update(id(b) for b in bop.outputs)
                ops.append((fast, [(_LINKS, None, None)] * len(outs), (i,)))
                continue
            kinds = _kinds(net, bop, ins, outs, views, buffers)
            if kinds is None:
                return None
            indices = (i,)
            pair = _fused_pair(net, i, fast, views, buffers) if fused and not profiled else None
            if pair is not None:
                fast, kinds, indices = pair[0]._replace(begin=fast.begin), kinds + pair[1], (i, pair[2])
                taken.add(pair[2])
            ops.append((fast, kinds, indices))
        written = {id(b) for bop in net.ops for b in bop.outputs}
        begins = [(at[0], fast.begin[0], fast.begin[1]) for fast, _, at in ops
                  if fast.begin is not None and id(net.ops[at[0]].inputs[fast.begin[0]]) not in written]
        return cls(ops, begins)

    def begin(self, net) -> None:
        """Once per run, before its compiled timesteps: each op's per-run setup from its input's array (an
        input the step net never writes, so it holds for every timestep of the run)."""
        for k, index, fn in self.begins:
            fn(net.ops[k].inputs[index].value)

    def routine(self, net):
        """The routine of one step workspace's bound net: its buffers allocated (and bound to its blobs) now."""
        entries, profiler, starts = [], net.workspace.profiler, []
        for fast, kinds, at in self.ops:
            bops = [net.ops[k] for k in at]
            inputs = tuple(b for bop in bops for b in bop.inputs)
            outputs = tuple(b for bop in bops for b in bop.outputs)
            for blob, (kind, shape, dtype) in zip(outputs, kinds):
                if kind == _BUFFER:
                    blob.value = np.empty(shape, dtype)
                    blob.view = False
            fn = fast.fn if fast.rebind is None else fast.rebind(bops[0])
            if profiler is not None:   # --profile: each compiled op timed as its interpreted op would be
                fn = profiler.timed(fn, net.name, bops[0].index, bops[0].opdef.type)
            entries.append((fn, inputs, outputs, fast.blobs))
            starts.append(at[0])
        ops = net.ops

        def run() -> None:
            k = 0
            try:
                for fn, ins, outs, blobs in entries:
                    fn([b.value for b in ins], outs if blobs else [b.value for b in outs])
                    k += 1
            except Exception as e:  # noqa: BLE001 - named after the op, as the executor does
                bop = ops[starts[k]]
                error = _failure(bop, [b.value for b in bop.inputs], e)
                if error is e:
                    raise
                raise error from e
        return run


class StepCompiler:
    """What a RecurrentNetwork op keeps to run its step net compiled: the program for the current input
    signature and one routine per bound step net (per step workspace).

    Per run: `start(net)` at the first timestep says whether the routine runs it; when it does not, the caller
    runs the net and then calls `built(net)`; `run(net)` runs a timestep compiled."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.signature = None
        self.program: Program | None = None
        self.pending = False
        self.routines: dict[int, tuple] = {}
        self.externals: dict[int, tuple] = {}

    def start(self, net) -> bool:
        if not self.enabled:
            return False
        entry = self.externals.get(id(net))
        if entry is None or entry[0] is not net:
            entry = self.externals[id(net)] = (net, external_blobs(net))
        sig = signature(entry[1])
        if sig is not None and sig == self.signature and not self.pending:
            if self.program is None:
                return False
            self.program.begin(net)
            return True
        self.signature, self.program, self.routines, self.pending = sig, None, {}, sig is not None
        return False

    def built(self, net) -> None:
        """After the first timestep of a run ran op by op: compile from its arrays (once per signature)."""
        if self.pending:
            self.pending = False
            self.program = Program.of(net)
            if self.program is not None:
                self.program.begin(net)

    def run(self, net) -> None:
        entry = self.routines.get(id(net))
        if entry is None or entry[0] is not net:
            entry = self.routines[id(net)] = (net, self.program.routine(net))
        entry[1]()
