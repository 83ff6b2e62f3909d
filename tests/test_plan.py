"""PlanDef execution (spec §6.8)."""
import numpy as np
import pytest

from stepnet import PlanDef, Workspace
from stepnet.core.errors import PlanError
from stepnet.io.proto import parse_text

INIT = """
network { name: "init"
  op { type: "ConstantFill" output: "it" arg { name: "shape" ints: 1 } arg { name: "value" i: 0 }
       arg { name: "dtype" i: 10 } }
  op { type: "ConstantFill" output: "rep" arg { name: "shape" ints: 1 } arg { name: "value" i: 0 }
       arg { name: "dtype" i: 10 } }
  op { type: "ConstantFill" output: "limit" arg { name: "shape" ints: 1 } arg { name: "value" i: 3 }
       arg { name: "dtype" i: 10 } }
}
network { name: "tick" op { type: "Iter" input: "it" output: "it" } }
network { name: "report" op { type: "Iter" input: "rep" output: "rep" } }
network { name: "check" op { type: "GE" input: ["it", "limit"] output: "stop" } }
execution_step { name: "init" network: "init" }
"""


def plan(steps: str) -> PlanDef:
    return parse_text(f'name: "p"\n{INIT}\n{steps}', "plan")


def run(steps: str, **kw) -> Workspace:
    ws = Workspace()
    ws.run_plan(plan(steps), **kw)
    return ws


def count(ws, name="it"):
    return int(ws.fetch(name)[0])


def test_num_iter_and_default_once():
    assert count(run('execution_step { name: "t" network: "tick" num_iter: 4 }')) == 4
    assert count(run('execution_step { name: "t" network: "tick" }')) == 1


def test_should_stop_blob_checked_after_every_net():
    ws = run('execution_step { name: "loop" network: ["tick", "check"] should_stop_blob: "stop" }')
    assert count(ws) == 3


def test_should_stop_blob_with_substeps_and_only_once():
    steps = """execution_step { name: "outer" should_stop_blob: "stop"
        substep { name: "a" network: "tick" } substep { name: "b" network: "check" } }"""
    assert count(run(steps)) == 3
    once = 'execution_step { name: "o" network: ["tick", "check"] should_stop_blob: "stop" only_once: true }'
    assert count(run(once)) == 1


def test_nested_substeps_iterate():
    steps = """execution_step { name: "outer" num_iter: 2
        substep { name: "inner" network: "tick" num_iter: 3 } }"""
    assert count(run(steps)) == 6


def test_report_net_every_interval_and_at_end():
    ws = run('execution_step { name: "t" network: "tick" num_iter: 5 report_net: "report" report_interval: 0 }')
    assert count(ws, "rep") == 6  # after each of 5 iterations (interval 0) and once at the end
    ws = run('execution_step { name: "t" network: "tick" num_iter: 5 report_net: "report" report_interval: 3600 }')
    assert count(ws, "rep") == 1  # only the final report


def test_concurrent_substeps_and_instances_run_in_threads():
    """Each substep of a concurrent step runs in its own thread per iteration (tests/test_concurrent_plan.py has
    the queues between them); num_concurrent_instances runs each substep that many times at once. Each counter
    here is ticked by one thread only, or by AtomicIter."""
    steps = """execution_step { name: "c" concurrent_substeps: true num_iter: 2
        substep { name: "a" network: "tick" } substep { name: "b" network: "report" num_iter: 3 } }"""
    ws = run(steps)
    assert (count(ws), count(ws, "rep")) == (2, 6)
    p = parse_text('name: "p" network { name: "init" op { type: "CreateMutex" output: "m" } }\n'
                   'network { name: "t" op { type: "AtomicIter" input: ["m", "it"] output: "it" } }\n'
                   'execution_step { network: "init" }\n'
                   'execution_step { num_concurrent_instances: 4 substep { network: "t" num_iter: 25 } }', "plan")
    ws = Workspace()
    ws.feed("it", np.zeros(1, np.int64))
    ws.run_plan(p)
    assert count(ws) == 100


def test_a_concurrent_steps_stop_blob_is_read_after_its_threads():
    steps = """execution_step { name: "c" concurrent_substeps: true should_stop_blob: "stop"
        substep { name: "a" network: ["tick", "check"] } substep { name: "b" network: "report" } }"""
    ws = run(steps)
    assert (count(ws), count(ws, "rep")) == (3, 3)


def test_create_workspace_keeps_new_blobs_local():
    steps = 'execution_step { name: "c" network: ["tick", "check"] create_workspace: true }'
    ws = run(steps)
    assert count(ws) == 1  # existing parent blobs are updated ...
    assert not ws.has("stop")  # ... new ones live in the child workspace


def test_iterations_override():
    assert count(run('execution_step { name: "t" network: "tick" num_iter: 50 }', iterations=7)) == 7


@pytest.mark.parametrize("iterations, ticks, reports", [(None, 12, 3), (2, 2, 1), (8, 8, 2), (13, 13, 4)])
def test_iterations_override_counts_the_innermost_loop(iterations, ticks, reports):
    """An epoch loop of 3 around an inner loop of 4 ticks (inside a step that runs once) and a report: the
    training iterations are the ticks, so --iterations N runs N ticks (the last epoch stops its inner loop
    early, then reports), as many epochs as that takes."""
    steps = """execution_step { name: "main" substep { name: "epochs" num_iter: 3
                 substep { name: "once" substep { name: "inner" network: "tick" num_iter: 4 } }
                 substep { name: "rep" network: "report" } } }"""
    ws = run(steps, iterations=iterations)
    assert count(ws) == ticks
    assert int(ws.fetch("rep")[0]) == reports


def test_progress_counts_overall_iterations_of_nested_loops():
    seen = []
    steps = """execution_step { name: "epochs" num_iter: 2 substep { name: "inner" network: "tick" num_iter: 3 }
                 substep { name: "rep" network: "report" } }
               execution_step { name: "eval" network: "check" should_stop_blob: "stop" }"""
    run(steps, progress=lambda s, i, n: seen.append((s, i, n)))
    assert seen == [("inner", i, 6) for i in range(1, 7)]     # one count over both epochs; the eval loop uncounted


def test_training_loops_describe_what_iterations_set():
    from stepnet.runtime.plan import training_loops
    p = plan("""execution_step { name: "epochs" num_iter: 8 substep { name: "steps" network: "tick" num_iter: 250 }
                  substep { name: "rep" network: "report" } }""")
    (loop,) = training_loops(p, 30).values()
    assert (loop.units, loop.head_iterations, loop.natural) == (30, 1, 2000)
    assert loop.describe() == "30 iterations of 'epochs' > 'steps' (the plan has 8 x 250 = 2000)"


def test_progress_callback():
    seen = []
    run('execution_step { name: "t" network: "tick" num_iter: 3 }', progress=lambda s, i, n: seen.append((s, i, n)))
    assert seen == [("t", 1, 3), ("t", 2, 3), ("t", 3, 3)]


@pytest.mark.parametrize("steps, message", [
    ('execution_step { name: "x" network: "tick" substep { name: "y" } }', "both substeps and networks"),
    ('execution_step { name: "x" network: "tick" num_iter: 2 should_stop_blob: "stop" }', "num_iter and should_stop"),
    ('execution_step { name: "x" network: "tick" only_once: true }', "only_once needs should_stop_blob"),
    ('execution_step { name: "x" network: "tik" }', "network 'tik'.*did you mean tick"),
])
def test_malformed_steps(steps, message):
    with pytest.raises(PlanError, match=message):
        run(steps)


def test_duplicate_network_names():
    p = plan('network { name: "tick" }')
    with pytest.raises(PlanError, match="two networks are named 'tick'"):
        Workspace().run_plan(p)


def test_existing_net_is_recreated_once():
    ws = Workspace()
    ws.feed("it", np.zeros(1, np.int64))
    p = parse_text('network { name: "tick" op { type: "Iter" input: "it" output: "it" } }\n'
                   'execution_step { network: "tick" num_iter: 2 }', "plan")
    ws.create_net(p.network[0])
    ws.run_plan(p)
    assert count(ws) == 2


def test_each_run_binds_the_plans_nets_afresh_replacing_same_named_nets():
    """Caffe2's plan executor creates a plan's nets with overwrite: a same-named net made before is replaced,
    and a second run of the plan binds its nets again (ops start with fresh state)."""
    ws = Workspace()
    ws.feed("it", np.zeros(1, np.int64))
    ws.create_net(parse_text('name: "tick" op { type: "Iter" input: "it" output: "it" }', "net"))
    p = plan('execution_step { name: "t" network: "tick" num_iter: 2 }')
    outside = ws.net("tick")
    ws.run_plan(p)
    first = ws.net("tick")
    assert first is not outside and first.netdef == p.network[1] and first.netdef is not p.network[1]
    ws.run_plan(p)
    assert ws.net("tick") is not first and count(ws) == 2    # the init net refilled it, the tick ran twice
