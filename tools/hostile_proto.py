"""Surface 1 of the hostile campaign: structure-aware protobuf edits. A model (a bundled one, or a small
generated net, plan or control-flow net) is walked through its protobuf descriptors, and 1-4 fields of its
NetDefs, PlanDefs, OperatorDefs, Arguments, TensorProtos, DeviceOptions and ExecutionSteps are mutated by their
type (deleted, duplicated, swapped with a field of another message of the same type, set to extreme integers,
negative or huge dims, NaN/inf floats, hostile strings, huge repeated fields); then plan-level edits (steps
nested deep, substeps naming missing nets, names that collide, num_iter extremes with a stop that ends them,
should_stop_blob tricks), argument edits (wrong kinds, several kinds at once, nets nested deep or held as text)
and wire-level additions (unknown fields, wrong wire types). The result runs through run, inspect, inspect
--shapes, synth-init, convert, draw, export-onnx or export-predict."""
from __future__ import annotations

import random

from google.protobuf.descriptor import FieldDescriptor as FD
from google.protobuf.message import DecodeError

from stepnet.io import proto
from stepnet.io.proto import NetDef, PlanDef

import hostile_values as hv
from hostile_models import PAIRS, PLANS, PREDICTS, gen_control, gen_net, gen_plan, load

INT_TYPES = {FD.TYPE_INT32: "int32", FD.TYPE_SINT32: "int32", FD.TYPE_SFIXED32: "int32", FD.TYPE_INT64: "int64",
             FD.TYPE_SINT64: "int64", FD.TYPE_SFIXED64: "int64", FD.TYPE_UINT32: "uint32", FD.TYPE_FIXED32: "uint32",
             FD.TYPE_UINT64: "uint64", FD.TYPE_FIXED64: "uint64"}
LOOPS = {"num_iter", "num_concurrent_instances"}   # edited only by the plan edits, which keep loops finite


def walk(msg, depth: int = 0, out=None, limit: int = 20000) -> list:
    """Every set message below msg (msg included), with its depth: [(message, depth)]."""
    out = [] if out is None else out
    out.append((msg, depth))
    if depth > 120 or len(out) > limit:
        return out
    for fd, value in msg.ListFields():
        if fd.type == FD.TYPE_MESSAGE:
            for child in (value if fd.is_repeated else [value]):
                walk(child, depth + 1, out, limit)
    return out


def names_in(msgs) -> list[str]:
    names = set()
    for m, _ in msgs:
        for attr in ("input", "output", "external_input", "external_output", "network"):
            if hasattr(m, attr):
                names.update(getattr(m, attr))
        if getattr(m, "name", None) and isinstance(m.name, str):
            names.add(m.name)
    return sorted(names)[:400]


def mutate_field(rng: random.Random, msg, fd, msgs, names) -> None:
    """One type-aware edit of field fd of msg."""
    donors = [m for m, _ in msgs if m.DESCRIPTOR is fd.message_type] if fd.type == FD.TYPE_MESSAGE else []
    if fd.is_repeated:
        items = getattr(msg, fd.name)
        n = len(items)
        kind = rng.choice(["delete", "duplicate", "swap", "clear", "append", "huge", "set"])
        if kind == "delete" and n:
            del items[rng.randrange(n)]
        elif kind == "duplicate" and n:
            i = rng.randrange(n)
            if fd.type == FD.TYPE_MESSAGE:
                items.add().CopyFrom(items[i])
            else:
                items.append(items[i])
        elif kind == "swap" and n > 1:
            i, j = rng.randrange(n), rng.randrange(n)
            if fd.type == FD.TYPE_MESSAGE:
                a, b = type(items[i])(), type(items[j])()
                a.CopyFrom(items[i])
                b.CopyFrom(items[j])
                items[i].CopyFrom(b)
                items[j].CopyFrom(a)
            else:
                items[i], items[j] = items[j], items[i]
        elif kind == "clear":
            msg.ClearField(fd.name)
        elif kind == "huge":
            count = rng.choice([300, 5000, 60000] if fd.type != FD.TYPE_MESSAGE else [50, 500, 3000])
            if fd.type == FD.TYPE_MESSAGE:
                template = items[0] if n else None
                for _ in range(count):
                    new = items.add()
                    if template is not None and rng.random() < 0.9:
                        new.CopyFrom(template)
            else:   # many of a few short values: 60,000 nets as text would be gigabytes of model (and hours)
                pool = [_short(_scalar(rng, fd, names)) for _ in range(3)]
                items.extend(rng.choice(pool) for _ in range(count))
        elif fd.type == FD.TYPE_MESSAGE:
            if donors and rng.random() < 0.7:
                donor = rng.choice(donors)
                if donor is not msg:
                    copy = type(donor)()
                    copy.CopyFrom(donor)
                    items.add().CopyFrom(copy)
            else:
                items.add()
        elif kind == "set" and n:
            items[rng.randrange(n)] = _scalar(rng, fd, names)
        else:
            items.append(_scalar(rng, fd, names))
        return
    if fd.type == FD.TYPE_MESSAGE:
        if rng.random() < 0.3 or not donors:
            msg.ClearField(fd.name)
        else:
            donor = rng.choice(donors)
            copy = type(donor)()
            copy.CopyFrom(donor)
            getattr(msg, fd.name).CopyFrom(copy)
        return
    if rng.random() < 0.15:
        msg.ClearField(fd.name)
    else:
        setattr(msg, fd.name, _scalar(rng, fd, names))


def _short(value, limit: int = 1000):
    return value[:limit] if isinstance(value, (bytes, str)) else value


def _scalar(rng: random.Random, fd, names):
    if fd.type in INT_TYPES:
        if fd.name == "dims" and rng.random() < 0.5:
            return rng.choice([-1, -2**31, 0, 2**31, 2**40, 2**62, 2**63 - 1])
        return hv.edge_int(rng, INT_TYPES[fd.type])
    if fd.type in (FD.TYPE_FLOAT, FD.TYPE_DOUBLE):
        return hv.edge_float(rng)
    if fd.type == FD.TYPE_BOOL:
        return rng.random() < 0.5
    if fd.type == FD.TYPE_ENUM:
        return rng.choice(fd.enum_type.values).number
    if fd.type == FD.TYPE_BYTES:
        return rng.choice([b"", b"\x00" * 7, b"\xff" * 33, bytes(range(256)), hv.net_text(rng), b"x" * 100000])
    return hv.hostile_string(rng, names)


def field_edit(rng: random.Random, model) -> None:
    msgs = walk(model)
    msg, _ = rng.choice(msgs)
    fields = [fd for fd in msg.DESCRIPTOR.fields if fd.name not in LOOPS]
    if not fields:
        return
    set_fields = [fd for fd, _ in msg.ListFields() if fd.name not in LOOPS]
    fd = rng.choice(set_fields) if set_fields and rng.random() < 0.7 else rng.choice(fields)
    mutate_field(rng, msg, fd, msgs, names_in(msgs))


# ------------------------------------------------------------------------------------------- semantic edits
def nets_of(model) -> list:
    return [m for m, _ in walk(model) if isinstance(m, NetDef)]


def arg_edit(rng: random.Random, model) -> None:
    """Arguments: wrong kinds, several kinds at once, no value, duplicates, nets deep or as text."""
    nets = nets_of(model)
    net = rng.choice(nets)
    if not len(net.op):
        net.op.add(type="Relu", input=["X"], output=["y"])
    o = rng.choice(net.op)
    args = list(o.arg)
    arg = rng.choice(args) if args and rng.random() < 0.8 else o.arg.add(name=rng.choice(
        ["shape", "axis", "order", "step_net", "then_net", "loop_net", "net", "value", "dtype", "db", "bogus"]))
    kind = rng.randrange(8)
    if kind == 0:     # a second kind beside the first
        rng.choice([lambda: setattr(arg, "i", hv.edge_int(rng)), lambda: setattr(arg, "f", hv.edge_float(rng)),
                    lambda: setattr(arg, "s", hv.hostile_string(rng).encode("utf-8", "surrogatepass")),
                    lambda: arg.ints.extend([hv.edge_int(rng)] * 3), lambda: arg.floats.append(hv.edge_float(rng)),
                    lambda: arg.strings.append(b"\xff"), lambda: arg.n.CopyFrom(hv.small_net(rng)),
                    lambda: arg.t.CopyFrom(hv.random_tensor(rng)), lambda: arg.nets.add().CopyFrom(hv.small_net(rng)),
                    lambda: arg.tensors.add().CopyFrom(hv.random_tensor(rng))])()
    elif kind == 1:   # no value at all
        name = arg.name
        arg.Clear()
        arg.name = name
    elif kind == 2:   # the same name again, another value
        dup = o.arg.add()
        dup.CopyFrom(arg)
        dup.ClearField("i")
        dup.f = hv.edge_float(rng)
    elif kind == 3:   # a net nested deep
        levels = rng.choice([20, 31, 32, 33, 48, 97, 98, 99, 100, 101, 130])
        arg.Clear()
        arg.name = rng.choice(["step_net", "then_net", "else_net", "loop_net", "cond_net", "net"])
        deep = hv.deep_net(levels, rng.choice(["step_net", "net", "then_net"]), rng.choice(["Do", "If", "While",
                                                                                             "RecurrentNetwork"]))
        try:
            arg.n.ParseFromString(deep.SerializeToString())
        except DecodeError:   # deeper than protobuf parses where the arg sits: move it in level by level
            _graft(arg, deep)
    elif kind == 4:   # a net held as text in s
        arg.Clear()
        arg.name = rng.choice(["step_net", "then_net", "else_net", "loop_net", "cond_net", "net",
                               "backward_step_net"])
        arg.s = hv.net_text(rng)
    elif kind == 5:   # many nets / tensors
        for _ in range(rng.choice([2, 50, 1000])):
            (arg.nets.add().CopyFrom(hv.small_net(rng)) if rng.random() < 0.5 else
             arg.tensors.add().CopyFrom(hv.random_tensor(rng)))
    elif kind == 6:   # a nested net named like the net around it (bound nets are kept by name)
        arg.Clear()
        arg.name = rng.choice(["then_net", "else_net", "loop_net", "net", "step_net"])
        inner = hv.small_net(rng, net.name)
        if rng.random() < 0.5:
            inner.op.add().CopyFrom(o)
        arg.n.CopyFrom(inner)
    else:
        arg.t.CopyFrom(hv.random_tensor(rng))


def _graft(arg, deep: NetDef) -> None:
    """arg.n = deep without a copy (protobuf's copies refuse messages 100+ levels deep): move level by level."""
    cur_src, cur_dst = deep, arg.n
    while True:
        cur_dst.name = cur_src.name
        if not len(cur_src.op) or not len(cur_src.op[0].arg):
            cur_dst.op.extend(cur_src.op)
            return
        o = cur_src.op[0]
        new = cur_dst.op.add(type=o.type, input=list(o.input), output=list(o.output))
        nxt = new.arg.add(name=o.arg[0].name)
        cur_src, cur_dst = o.arg[0].n, nxt.n


def step_edit(rng: random.Random, plan: PlanDef) -> None:
    """Plan edits: missing nets, collisions, deep substeps, loop counts with a stop, stop-blob tricks."""
    if not len(plan.execution_step):
        plan.execution_step.add(name="s", network=[n.name for n in plan.network[:1]])
    steps = [m for m, _ in walk(plan) if isinstance(m, proto.ExecutionStep)]
    step = rng.choice(steps)
    netnames = [n.name for n in plan.network]
    kind = rng.randrange(9)
    if kind == 0:
        step.substep.add(name="ghost", network=[rng.choice(["missing", "", hv.BAD_UTF8, "\x00"])])
    elif kind == 1 and len(plan.network) > 1:   # two nets of one name
        plan.network[rng.randrange(len(plan.network))].name = rng.choice(netnames)
    elif kind == 2:   # substeps nested deep
        cur = step
        for i in range(rng.choice([30, 99, 100, 101, 300])):
            cur = cur.substep.add(name=f"d{i}")
        cur.network.extend(netnames[:1])
    elif kind == 3:   # a huge or odd loop count that a stop blob ends (or --iterations overrides)
        step.num_iter = rng.choice([2**63 - 1, 2**62, 10**12, -1, -2**63, 0])
        _stopper(rng, plan, step)
    elif kind == 4:   # the stop blob: missing, not a bool, several elements, a string, empty
        step.should_stop_blob = rng.choice(["missing", "X", "count", "", "\x00", netnames[0] if netnames else "n"])
        step.only_once = rng.random() < 0.5
        fill = plan.network.add(name="odd_stop", op=[hv.op("ConstantFill", [], [step.should_stop_blob or "e"],
                                                           **rng.choice([{"shape": [2], "value": 1, "dtype": 0},
                                                                         {"shape": [0], "value": 1, "dtype": 0},
                                                                         {"shape": [1], "value": 1.5},
                                                                         {"shape": [], "value": 1, "dtype": 10}]))])
        step.network.insert(0, fill.name)
        if step.num_iter > 50 or step.num_iter == 0 and not len(step.substep):
            step.num_iter = 3
    elif kind == 5:
        step.report_net = rng.choice(netnames + ["missing", "", step.name])
        step.report_interval = rng.choice([0, -1, 1, 2**31 - 1, -2**31])
    elif kind == 6:
        step.run_every_ms = rng.choice([-1, 0, 1, 2**62, -2**63])
        step.concurrent_substeps = rng.random() < 0.5
        step.num_concurrent_instances = rng.choice([-2**31, -1, 0, 1, 2, 3])
    elif kind == 7:
        step.create_workspace = not step.create_workspace
        step.network.extend(rng.choice(netnames) for _ in range(rng.choice([1, 5]))) if netnames else None
    else:   # a step that is a net's name and a net that is no step's
        step.name = rng.choice(netnames + [hv.BAD_UTF8, "", "x" * 4000]) if netnames else ""
        plan.network.add().CopyFrom(hv.small_net(rng, step.name))


def _stopper(rng: random.Random, plan: PlanDef, step) -> None:
    """Make `step` stop after its first iteration: a net it runs first turns its stop blob true."""
    blob = step.should_stop_blob or "stop_now"
    step.should_stop_blob = blob
    net = plan.network.add(name=f"stopper_{len(plan.network)}",
                           op=[hv.op("ConstantFill", [], [blob], shape=[], value=1, dtype=0)])
    step.network.insert(0, net.name)


def wire_edit(rng: random.Random, data: bytes, cls) -> bytes:
    """Unknown fields, a known field number with the wrong wire type, or a length that lies, appended."""
    numbers = [fd.number for fd in cls.DESCRIPTOR.fields]
    number = rng.choice(numbers + [99, 536870911])
    wire = rng.choice([0, 1, 2, 5, 3, 4])
    key = _varint((number << 3) | wire)
    body = {0: _varint(rng.choice([0, 1, 2**63, 2**64 - 1])), 1: b"\xff" * 8, 5: b"\x00\x00\xc0\x7f",
            2: _varint(rng.choice([0, 3, 2**31])) + b"abc", 3: b"", 4: b""}[wire]
    return data + key + body if rng.random() < 0.7 else key + body + data


def _varint(v: int) -> bytes:
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


# ------------------------------------------------------------------------------------------- cases
def mutate(rng: random.Random, model) -> None:
    for _ in range(rng.randint(1, 4)):
        try:
            r = rng.random()
            if r < 0.55:
                field_edit(rng, model)
            elif r < 0.8:
                arg_edit(rng, model)
            elif isinstance(model, PlanDef):
                step_edit(rng, model)
            else:
                field_edit(rng, model)
        except (ValueError, TypeError, RecursionError):   # protobuf refusing a value or a deep copy: skip it
            continue


def write(rng: random.Random, case, model, stem: str) -> str:
    data, suffix = hv.serialize(rng, model)
    if suffix == ".pb" and rng.random() < 0.12:
        data = wire_edit(rng, data, type(model))
    return case.write(stem + suffix, data)


def make(rng: random.Random, case) -> None:
    from hostile_env import ROOT

    kind = rng.choices(["plan", "pair", "predict", "gen"], weights=[35, 25, 15, 25])[0]
    flags = rng.choice([[], [], ["-q"]])
    if kind == "plan" or (kind == "gen" and rng.random() < 0.4):
        rel = rng.choice(list(PLANS)) if kind == "plan" else "gen_plan"
        plan = load(rel) if kind == "plan" else gen_plan(rng)
        mutate(rng, plan)
        name = write(rng, case, plan, "plan")
        case.link(*[f for f in ("models/digits/train.minidb", "models/digits/test.minidb",
                                "models/binary_adder/train.minidb", "models/binary_adder/test.minidb")])
        nets = [n.name for n in plan.network] or ["x"]
        ckpt = PLANS.get(rel) or "xor_done"
        case.argv = rng.choice([
            ["run", name, "-q", *rng.choice([[], ["-n", "1"], ["-n", "2"]])],
            ["run", name, "-q", "-n", "1"], ["inspect", name], ["inspect", name, "--shapes"],
            ["convert", name, rng.choice(["out.pb", "out.pbtxt"])], _draw(rng, [name]),
            ["export-onnx", name, "-o", "out.onnx", "--net", rng.choice(nets), "--input", "X=2,2"],
            ["export-predict", name, "--load", str(case.env.assets / "ckpt" / f"{ckpt}.minidb"), "-o", "exported",
             *rng.choice([[], ["--format", "pbtxt"], ["--format", "npz"]])]])
        return
    if kind == "pair":
        init_rel, pred_rel, feed, spec = rng.choice(PAIRS)
        init, pred = load(init_rel), load(pred_rel)
        which = rng.choice(["init", "predict", "both"])
        if which != "predict":
            mutate(rng, init)
        if which != "init":
            mutate(rng, pred)
        i, p = write(rng, case, init, "init"), write(rng, case, pred, "predict")
        feed = feed.replace("PHOTO", str(ROOT / "models/style_transfer/photo.png"))
        case.argv = rng.choice([
            ["run", i, p, "--feed", feed, *flags], ["run", i, p, "--feed", feed, "-n", "3", "-q"],
            ["inspect", p, "--shapes", "--init", i, "--input", spec], ["inspect", i],
            ["synth-init", p, "-o", "synth.pb", "--input", spec], ["export-onnx", i, p, "-o", "out.onnx",
                                                                  "--input", spec],
            _draw(rng, [i, p]), ["convert", rng.choice([i, p]), rng.choice(["out.pb", "out.pbtxt"])]])
        return
    if kind == "predict":
        rel = rng.choice(list(PREDICTS))
        net = load(rel)
        mutate(rng, net)
        p = write(rng, case, net, "predict")
        spec = PREDICTS[rel]
        case.argv = rng.choice([["inspect", p], ["inspect", p, "--shapes", "--input", spec],
                                ["synth-init", p, "-o", "synth.pb", "--input", spec, "--classes", "10"],
                                _draw(rng, [p]), ["convert", p, "out.pbtxt"],
                                ["export-onnx", p, "-o", "out.onnx", "--input", spec],
                                ["run", p, "-q", "--feed", spec.split("=")[0] + "=[[[[0.5]]]]"]])
        return
    net = gen_net(rng) if rng.random() < 0.6 else gen_control(rng)
    mutate(rng, net)
    p = write(rng, case, net, "net")
    feed = rng.choice(["X=[[1, -2, 3], [0.5, 0, -1]]", "X=[[1, 2, 3]]", "X=[[0.5, 1.5]]"])
    case.argv = rng.choice([["run", p, "--feed", feed, *flags], ["run", p, "--feed", feed, "-n", "3", "-q"],
                            ["inspect", p, "--shapes", "--input", "X=2,3"], _draw(rng, [p]),
                            ["synth-init", p, "-o", "synth.pb", "--input", "X=2,3"],
                            ["export-onnx", p, "-o", "out.onnx", "--input", "X=2,3"], ["convert", p, "out.pb"]])


def _draw(rng: random.Random, files: list[str]) -> list[str]:
    out = "out.svg" if rng.random() < 0.05 else "out.dot"
    return ["draw", *files, "-o", out, *rng.choice([[], [], ["--backward"], ["--collapse", "no"],
                                                    ["--max-ops", str(rng.choice([0, 1, 50, -1]))]])]
