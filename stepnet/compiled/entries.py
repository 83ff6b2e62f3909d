"""The entries of a compiled program: what each output of an op's compiled form is (in place, a link view, a
buffer: compiled.program's module doc), and the entries that take several ops (an FC with the Sum that reads
its output; the whole GRU step, compiled.gru_step)."""
from __future__ import annotations

import numpy as np

from ..ops.binding import writes_over_inputs
from . import gru_step
from .forms import compiled_form, registered_kernel

BUFFER, VIEW, INPLACE, LINKS = "buffer", "view", "in place", "links"


def _owned(ws, blob, main: bool) -> bool:
    """Whether blob belongs to the step workspace or to the workspace shared by the steps (main: to the net's
    own workspace)."""
    return any(w is not None and w.local_blob(blob.name) is blob for w in ((ws,) if main else (ws, ws.parent)))


def _writes_in_place(bop, blob) -> bool:
    """Whether the interpreted op writes this input's array in place too (so an outer blob may be written)."""
    schema = bop.schema
    pairs = {(i, o) for i, b in enumerate(bop.inputs) for o, c in enumerate(bop.outputs) if b is blob and c is blob}
    return bool(pairs & set(schema.enforce_inplace)) or bool(
        pairs and schema.inplace_kernel is not None and writes_over_inputs(schema, bop.opdef))


def kinds_of(net, bop, ins, outs, views, buffers, main: tuple | None = None, overlap: bool = False) -> list | None:
    """What each output of a compiled op is (in place, a view, a buffer; see the module doc), or None when
    one cannot be written by a compiled routine. main: (ids of the external blobs,) of a plain net; overlap:
    the form reads its inputs before writing (Fast.reads_first), so a view output may share their memory."""
    kinds = []
    for blob, value in zip(bop.outputs, outs):
        external = main is not None and id(blob) in main[0]
        if any(blob is b for b in bop.inputs):
            before = ins[next(k for k, b in enumerate(bop.inputs) if b is blob)]
            if not (id(blob) in views or (_owned(net.workspace, blob, main is not None) and not external)
                    or _writes_in_place(bop, blob)) or before.shape != value.shape or before.dtype != value.dtype:
                return None          # (an op in place that changes the shape or dtype makes a new array)
            kinds.append((INPLACE, None, None))
        elif id(blob) in views:
            if not blob.view or (not overlap and any(np.may_share_memory(value, x) for x in ins)):
                return None
            kinds.append((VIEW, None, None))
        elif (_owned(net.workspace, blob, main is not None) and not external and not blob.view
              and not (main is not None and any(np.may_share_memory(value, x) for x in ins))):
            # (a plain net's op whose result shares its input's memory, as a view or the array itself, keeps
            # that sharing interpreted: a buffer would copy it)
            spec = (value.shape, value.dtype)
            if buffers.setdefault(id(blob), spec) != spec:
                return None
            kinds.append((BUFFER, *spec))
        else:
            return None
    return kinds


def fused_pair(net, i, fast, views, buffers, main, trace) -> tuple | None:
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
    ins, outs = trace[j]
    if not all(type(v) is np.ndarray for v in ins + outs) or compiled_form(nxt, ins, outs) is None:
        return None
    kinds = kinds_of(net, nxt, ins, outs, views, buffers, main)
    pair = fast.fuse(nxt, trace[i][0] + ins, outs) if kinds is not None else None
    return None if pair is None else (pair, kinds, j)


def fused_group(net, i, views, buffers, main, trace, steps: int) -> tuple | None:
    """(the GRU step's one entry at op i, the kinds of its ops' outputs, their indices), or None: a step net's
    ops i..i+10 in one of compiled.gru_step's layouts, each with the kernel its type registered (as
    compiled_form asks) and each of whose outputs a compiled routine can write."""
    found = None if main is not None else gru_step.layout(net.ops, i)
    if found is None:
        return None
    at = range(i, i + gru_step.SIZE)
    if not all(registered_kernel(net.ops[j]) for j in at):
        return None
    kinds = []
    for j in at:
        op_kinds = kinds_of(net, net.ops[j], *trace[j], views, buffers, main)
        if op_kinds is None:
            return None
        kinds += op_kinds
    fast = gru_step.form(net.ops, i, found, trace, steps)
    return None if fast is None else (fast, kinds, tuple(at))
