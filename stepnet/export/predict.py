"""`stepnet export-predict`: a trained plan and its checkpoint as an init_net.pb + predict_net.pb pair (Caffe2's
deployment form) or the weights alone as .npz.

The predict net is cut from the plan's nets (by default its training net, with the nets its execution step runs
before it): ops that compute gradients, update parameters, count iterations, read data or print are dropped,
the rest are pruned to what the outputs need (by default the prediction a loss op reads; without a loss op, the
last op's outputs) plus what they carry from one run to the next (a sampler's state); RecurrentNetwork ops lose
their backward step nets, SpatialBN and Dropout run in test mode. Its external inputs are what it reads before
writing: data the dropped readers made (to be fed), and values the init net fills. A value that training
updates (written by an optimizer, or by an op that also reads it, as BN's running statistics) comes from the
checkpoint; any other from the plan's own deterministic setup fill when there is one (initial states,
constants), else from the checkpoint. The init net holds each as a GivenTensor*Fill of its dtype and shape."""
from __future__ import annotations

import contextlib
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from ..io import proto
from .draw_blocks import LOSS_TYPES, role
from ..core.errors import ArgumentError, FileFormatError, StepnetError
from ..graph.view import Graph, copy_op
from ..io.proto import NetDef, OperatorDef, PlanDef, make_argument

DROPPED_ROLES = frozenset({"gradient", "optimizer", "data", "loss"})
DROPPED_TYPES = frozenset({"Print", "Assert", "NanCheck", "EnforceFinite"})
# RecurrentNetwork arguments that only the backward pass reads: a forward-only op keeps no per-step workspaces.
BACKWARD_ARGS = frozenset({"backward_step_net", "backward_link_internal", "backward_link_external",
                           "backward_link_offset", "recompute_blobs_on_backward", "param", "param_grads",
                           "outputs_with_grads"})
TEST_MODE_TYPES = frozenset({"SpatialBN", "Dropout"})
FILL_OF = {np.dtype(np.float32): "GivenTensorFill", np.dtype(np.float64): "GivenTensorDoubleFill",
           np.dtype(np.int32): "GivenTensorIntFill", np.dtype(np.int64): "GivenTensorInt64Fill",
           np.dtype(np.int16): "GivenTensorInt16Fill", np.dtype(np.bool_): "GivenTensorBoolFill",
           np.dtype(np.float16): "GivenTensorFp16Fill", np.dtype(np.uint8): "GivenTensorByteStringToUInt8Fill"}


@dataclass
class Export:
    """The exported pair: `init` fills `params` ({name: array}); `predict` reads them and `feeds` (data to feed
    at run time) and declares `predict.external_output`."""
    init: NetDef
    predict: NetDef
    params: dict
    feeds: list


def _steps(plan: PlanDef):
    """(step, iterating) for every execution step with nets, outermost first; a step iterates when it or a step
    around it runs more than once (or until a stop blob)."""
    def visit(step, outer):
        it = outer or bool(step.should_stop_blob) or (step.HasField("num_iter") and step.num_iter > 1)
        yield step, it
        for sub in step.substep:
            yield from visit(sub, it)
    for step in plan.execution_step:
        yield from visit(step, False)


def choose_nets(plan: PlanDef, names: Sequence[str] = ()) -> list[NetDef]:
    """The nets the predict net is cut from: `names` in order, or by default the plan's training net (the
    largest net with gradient ops; else the largest net an iterating step runs; else the largest net) with the
    nets its execution step runs before it."""
    by_name = {n.name: n for n in plan.network}
    if names:
        missing = [n for n in names if n not in by_name]
        if missing:
            raise ArgumentError(f"plan {plan.name!r} has no network named {', '.join(map(repr, missing))}; it has "
                                + ", ".join(repr(n) for n in by_name))
        return [by_name[n] for n in names]
    iterated = {n for step, it in _steps(plan) if it for n in step.network}
    nets = list(plan.network)
    training = [n for n in nets if any(role(op) == "gradient" for op in n.op)]
    pool = training or [n for n in nets if n.name in iterated] or nets
    if not pool:
        raise ArgumentError(f"plan {plan.name!r} has no networks")
    main = max(pool, key=lambda n: len(n.op))
    for step, _ in _steps(plan):
        if main.name in step.network:
            before = list(step.network)[:list(step.network).index(main.name)]
            return [by_name[n] for n in before if n in by_name] + [main]
    return [main]


def shown_after(plan: PlanDef, chosen: Sequence[NetDef]) -> list[NetDef]:
    """For a plan without a training net: the nets its steps run once after the chosen nets' loop that read what
    the loop makes (a net that shows the result: the char-rnn sampler's `show` turns the sampled ids into text)."""
    if any(role(op) == "gradient" for net in plan.network for op in net.op):
        return []
    by_name = {n.name: n for n in plan.network}
    steps = list(_steps(plan))
    main = chosen[-1].name
    at = next((i for i, (step, _) in enumerate(steps) if main in step.network), None)
    if at is None or not steps[at][1]:
        return []
    made = {name for net in chosen for op in net.op for name in op.output}
    shown = []
    for step, iterating in steps[at + 1:]:
        if iterating:
            continue
        for net in (by_name[n] for n in step.network if n in by_name):
            if any(name in made for op in net.op if _kept(op) for name in op.input):
                shown.append(net)
                made |= {name for op in net.op for name in op.output}
    return shown


def _kept(op: OperatorDef) -> bool:
    return role(op) not in DROPPED_ROLES and op.type not in DROPPED_TYPES


def default_outputs(ops: Sequence[OperatorDef]) -> list[str]:
    """The prediction: the first input of each loss op that no loss op made (cut at the loss); without loss ops,
    the outputs of the last op kept."""
    losses = [op for op in ops if op.type in LOSS_TYPES]
    made_by_loss = {name for op in losses for name in op.output}
    cut = list(dict.fromkeys(op.input[0] for op in losses if op.input and op.input[0] not in made_by_loss))
    if cut:
        return cut
    kept = [op for op in ops if _kept(op)]
    if not kept:
        raise ArgumentError("the nets have no op to export")
    return list(kept[-1].output)


def predict_net(nets: Sequence[NetDef], outputs: Sequence[str] | None = None, name: str | None = None) -> NetDef:
    """The inference part of the nets' ops (see the module's docstring), declaring its inputs and outputs."""
    ops = [op for net in nets for op in net.op]
    outputs = list(outputs) if outputs else default_outputs(ops)
    kept = [op for op in ops if _kept(op)]
    graph = Graph(kept)
    written = {name for op in kept for name in op.output}
    bad = [o for o in outputs if o not in written]
    if bad:
        where = ", ".join(repr(n.name) for n in nets)
        raise ArgumentError(f"output blob {bad[0]!r} is not produced by the inference ops of net(s) {where}"
                            + (" (only a gradient, optimizer, loss or data op writes it)" if
                               any(bad[0] in op.output for op in ops) else ""))
    need = [graph.writer[(o, graph.final[o])] for o in outputs]
    keep: set[int] = set()
    while need:
        i = need.pop()
        if i in keep:
            continue
        keep.add(i)
        for blob, v in zip(graph.ops[i].input, graph.in_versions[i]):
            if v > 0:
                need.append(graph.writer[(blob, v)])
            elif graph.final.get(blob, 0) > 0:      # carried to the next run: keep what writes it last
                need.append(graph.writer[(blob, graph.final[blob])])
    out = NetDef(name=name or nets[-1].name, type=nets[-1].type)
    out.op.extend(_forward_only(graph.ops[i]) for i in sorted(keep))
    pruned = Graph(out.op)
    out.external_input.extend(pruned.read_before_written())
    out.external_output.extend(outputs)
    return out


def _forward_only(op: OperatorDef) -> OperatorDef:
    """op as inference runs it: RecurrentNetwork without its backward step net, SpatialBN and Dropout in test
    mode (running statistics read, not updated; no mask), with only their first output."""
    op = copy_op(op)
    if op.type == "RecurrentNetwork":
        kept = [a for a in op.arg if a.name not in BACKWARD_ARGS]
        del op.arg[:]
        op.arg.extend(kept)
    if op.type in TEST_MODE_TYPES:
        kept = [a for a in op.arg if a.name not in ("is_test", "momentum", "num_batches")]
        del op.arg[:]
        op.arg.extend([*kept, make_argument("is_test", 1)])
        del op.output[1:]
        if op.type == "SpatialBN":
            del op.input[5:]   # the per-batch sums of num_batches > 1
    return op


def export(plan, checkpoint, nets: Sequence[str] = (), outputs: Sequence[str] | None = None,
           max_blob_bytes: int | None = None) -> Export:
    """Cut the predict net from a PlanDef (or a single training NetDef) and fill its parameters from the
    checkpoint (a minidb written by `stepnet run --checkpoint`)."""
    from ..io.minidb import load_blobs

    if isinstance(plan, NetDef):
        plan = PlanDef(name=plan.name, network=[plan])
    chosen = choose_nets(plan, nets)
    shown = [] if nets else shown_after(plan, chosen)
    if shown and not outputs:   # the loop's outputs and what the nets after it show (the sampler's ids and text)
        outputs = list(dict.fromkeys(default_outputs([op for n in chosen for op in n.op])
                                     + default_outputs([op for n in shown for op in n.op])))
    predict = predict_net(chosen + shown, outputs, name=chosen[-1].name)
    saved = {k: v for k, v in load_blobs(checkpoint, max_blob_bytes=max_blob_bytes).items()
             if not k.startswith("__stepnet__/")}
    all_ops = [op for net in plan.network for op in net.op]
    # Trained values: what an optimizer writes, or an op updating a blob it reads (BN's running statistics).
    updated = {name for op in all_ops for name in op.output if role(op) == "optimizer" or name in op.input}
    written = {name for op in all_ops for name in op.output}
    data = {name for net in chosen for op in net.op if not _kept(op) and role(op) == "data" for name in op.output}
    setup = _setup_fills(plan, max_blob_bytes)
    params, feeds = {}, []
    for name in predict.external_input:
        if name in data or (name not in written and name not in saved):
            feeds.append(name)
        elif name not in updated and name in setup:
            params[name] = setup[name]
        elif name in saved:
            params[name] = saved[name]
        else:
            writer = next(op for op in all_ops if name in op.output)
            raise ArgumentError(f"checkpoint {checkpoint} has no blob {name!r}, a parameter the predict net reads "
                                f"(made by {writer.type} in the plan); was it saved by a run of this plan?")
    init = NetDef(name=f"{predict.name}_init")
    init.op.extend(fill_op(name, value) for name, value in params.items())
    init.external_output.extend(params)
    return Export(init, predict, params, feeds)


def _setup_fills(plan: PlanDef, max_blob_bytes: int | None = None) -> dict:
    """{blob: value} of the deterministic fills (no inputs, not random) in the nets of steps that run once."""
    from ..core.limits import Limits
    from ..ops import REGISTRY
    from ..runtime.workspace import Workspace

    by_name = {n.name: n for n in plan.network}
    values = {}
    for step, iterating in _steps(plan):
        if iterating:
            continue
        for net_name in step.network:
            for op in by_name.get(net_name, NetDef()).op:
                if (op.type.endswith("Fill") and not op.input and op.type in REGISTRY
                        and not REGISTRY.get(op.type).random):
                    ws = Workspace(limits=Limits(writes=False, **({} if max_blob_bytes is None else
                                                                   {"max_blob_bytes": max_blob_bytes})))
                    ws.run_net_once(NetDef(name="fill", op=[op]))
                    values.update({name: ws.fetch(name) for name in op.output})
    return values


def fill_op(name: str, value) -> OperatorDef:
    """A GivenTensor*Fill op writing `value` (an array, or strings) to `name` with its shape."""
    from ..core.int8 import Int8Tensor

    if isinstance(value, Int8Tensor):
        raise ArgumentError(f"blob {name!r} is an Int8 tensor, which export-predict does not write as a fill; "
                            "export the weights with --format npz (real values)")
    if isinstance(value, (str, bytes)):
        value = np.array([value], dtype=object).reshape(())
    arr = np.asarray(value)
    op = OperatorDef(type="GivenTensorStringFill" if arr.dtype == object else FILL_OF.get(arr.dtype, ""),
                     output=[name])
    if not op.type:
        raise ArgumentError(f"blob {name!r} is {arr.dtype}, which no GivenTensor*Fill holds; export it with "
                            "--format npz")
    op.arg.append(make_argument("shape", [int(d) for d in arr.shape]))
    if op.type == "GivenTensorByteStringToUInt8Fill":
        op.arg.append(make_argument("values", [arr.tobytes()]))
    elif arr.dtype == object:
        op.arg.append(make_argument("values", [v if isinstance(v, bytes) else str(v).encode()
                                               for v in arr.reshape(-1)]))
    elif arr.dtype.kind == "f":
        op.arg.append(make_argument("values", [float(v) for v in arr.reshape(-1)]))
    else:
        op.arg.append(make_argument("values", [int(v) for v in arr.reshape(-1)]))
    return op


# --------------------------------------------------------------------------------------------- writing
def output_dir(path) -> Path:
    """The -o directory, made if missing; a clear error when something else is there."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise FileFormatError(f"{path}: exists and is not a directory; give -o a directory (or a .npz file with "
                              "--format npz)")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise FileFormatError(f"{path}: cannot make the directory ({e.strerror})") from None
    return path


def write_pair(result: Export, directory, text: bool = False) -> list[Path]:
    """DIR/init_net.pb and DIR/predict_net.pb (.pbtxt with text) as a pair: both are written whole beside their
    paths first (proto.write_temp), and renamed over them only then; a failure leaves the old pair (a failed
    second rename puts the old init back, from a hard link kept until then)."""
    d = output_dir(directory)
    suffix = ".pbtxt" if text else ".pb"
    paths = [d / f"init_net{suffix}", d / f"predict_net{suffix}"]
    staged, old = [], None
    try:
        for path, message in zip(paths, (result.init, result.predict)):
            staged.append(proto.write_temp(path, proto.to_text(message).encode() if text else
                                           message.SerializeToString()))
        old = _linked(paths[0])
        os.replace(staged[0], paths[0])
        try:
            os.replace(staged[1], paths[1])
        except BaseException:
            _put_back(paths[0], old)
            raise
    except OSError as e:
        raise FileFormatError(f"{d}: cannot write {paths[0].name} and {paths[1].name} ({e.strerror})") from None
    finally:
        for leftover in [*staged, old]:
            if leftover:
                with contextlib.suppress(OSError):
                    os.unlink(leftover)
    return paths


def _linked(path: Path):
    """A hard link to the file at path (named as write_temp names temporaries, so remove_stale_temps finds one a
    killed write left), to put it back with; None when there is none, False when the filesystem cannot link."""
    if not os.path.lexists(path):
        return None
    link = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        os.link(path, link)
    except OSError:
        return False
    return link


def _put_back(path: Path, old) -> None:
    """Undo a rename over path: the old file back (a _linked link), or none when there was none."""
    with contextlib.suppress(OSError):
        if old is None:
            os.unlink(path)
        elif old:
            os.replace(old, path)


def write_npz(result: Export, out) -> Path:
    """The parameters alone as an .npz (OUT itself when it ends in .npz, else OUT/params.npz), atomically."""
    out = Path(out)
    path = out if out.suffix.lower() == ".npz" else output_dir(out) / "params.npz"
    from ..io.files import npz_bytes

    try:
        data = npz_bytes({k: _plain(v) for k, v in result.params.items()})
    except ValueError as e:
        raise StepnetError(f"cannot write the parameters as .npz: {e}") from None
    proto.atomic_write(path, data)
    return path


def _plain(value) -> np.ndarray:
    """value as an array np.load reads without pickles: strings as unicode, Int8 tensors as their real values."""
    from ..core.int8 import Int8Tensor

    arr = value.dequantize() if isinstance(value, Int8Tensor) else np.asarray(value)
    if arr.dtype == object:
        arr = np.asarray([v.decode(errors="backslashreplace") if isinstance(v, bytes) else str(v)
                          for v in arr.reshape(-1)]).reshape(arr.shape)
    return arr
