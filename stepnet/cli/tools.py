"""The commands that look at models without running them: inspect, ops, convert, synth-init, draw,
export-predict."""
from __future__ import annotations

from collections import Counter

import numpy as np

from ..io import proto
from ..core.errors import ArgumentError, did_you_mean, one_line
from ..io.feeds import parse_dims
from ..graph.view import walk
from ..export.draw import COLLAPSE_AT, MAX_EDGES, MAX_OP_EDGES, MAX_OPS
from ..core.limits import add_limit_flags, limits_of
from ..ops import REGISTRY
from ..ops.registry import REQUIRED


def describe_net(netdef, indent="", level: int = 0) -> list[str]:
    ops = [(depth, op) for depth, _, _, op in walk(netdef, level=level)]
    counts = Counter(op.type for _, op in ops)
    nested = sum(1 for d, _ in ops if d)
    lines = [f"{indent}net {netdef.name!r}: {len(netdef.op)} ops" + (f" (+{nested} in nested nets)" if nested else "")
             + (f", type {netdef.type!r}" if netdef.type else "")]
    lines.append(f"{indent}  ops by type: " + ", ".join(f"{one_line(t)}×{c}" for t, c in sorted(counts.items())))
    if netdef.external_input:
        lines.append(f"{indent}  external inputs ({len(netdef.external_input)}): " + _short(netdef.external_input))
    if netdef.external_output:
        lines.append(f"{indent}  external outputs ({len(netdef.external_output)}): " + _short(netdef.external_output))
    return lines


def _short(names, n=8) -> str:
    names = [one_line(name) for name in names]   # names from the file: never a terminal escape or a new line
    return ", ".join(names[:n]) + (f", ... ({len(names) - n} more)" if len(names) > n else "")


def unsupported_ops(nets, level: int = 0) -> dict[str, int]:
    counts = Counter(op.type for nd in nets for _, _, _, op in walk(nd, level=level) if op.type not in REGISTRY)
    return dict(sorted(counts.items()))


def cmd_inspect(a) -> int:
    model = proto.load(a.model, kind=a.kind)
    if isinstance(model, proto.PlanDef):
        nets = list(model.network)
        print(f"plan {model.name!r}: {len(nets)} networks, {len(model.execution_step)} execution steps")
        for step in model.execution_step:
            _print_step(step, "  ")
    elif isinstance(model, proto.NetDef):
        nets = [model]
    else:
        print(proto.to_text(model))
        return 0
    level = 1 if isinstance(model, proto.PlanDef) else 0  # a plan's networks sit one level below it
    for nd in nets:
        print("\n".join(describe_net(nd, level=level)))
    missing = unsupported_ops(nets, level)
    if missing:
        print("unsupported ops (this build cannot run them): "
              + ", ".join(one_line(f"{t}×{c}{did_you_mean(t, REGISTRY)}") for t, c in missing.items()))
    else:
        print("all ops supported")
    if a.shapes:
        if missing:
            raise ArgumentError("--shapes needs every op supported; see the list above")
        print_shapes(nets, a)
    return 1 if (missing and a.strict) else 0


def refuse_unread(names, nets, flag: str) -> None:
    """A --feed / --input name that no op of the model (nested nets included) reads: one error, with the names
    it reads that are close (a typo would otherwise be ignored)."""
    from ..graph.view import walk

    read = {name for nd in nets for _, _, _, op in walk(nd, level=1) for name in op.input}
    for name in names:
        if name is not None and name not in read:
            raise ArgumentError(f"{flag} {name!r}: no op of the model reads that blob{did_you_mean(name, read)}")


def feed_device(nets, name: str):
    """The DeviceOption a --feed of `name` is stored with: that of the first top-level op (in run order) that
    reads it, its own or its net's, unless that op reads this input on the host (its record's host_inputs);
    None (the host) when no such op asks for a device. So a model whose ops run on a GPU takes its fed inputs
    there, as a Caffe2 program would feed them with that op's device_option."""
    from ..ops.registry import REGISTRY

    for nd in nets:
        for op in nd.op:
            if name not in op.input:
                continue
            do = op.device_option if op.HasField("device_option") else (
                nd.device_option if nd.HasField("device_option") else None)
            schema = REGISTRY.get(op.type) if op.type in REGISTRY else None
            host = schema is not None and any(op.input[i] == name for i in schema.host_inputs if i < len(op.input))
            return None if host else do
    return None


def print_shapes(nets, a) -> None:
    """Infer every blob's shape (init net first when given) and print them; mismatches raise before running."""
    from ..core.spec import spec
    from ..passes.shapes import infer_net

    given = {d.name: spec(d.shape, d.dtype or "float32") for d in map(parse_dims, a.input)}
    refuse_unread(given, nets, "--input")
    limit = limits_of(a).max_blob_bytes
    known = infer_net(proto.load(a.init, kind="net"), {}, max_blob_bytes=limit) if a.init else {}
    known.update(given)  # fed inputs replace the init net's placeholders
    for nd in nets:
        known = infer_net(nd, known, max_blob_bytes=limit)
        print(f"shapes in net {nd.name!r}:")
        seen = set()
        for name in [*nd.external_input, *(o for op in nd.op for o in op.output)]:
            if name in seen:
                continue
            seen.add(name)
            spec = known.get(name)
            print(f"  {one_line(name)}: {spec if spec is not None else '?'}")


def _print_step(step, indent):
    what = f"nets {list(step.network)}" if step.network else f"{len(step.substep)} substeps"
    loop = (f"until {step.should_stop_blob!r}" if step.should_stop_blob
            else f"{step.num_iter if step.HasField('num_iter') else 1} iteration(s)")
    print(f"{indent}step {step.name!r}: {what}, {loop}")
    for sub in step.substep:
        _print_step(sub, indent + "  ")


def cmd_convert(a) -> int:
    model = proto.load(a.input, kind=a.kind)
    proto.save(model, a.output)
    print(f"wrote {type(model).__name__} {a.output}")
    return 0


def op_table(markdown: bool = False) -> str:
    """The registered operators by family (the README's table is this output with --markdown)."""
    by_family: dict[str, list[str]] = {}
    for schema in REGISTRY.schemas():
        by_family.setdefault(schema.family, []).append(schema.type)
    if not markdown:
        return "\n".join(f"{fam}: {', '.join(types)}" for fam, types in sorted(by_family.items()))
    rows = ["| family | operators |", "|---|---|"]
    rows += [f"| {fam} | {', '.join(f'`{t}`' for t in types)} |" for fam, types in sorted(by_family.items())]
    return "\n".join(rows)


def cmd_ops(a) -> int:
    if a.name:
        schema = REGISTRY.get(a.name)
        print(f"{schema.type} ({schema.family}): inputs {schema.arity_text('inputs')}, "
              f"outputs {schema.arity_text('outputs')}")
        for name, spec in schema.args.items():
            default = "required" if spec.default is REQUIRED else f"default {spec.default!r}"
            print(f"  {name}: {spec.kind}, {default}")
        if schema.doc:
            print(f"  {schema.doc}")
        return 0
    print(op_table(a.markdown))
    print(f"{len(REGISTRY)} operators" if not a.markdown else "")
    return 0


def cmd_synth_init(a) -> int:
    from ..core.spec import spec
    from ..builders.synth import synth_init

    inputs = {d.name: spec(d.shape, d.dtype or "float32") for d in map(parse_dims, a.input)}
    params = {}
    for text in a.param:
        d = parse_dims(text, "--param")
        if d.dtype:
            raise ArgumentError(f"--param {text!r}: a parameter takes no dtype (every fill is float32)")
        params[d.name] = d.shape
    init = synth_init(a.predict_net, inputs, width=a.width, classes=a.classes, params=params, seed=a.seed)
    proto.save(init, a.output)
    print(f"wrote init net {a.output} ({len(init.op)} fill ops)")
    return 0


def cmd_draw(a) -> int:
    from ..export.draw import Options, draw

    models = [proto.load(path) for path in a.models]
    options = Options(backward=a.backward, max_ops=a.max_ops, max_edges=a.max_edges, collapse=a.collapse, nets=a.net,
                      max_size=a.max_size)
    done = draw(models, a.output, options)
    print(f"wrote {done.path}" + (f"; {done.note}" if done.note else ""))
    return 0


def cmd_export(a) -> int:
    from ..export.predict import export, write_npz, write_pair

    outputs = [o.strip() for o in a.outputs.split(",") if o.strip()] if a.outputs else None
    result = export(proto.load(a.plan), a.load, a.net, outputs, limits_of(a).max_blob_bytes)
    values = sum(int(np.asarray(v).size) for v in result.params.values())
    if a.format == "npz":
        print(f"wrote {write_npz(result, a.output)} ({len(result.params)} blobs, {values} values)")
        return 0
    init, predict = write_pair(result, a.output, text=a.format == "pbtxt")
    print(f"wrote {init} ({len(result.params)} blobs, {values} values) and {predict} ({len(result.predict.op)} ops; "
          f"outputs: {_short(result.predict.external_output, 100)})")
    feeds = " ".join(f"--feed {one_line(n)}=..." for n in result.feeds)
    print(f"run it: stepnet run {init} {predict}" + (f" {feeds}" if feeds else ""))
    return 0


def add_tool_parsers(sub) -> None:
    """The draw and export-predict subcommands."""
    d = sub.add_parser("draw", help="a picture of nets and plans (.svg, .png, .pdf or .dot; layout by Graphviz's dot)")
    d.add_argument("models", nargs="+", metavar="MODEL", help="NetDefs or PlanDefs; an init net given with other "
                   "nets marks the parameters it fills and is not drawn")
    d.add_argument("-o", "--output", required=True, metavar="OUT.svg|.png|.pdf|.dot")
    d.add_argument("--backward", action="store_true", help="also draw backward step nets and gradient ops' nets")
    d.add_argument("--max-ops", type=int, default=MAX_OPS, metavar="N",
                   help=f"draw at most N ops, then a note (default {MAX_OPS})")
    d.add_argument("--max-edges", type=int, default=MAX_EDGES, metavar="N",
                   help=f"stop drawing ops once N edges are drawn, then a note (default {MAX_EDGES}; an op's "
                        f"inputs or outputs past {MAX_OP_EDGES} are drawn as one)")
    d.add_argument("--collapse", choices=("auto", "yes", "no"), default="auto",
                   help=f"draw runs of a repeated block once, labelled ×k (auto: in nets over {COLLAPSE_AT} ops)")
    d.add_argument("--net", action="append", default=[], metavar="NAME", help="for a plan: draw only this net")
    d.add_argument("--max-size", type=int, metavar="PX", help="scale the picture down to at most PX pixels on its "
                   "longest side (at 96 dpi; the text shrinks with it; default: full-size text)")
    d.set_defaults(func=cmd_draw)

    e = sub.add_parser("export-predict", help="a trained plan's checkpoint as init_net.pb + predict_net.pb (or .npz)")
    e.add_argument("plan", metavar="PLAN", help="the training PlanDef (or a training NetDef)")
    e.add_argument("--load", required=True, metavar="CHECKPOINT", help="a minidb checkpoint of a run of PLAN")
    e.add_argument("-o", "--output", required=True, metavar="DIR|FILE.npz")
    e.add_argument("--net", action="append", default=[], metavar="NAME",
                   help="a net the predict net is cut from (repeat for several, in order; default: the training "
                        "net and the nets its step runs before it)")
    e.add_argument("--outputs", metavar="BLOB,...", help="the predict net's outputs (default: what the loss reads; "
                   "without a loss, the last op's outputs)")
    e.add_argument("--format", choices=("pb", "pbtxt", "npz"), default="pb",
                   help="pb: DIR/init_net.pb + DIR/predict_net.pb (default); pbtxt: text; npz: the weights alone")
    add_limit_flags(e, paths=False)
    e.set_defaults(func=cmd_export)
