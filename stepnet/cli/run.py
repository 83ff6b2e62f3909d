"""`stepnet run | inspect | convert`: run Caffe2 models from the command line."""
from __future__ import annotations

import argparse
import signal
import sys
import time
import traceback
import warnings
from pathlib import Path


from ..io import checkpoints, images, proto
from ..io.feeds import parse_feed
from ..core.errors import ArgumentError, MissingBlobError, StepnetError, StepnetWarning, one_line
from ..graph.view import Graph
from ..distributed.launch import per_rank
from ..core.limits import add_limit_flags, limits_of
from ..core.int8 import Int8Tensor
from ..core.extras import install_hint
from ..core.version import VERSION
from .metrics import MetricsWriter
from ..passes.unread import drop_unread_gradients
from ..runtime.plan import training_loops
from ..runtime.profile import Profiler
from .progress import Monitor
from .results import format_blob, refuse_overwrites, report_writes, save_npz  # noqa: F401 - re-exported
from .tools import (  # noqa: F401 - re-exported
    add_tool_parsers, cmd_convert, cmd_inspect, cmd_ops, cmd_synth_init, describe_net, feed_device, op_table,
    refuse_unread, unsupported_ops)
from .onnx import add_parser as add_onnx_parser, run_in_onnxruntime
from ..runtime.workspace import DEFAULT_THREADS, Workspace
from ..kernels import jit

FUSED_CELLS = {"auto": None, "on": True, "off": False}    # --fused-cells -> Workspace(fused_cells=...)


def _fused_cells(text: str) -> str:
    if text not in FUSED_CELLS:
        raise argparse.ArgumentTypeError(f"--fused-cells is auto, on or off, got {text!r}")
    if text == "on" and not jit.installed():
        raise argparse.ArgumentTypeError(f"--fused-cells on needs numba: {install_hint('fast')}")
    return text


def _threads(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"--threads needs a count >= 0, got {text!r}")
    return n


# --------------------------------------------------------------------------------------------- commands
@per_rank  # under mpiexec: {rank}/{size} in paths, rank 0 prints and writes, a failing rank aborts the job
def cmd_run(a) -> int:
    model = proto.load(a.model)
    predict_def = proto.load(a.predict_net, kind="net") if a.predict_net else None
    profiler = Profiler() if a.profile or _has_prof_dag(model, predict_def) else None
    ws = Workspace(seed=a.seed, gpu=a.device, strict=a.strict, check_nan=a.check_nan, limits=limits_of(a),
                   profiler=profiler, threads=a.threads,
                   fused_cells=FUSED_CELLS[a.fused_cells])
    monitor = Monitor(show=not a.quiet, metrics=MetricsWriter(a.metrics) if a.metrics else None)
    if profiler is not None and not a.quiet:
        print("stepnet: profiling: every op is timed, step-net ops at every timestep, and fused LSTM/GRU cells run "
              "op by op, which adds to the run's time (docs/performance.md); the table's times are this run's",
              file=sys.stderr, flush=True)
    try:
        return _run(a, ws, model, predict_def, monitor, profiler)
    except MissingBlobError as e:
        if a.load or a.resume:
            raise
        raise MissingBlobError(e.message, at=e.at, detail=f"{e.detail}; for trained weights, load the "
                               "checkpoint their training run saved with --load CKPT") from None
    finally:
        monitor.close()
        if monitor.metrics is not None:
            monitor.metrics.close()
        report_writes(ws)


def _run(a, ws, model, predict_def, monitor: Monitor, profiler: Profiler | None) -> int:
    feeds = {}
    for spec in a.feed:
        feeds.update(parse_feed(spec, ws.limits.max_blob_bytes))
    outputs: list[str] = []
    if None in feeds:
        feeds[_first_input(model, a)] = feeds.pop(None)
    is_plan = isinstance(model, proto.PlanDef)
    _check_checkpoint_flags(a, is_plan)
    refuse_unread(feeds, list(model.network) if is_plan else [model, *([predict_def] if predict_def else [])],
                  "--feed")
    if not ws.limits.overwrite:   # before anything runs: a short run never replaces a trained model unasked
        refuse_overwrites(ws, list(model.network) if is_plan else [model, *([predict_def] if predict_def else [])])
    if is_plan:
        if a.predict_net:
            raise ArgumentError(f"{a.model} is a PlanDef; give a second file only after an init NetDef")
        if not a.checkpoint:      # (a checkpoint saves every blob: then every value is computed)
            model, _ = drop_unread_gradients(model, keep=a.fetch)
        if a.load:
            checkpoints.load(ws, a.load)
        for name, value in feeds.items():
            ws.feed(name, value, feed_device(list(model.network), name))
        resume = checkpoints.Resume(a.resume, ws.limits.max_blob_bytes) if a.resume else None
        saver = checkpoints.Checkpointer(a.checkpoint, a.checkpoint_every) if a.checkpoint else None
        previous = signal.signal(signal.SIGINT, saver.interrupt) if saver else None
        if a.engine == "onnxruntime":
            warnings.warn(StepnetWarning("onnxruntime engine: it runs predict nets; a plan runs on stepnet's engine"),
                          stacklevel=2)
        ws.reporter = monitor.report    # scalars the plan's Print ops print: labeled lines, metrics rows
        if not a.quiet:
            _describe_loops(model, a.iterations)
        start = time.perf_counter()
        try:
            ws.run_plan(model, progress=monitor, iterations=a.iterations, boundary=saver, resume=resume)
        finally:
            if saver:
                signal.signal(signal.SIGINT, previous)
        wall = time.perf_counter() - start
        monitor.close()
    else:
        if a.predict_net:
            init, predict = model, predict_def
            ws.run_net_once(init)
        else:
            init, predict = None, model
        if not a.checkpoint:
            predict, _ = drop_unread_gradients(predict, keep=[*a.fetch, *predict.external_output])
        if a.load:
            checkpoints.load(ws, a.load)
        for name, value in feeds.items():
            ws.feed(name, value, feed_device([predict], name))
        _check_inputs(ws, predict, init, a)
        from ..passes.shapes import infer_net, specs_of_workspace
        infer_net(predict, specs_of_workspace(ws, ws.blobs()),  # static mismatches, reported before running
                  max_blob_bytes=ws.limits.max_blob_bytes)
        start = time.perf_counter()   # the init net ran above: time from here, and count only the runs
        if profiler is not None:
            profiler.stats.clear()
        if not _onnxruntime_ran(a, ws, predict, feeds, profiler):
            net = ws.create_net(predict)
            for _ in range(a.iterations or 1):
                net.run()
        wall = time.perf_counter() - start
        outputs = list(predict.external_output)
    if profiler is not None:
        print(profiler.report(wall), flush=True)
    if a.checkpoint:
        saved = checkpoints.save(ws, a.checkpoint, checkpoints.Position(checkpoints.FINISHED) if is_plan else None)
        if not a.quiet:
            print(f"checkpoint: {saved} blob(s) saved to {a.checkpoint}")
    names = a.fetch or outputs
    fetched = {n: ws.fetch(n) for n in names}
    if not a.quiet:
        for n, v in fetched.items():
            print(format_blob(n, v))
    if a.save:
        save_npz(Path(a.save), fetched)
        if not a.quiet:
            print(f"saved {len(fetched)} blob(s) to {a.save}")
    if a.save_image:
        if not fetched:
            raise ArgumentError("--save-image needs a blob: name it with --fetch")
        path, layout = images.split_layout(a.save_image)
        name, value = next(iter(fetched.items()))
        value = value.dequantize() if isinstance(value, Int8Tensor) else value   # an Int8 image: its real values
        proto.atomic_write(Path(path), images.image_bytes(value, layout, images.format_of(path)))
        if not a.quiet:
            print(f"saved {one_line(name)} as image {path}")
    return 0


def _onnxruntime_ran(a, ws, predict, feeds, profiler) -> bool:
    """Whether --engine ran the predict net in onnxruntime (False: run it on stepnet's engine). auto takes
    onnxruntime only where it gives the same run: a CPU workspace, no per-op profile or NaN check."""
    if a.engine == "stepnet":
        return False
    if a.engine == "auto":
        import importlib.util
        from ..core import backend
        gpu = a.device in ("cuda", "emulate") or (a.device == "auto" and backend.cupy_module() is not None)
        extra = all(importlib.util.find_spec(m) is not None for m in ("onnx", "onnxruntime"))
        if gpu or profiler is not None or a.check_nan or not extra:
            return False
    return run_in_onnxruntime(ws, predict, feeds, a.fetch, a.iterations or 1, a.threads,
                              quiet_fallback=a.engine == "auto")


def _has_prof_dag(*models) -> bool:
    """Caffe2's profiling net type in the model: profile the run as --profile does."""
    nets = [n for m in models if m is not None for n in (m.network if isinstance(m, proto.PlanDef) else [m])]
    return any(n.type == "prof_dag" for n in nets)


def _describe_loops(plan, iterations: int | None) -> None:
    """Say what the run will train for: exactly what an --iterations override set."""
    loops = training_loops(plan, iterations)
    prefix = f"--iterations {iterations}: " if iterations is not None else "running "
    for loop in loops.values():
        print(f"{prefix}{loop.describe()}", file=sys.stderr, flush=True)
    if iterations is not None and not loops:
        print(f"--iterations {iterations}: plan {plan.name!r} has no loop with num_iter > 1 outside loops with a "
              "stop blob; nothing was set", file=sys.stderr, flush=True)


def cmd_plot(a) -> int:
    from .metrics import plot

    n = plot(a.metrics, a.output, a.name or None, a.title)
    print(f"plotted {n} curve(s) from {a.metrics} to {a.output}")
    return 0


def _check_checkpoint_flags(a, is_plan: bool) -> None:
    if a.checkpoint_every is not None and (a.checkpoint_every < 1 or not a.checkpoint or not is_plan):
        raise ArgumentError("--checkpoint-every N needs N >= 1, --checkpoint PATH and a plan (it counts iterations "
                            "of the plan's outermost loops)")
    if a.resume and not is_plan:
        raise ArgumentError("--resume continues a plan run; for a net, feed a checkpoint's blobs with --load")


def _first_input(model, a) -> str:
    """The blob a nameless image feed goes to: the predict net's first external input (Caffe2's Predictor
    feeds inputs by position)."""
    net = proto.load(a.predict_net, kind="net") if a.predict_net else model
    if not isinstance(net, proto.NetDef) or not net.external_input:
        raise ArgumentError("an image given without NAME= feeds the predict net's first external input, "
                            "but this model declares none; use --feed NAME=IMAGE")
    return net.external_input[0]


def _check_inputs(ws, predict, init, a) -> None:
    """Every op input that no earlier op makes must exist: list the missing ones in one message."""
    missing = [name for name in Graph.of(predict).read_before_written() if not ws.has(name)]
    if missing:
        source = "the init net" if init is not None else "the workspace"
        raise MissingBlobError(f"net {predict.name!r} needs blobs that neither {source} makes nor --feed gives: "
                               f"{', '.join(missing)}; feed them with --feed NAME=FILE.npy")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="stepnet", description="Run Caffe2 protobuf models on numpy/CuPy.")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    p.add_argument("--version", action="version", version=f"stepnet {VERSION}")
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="run a PlanDef, a NetDef, or an init net followed by a predict net")
    r.add_argument("model", help="PlanDef or NetDef (.pb / .pbtxt); with PREDICT_NET: the init net")
    r.add_argument("predict_net", nargs="?", help="predict net, run after the init net")
    r.add_argument("--iterations", "-n", type=int,
                   help="runs of the net; for a plan, its training iterations: the iterations of the innermost of "
                        "the single loops nested in each outermost loop (what it set is printed)")
    r.add_argument("--feed", action="append", default=[], metavar="NAME=FILE.npy|FILE.npz|VALUE[:dtype]")
    r.add_argument("--fetch", nargs="+", action="extend", default=[], metavar="NAME", help="blobs to print and save")
    r.add_argument("--save", metavar="OUT.npz", help="write the fetched blobs (default: external outputs)")
    r.add_argument("--save-image", metavar="OUT.png[:layout]",
                   help="write the first fetched blob (an N×H×W×C uint8 image) as a picture; layout rgb, bgr, "
                        "rgba, bgra or gray (default rgb)")
    r.add_argument("--seed", type=int, default=0, help="seed of the random fill ops (default 0)")
    r.add_argument("--load", metavar="CHECKPOINT", help="feed every blob of a minidb checkpoint before running "
                                                          "(after the init net, for an init/predict pair)")
    r.add_argument("--checkpoint", metavar="PATH", help="save every tensor blob as a minidb after the run (for a "
                   "plan also on Ctrl-C, at the next iteration boundary, so that --resume can continue it)")
    r.add_argument("--checkpoint-every", type=int, metavar="N",
                   help="with --checkpoint and a plan: also save every N iterations of its outermost loops")
    r.add_argument("--resume", metavar="CHECKPOINT",
                   help="continue a plan run from a checkpoint written by --checkpoint-every or Ctrl-C (run the "
                        "same plan with the same flags)")
    r.add_argument("--device", choices=("auto", "cpu", "cuda", "emulate"), default="auto",
                   help="where CUDA ops run: auto (GPU if CuPy has one, else CPU), cpu, cuda, emulate")
    r.add_argument("--strict", action="store_true", help="unknown op arguments are errors, not warnings")
    r.add_argument("--check-nan", action="store_true", help="stop at the first op that produces NaN or Inf")
    r.add_argument("--engine", choices=("stepnet", "onnxruntime", "auto"), default="stepnet",
                   help="onnxruntime: export a predict net (once: kept by content in ~/.cache/stepnet/onnx) and "
                        "run it there, with --threads intra-op threads (needs the onnx extra); auto: onnxruntime "
                        "where it can run the net (a predict net on the CPU, no --profile/--check-nan), quietly "
                        "stepnet's engine elsewhere")
    r.add_argument("--quiet", "-q", action="store_true",
                   help="no progress bar or lines, notices or fetched blobs (a model's Print ops still print, "
                        "scalars as labeled lines)")
    r.add_argument("--profile", action="store_true",
                   help="time every op (step-net ops per timestep) and print a table by op type and the slowest "
                        "ops after the run; a model with a prof_dag net is profiled without it")
    r.add_argument("--metrics", metavar="FILE.csv",
                   help="write every scalar the plan reports (its Print ops: losses, accuracies) as rows "
                        "iteration,name,value, flushed as they come; draw them with stepnet plot")
    r.add_argument("--fused-cells", type=_fused_cells, default="auto", metavar="auto|on|off",
                   help="LSTM/GRU cells, Softmax, Sigmoid, FC of one row, the one-hot FC gradient and Adam as numba "
                        "passes (the fast extra; auto: when numba is installed) or in numpy (off: the reference "
                        "arithmetic; results agree within float32 rounding)")
    r.add_argument("--threads", type=_threads, default=DEFAULT_THREADS, metavar="N",
                   help=f"BLAS threads while nets run (default {DEFAULT_THREADS}: on a shared 2-CPU machine two "
                        "threads made a char-rnn step up to 2.2x slower; 0 leaves BLAS as it is)")
    add_limit_flags(r, paths=True)
    r.set_defaults(func=cmd_run)

    i = sub.add_parser("inspect", help="nets, ops by type, inputs/outputs, unsupported ops")
    i.add_argument("model")
    i.add_argument("--kind", choices=sorted(proto.KINDS))
    i.add_argument("--strict", action="store_true", help="exit 1 when some op is unsupported")
    i.add_argument("--shapes", action="store_true", help="infer and print every blob's shape and dtype")
    i.add_argument("--input", action="append", default=[], metavar="NAME=D1,D2,...[:dtype]",
                   help="shape and dtype (default float32) of an input blob, for --shapes; dims separated by "
                        "',' or 'x', none for a scalar")
    i.add_argument("--init", metavar="INIT_NET", help="init net whose outputs feed the shapes of --shapes")
    add_limit_flags(i, paths=False)
    i.set_defaults(func=cmd_inspect)

    o = sub.add_parser("ops", help="list the supported operators, or describe one")
    o.add_argument("name", nargs="?")
    o.add_argument("--markdown", action="store_true")
    o.set_defaults(func=cmd_ops)

    si = sub.add_parser("synth-init", help="an init net of random fills for a weightless predict net")
    si.add_argument("predict_net")
    si.add_argument("-o", "--output", required=True, metavar="INIT.pb")
    si.add_argument("--input", action="append", default=[], required=True, metavar="NAME=D1,D2,...[:dtype]",
                    help="shape and dtype (default float32) of a data input, as inspect --input takes them, "
                         "e.g. data=1,3,224,224 or ids=8:int64")
    si.add_argument("--width", type=int, default=64, help="output width of layers the net does not fix")
    si.add_argument("--classes", type=int, default=1000, help="output width of the last layer")
    si.add_argument("--param", action="append", default=[], metavar="NAME=D1,D2,...",
                    help="a parameter's dims, as --input takes them but without :dtype (fills are float32)")
    si.add_argument("--seed", type=int, default=0)
    si.set_defaults(func=cmd_synth_init)

    pl = sub.add_parser("plot", help="draw a --metrics CSV file's curves (needs the plots extra: matplotlib)")
    pl.add_argument("metrics", metavar="FILE.csv")
    pl.add_argument("-o", "--output", required=True, metavar="OUT.png", help="the image (format by extension)")
    pl.add_argument("--name", action="append", default=[], help="only these values (default: all)")
    pl.add_argument("--title")
    pl.set_defaults(func=cmd_plot)

    add_tool_parsers(sub)

    c = sub.add_parser("convert", help="convert between .pb and .pbtxt (by the output's extension)")
    c.add_argument("input")
    c.add_argument("output")
    c.add_argument("--kind", choices=sorted(proto.KINDS))
    c.set_defaults(func=cmd_convert)
    add_onnx_parser(sub)
    return p


def main(argv=None) -> int:
    parser = build_parser()
    a = parser.parse_args(argv)
    _tolerant_output()
    with warnings.catch_warnings():
        warnings.simplefilter("default")
        warnings.showwarning = _show_warning
        try:
            return a.func(a)
        except StepnetError as e:
            if a.debug:
                traceback.print_exc()
            print(f"stepnet: error: {one_line(str(e))}", file=sys.stderr)
            return 1
        except KeyboardInterrupt as e:
            print(f"stepnet: interrupted{'; ' + str(e) if str(e) else ''}", file=sys.stderr)
            return 130
        except BrokenPipeError:  # e.g. `stepnet run ... | head`: the reader is gone, nothing more to say
            sys.stdout = None
            return 0
        except Exception as e:  # noqa: BLE001 - the last resort: a bug, or a bad input no check caught yet
            if a.debug:
                traceback.print_exc()
            text = one_line(" ".join(str(e).split()))
            text = text if len(text) <= 300 else text[:300] + " ..."
            print(f"stepnet: internal error: {type(e).__name__}: {text} (rerun with --debug for the traceback)",
                  file=sys.stderr)
            return 1


def _tolerant_output() -> None:
    """Names from files are printed as they are: never fail on a character the terminal's encoding lacks."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            try:
                reconfigure(errors="backslashreplace")
            except (ValueError, OSError):  # pragma: no cover - a stream that cannot change after writing
                pass


def _show_warning(message, category, filename, lineno, file=None, line=None):
    print(f"stepnet: warning: {one_line(str(message))}", file=sys.stderr)
