"""The command line's ONNX parts: `stepnet export-onnx` and `stepnet run --engine onnxruntime`.

stepnet/cli/run.py adds the subcommand with `add_parser` and calls `run_in_onnxruntime` for --engine; nothing here
imports onnx until a command runs, so the command line works without the extra.
"""
from __future__ import annotations

import warnings


from ..io import proto
from ..core.errors import ArgumentError, StepnetError, StepnetWarning
from ..io.feeds import parse_dims
from ..export.onnx.errors import ExportError
from ..graph.view import plan_networks, step_network


def add_parser(sub) -> None:
    """The export-onnx subcommand on stepnet's subparsers."""
    e = sub.add_parser("export-onnx", help="export an init/predict net pair (or a plan's net) to an ONNX model")
    e.add_argument("nets", nargs="*", metavar="[INIT_NET] PREDICT_NET", help="the init net (optional), then the "
                   "predict net; or a plan file with --net")
    e.add_argument("-o", "--output-file", metavar="OUT.onnx", help="the ONNX file to write")
    e.add_argument("--input", action="append", default=[], metavar="NAME=D1,D2,...[:dtype]",
                   help="a graph input and its dims (dtype: the init net's fill, else float32); NAME alone takes "
                        "the dims the init net fills it with; a blob the net writes cuts the net there")
    e.add_argument("--output", action="append", default=[], metavar="NAME",
                   help="a blob to export as a graph output (default: the predict net's external outputs)")
    e.add_argument("--opset", type=int, help="ONNX opset (default: the newest the installed onnxruntime runs)")
    e.add_argument("--rnn", choices=("auto", "scan"), default="auto",
                   help="auto: a RecurrentNetwork that is exactly an LSTM layer becomes an ONNX LSTM node, others a "
                        "Scan; scan: every RecurrentNetwork a Scan")
    e.add_argument("--load", metavar="CHECKPOINT", help="take weights from a minidb checkpoint (after the init net)")
    e.add_argument("--net", metavar="NAME", help="with a plan file: the net to export (the plan's nets that run "
                                                  "before it make its weights)")
    e.add_argument("--external-data", action="store_true",
                   help="write the weights to OUT.onnx.data beside the model (ONNX external data), as models with "
                        "more than 2 GiB of weights need")
    e.add_argument("--list-ops", action="store_true", help="list the ops that export, and exit")
    e.set_defaults(func=cmd_export_onnx)


def _inputs(specs) -> dict:
    out = {}
    for text in specs:
        if "=" not in text:
            out[text] = None
            continue
        d = parse_dims(text)
        out[d.name] = d.shape if d.dtype is None else _spec(d.shape, d.dtype)
    return out


def _spec(shape, dtype):
    from ..core.spec import spec
    return spec(shape, dtype)


def _plan_nets(plan, name: str | None):
    """(init NetDef of the nets a plan runs before `name`, the net `name`)."""
    nets = plan_networks(plan)
    if name not in nets:
        what = f"--net {name!r} is not one of" if name else "name the net to export with --net; choose among"
        raise ArgumentError(f"{what} the plan's nets ({', '.join(nets)})")
    order: list[str] = []

    def walk(steps) -> bool:
        for step in steps:
            if name in step.network:
                order.extend(step.network[:list(step.network).index(name)])
                return True
            order.extend(step.network)
            if walk(step.substep):
                return True
        return False

    walk(plan.execution_step)
    init = proto.NetDef(name=f"{plan.name}_before_{name}")
    for n in order:
        init.op.extend(step_network(plan, nets, n).op)
    return init, nets[name]


def load_nets(paths, net: str | None):
    """(init NetDef or None, predict NetDef) from the command's files."""
    if not 1 <= len(paths) <= 2:
        raise ArgumentError("export-onnx takes [INIT_NET] PREDICT_NET (or a plan file with --net)")
    first = proto.load(paths[0])
    if isinstance(first, proto.PlanDef):
        if len(paths) > 1:
            raise ArgumentError(f"{paths[0]} is a plan; give it alone, with --net NAME")
        return _plan_nets(first, net)
    if len(paths) == 1:
        return None, first
    return first, proto.load(paths[1], kind="net")


def cmd_export_onnx(a) -> int:
    from ..export.onnx.exporter import export_onnx
    from ..export.onnx.table import exportable_ops

    if a.list_ops:
        print(", ".join(exportable_ops()))
        return 0
    if not a.output_file:
        raise ArgumentError("export-onnx needs -o OUT.onnx")
    init, predict = load_nets(a.nets, a.net)
    params = {}
    if a.load:
        from ..io.minidb import load_blobs
        params = {k: v for k, v in load_blobs(a.load).items() if hasattr(v, "shape") and v.dtype != object}
    result = export_onnx(predict, init, inputs=_inputs(a.input), outputs=a.output or None, params=params,
                         opset=a.opset, rnn=a.rnn, external_data=a.external_data)
    result.save(a.output_file)
    for note in result.notes:
        print(f"note: {note}")
    graph = result.model.graph
    ins = ", ".join(f"{i.name} {_dims(i)}" for i in graph.input)
    data = f" (weights in {a.output_file}.data)" if a.external_data else ""
    print(f"wrote {a.output_file}{data}: opset {result.opset}, {len(graph.node)} nodes, inputs {ins or 'none'}, "
          f"outputs {', '.join(result.outputs)}")
    return 0


def _dims(value_info) -> tuple:
    return tuple(d.dim_value for d in value_info.type.tensor_type.shape.dim)


# --------------------------------------------------------------------------------------------- engine
def run_in_onnxruntime(ws, predict, feeds: dict, fetch, iterations: int, threads: int | None = None,
                       quiet_fallback: bool = False) -> bool:
    """Run the predict net in onnxruntime (export.onnx.engine.OnnxNet: exported once per content, cached): the
    workspace's blobs (the init net's, the checkpoint's) as weights, the feeds as inputs; the outputs are stored
    in the workspace. False when the net cannot be exported or onnxruntime cannot run it, so the caller runs it on
    stepnet's engine: after a one-line warning, or silently with quiet_fallback (--engine auto)."""
    try:
        from ..export.onnx.engine import OnnxNet
        from ..graph.view import blob_names, walk
        nets = {id(n): n for _, n, _, _ in walk(predict)}
        names = blob_names(predict, *nets.values())
        net = OnnxNet(ws, predict, [k for k in feeds if k in names], list(fetch) or None, threads)
        for _ in range(max(iterations, 1)):
            net.run()
    except ExportError as e:   # a warning: shown as one line (names from the file escaped), never an error line
        if not quiet_fallback:
            warnings.warn(StepnetWarning(f"onnxruntime engine: {e}; running on stepnet's engine"), stacklevel=2)
        return False
    except Exception as e:  # noqa: BLE001 - onnxruntime's errors (Fail, InvalidArgument, ...) derive from Exception
        if isinstance(e, StepnetError):
            raise
        why = " ".join(str(e).split())[:300]
        if not quiet_fallback:
            warnings.warn(StepnetWarning(f"onnxruntime engine: onnxruntime could not run the exported net ({why}); "
                                         "running on stepnet's engine"), stacklevel=2)
        return False
    return True
