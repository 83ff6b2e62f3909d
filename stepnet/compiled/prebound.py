"""Prebound timesteps: a step workspace's compiled routine with the arrays each entry reads and writes looked up
once, not at every timestep of every run.

A step workspace runs the same timestep of every run on the same buffers and link views, as long as its
external blobs hold the same arrays (the weights and the state tensors the op keeps). So each entry of the
routine (an op's compiled form, or a fused pair) is bound to the arrays it saw: its form's `prebind(ins, outs,
fresh)` returns a call with the reshapes, layout checks and lookups done once (a form without one: its fn on
those arrays). Before each call the entry's dependencies are compared by identity (the external blobs it reads
or writes, itself or through a link view: the link op's input it views); where one holds another array, the
entry runs as the routine does and is bound again.

Some arrays are new in every run: the views of a tensor the op does not own (the input projection, which the
main net writes anew; the link op's `keep` flag says which), and externals seen holding another array from one
binding to the next (a gradient the main net makes anew, a fed input). A binding never holds them across calls,
so the main net can reuse their memory: each call reads them from their blobs into the bound input list
(`fresh` positions) and drops them after. The calls compute what the forms compute, in the same order, so the
results are the routine's bits, and the blobs hold what the routine leaves.

The generated code holds only generated names (d0_1, A, T, ...), never a name from the model."""
from __future__ import annotations

import functools

_UNSEEN = object()      # a dependency's value before the first binding (no array is it)


class Prebound:
    """The bound entries of one step workspace's routine. entries: (fn, input blobs, output blobs, sets-blobs)
    per entry; forms: the entries' Fast; external: ids of the net's external blobs whose array may change from
    run to run (the timestep blob, whose value is always that step's, is not one); at: [the entry running];
    codes: {source: compiled code} shared by the step routines of one program (the same code, other names)."""

    def __init__(self, entries, forms, external: set, at: list, codes: dict | None = None):
        self.entries, self.forms, self.external, self.at = entries, forms, external, at
        self.codes = {} if codes is None else codes
        self.volatile: set = set()     # ids of externals seen holding another array than at their binding
        self.body = None

    def run(self) -> None:
        if self.body is None:
            self.body = self._generate()
        self.body()

    # ----------------------------------------------------------------------------- classification
    def _plan(self) -> list:
        """Per entry (dependencies, fresh inputs [(position, blob)], fresh outputs)."""
        external, volatile = self.external, self.volatile
        fresh_blobs, made_from, plan = set(), {}, []

        def sort(blobs, never, deps) -> list:
            """The (position, blob) read fresh; the others' dependencies added to deps."""
            fresh = []
            for j, b in enumerate(blobs):
                if id(b) in fresh_blobs or id(b) in volatile or j in never:
                    fresh.append((j, b))
                    continue
                if id(b) in external:
                    deps[id(b)] = b
                for src in made_from.get(id(b), ()):
                    deps[id(src)] = src
            return fresh
        for (_, ins, outs, blobs), fast in zip(self.entries, self.forms):
            deps = {}
            fresh_in, fresh_out = sort(ins, fast.fresh_inputs, deps), sort(() if blobs else outs, (), deps)
            if blobs:      # outputs the form points at rows of its inputs (the link views)
                for k, b in enumerate(outs):
                    srcs = (ins[fast.sources[k]],) if fast.sources is not None else ins
                    if k in fast.made_fresh or any(id(s) in volatile for s in srcs):
                        fresh_blobs.add(id(b))
                    else:
                        made_from[id(b)] = tuple(s for s in srcs if id(s) in external)
            plan.append((tuple(deps.values()), tuple(fresh_in), tuple(fresh_out)))
        return plan

    # ----------------------------------------------------------------------------- code
    def _generate(self):
        """body(): when every entry is bound and every dependency holds the array it held then (checked once
        for all entries: no entry changes which array an external blob holds), the bound calls in order;
        otherwise each entry checks its own dependencies and binds again where one changed."""
        plan = self._plan()
        n = len(self.entries)
        calls, seen = [None] * n, [(_UNSEEN,) * len(deps) for deps, _, _ in plan]   # per entry: call, deps' values
        ins_of, outs_of = [None] * n, [None] * n                                      # its bound input / output lists
        every = list({id(b): b for deps, _, _ in plan for b in deps}.values())
        held = [None]                                # the values of `every` when all entries were last bound
        self.state = (plan, calls, seen, ins_of, outs_of)
        names = {"T": calls, "V": seen, "A": ins_of, "O": outs_of, "again": self._again, "at": self.at,
                 "H": held, "bound": lambda: held.__setitem__(0, tuple(b.value for b in every))}
        names.update((f"e{k}", b) for k, b in enumerate(every))
        fast, slow = [], []
        for i, (deps, fresh_in, fresh_out) in enumerate(plan):
            names.update((f"d{i}_{j}", b) for j, b in enumerate(deps))
            names.update((f"f{i}_{j}", b) for j, b in fresh_in)
            names.update((f"g{i}_{k}", b) for k, b in fresh_out)
            call = [f"a = A[{i}]"] * bool(fresh_in) + [f"o = O[{i}]"] * bool(fresh_out)
            call += [f"a[{j}] = f{i}_{j}.value" for j, _ in fresh_in]
            call += [f"o[{k}] = g{i}_{k}.value" for k, _ in fresh_out]
            call += [f"T[{i}]()"] + [f"a[{j}] = None" for j, _ in fresh_in] + [f"o[{k}] = None" for k, _ in fresh_out]
            fast += [f"at[0] = {i}"] + call
            test = " and ".join([f"T[{i}] is not None"] + [f"d{i}_{j}.value is v[{j}]" for j in range(len(deps))])
            slow += [f"at[0] = {i}"] + [f"v = V[{i}]"] * bool(deps) + [f"if {test}:"]
            slow += [f"    {c}" for c in call] + ["else:", f"    again({i})"]
        same = " and ".join(["h is not None"] + [f"e{k}.value is h[{k}]" for k in range(len(every))])
        lines = ["def body():", "    h = H[0]", f"    if {same}:"] + [f"        {c}" for c in fast or ["pass"]]
        lines += ["        return"] + [f"    {c}" for c in slow]
        lines += ["    if all(c is not None for c in T):", "        bound()"]
        source = "\n".join(lines) + "\n"
        code = self.codes.get(source)
        if code is None:
            code = self.codes[source] = compile(source, "<prebound>", "exec")
        exec(code, names)   # noqa: S102 - generated names only
        return names["body"]

    def _again(self, i: int) -> None:
        """Entry i as the routine runs it, on its blobs' current values, then bound to them. A dependency that
        holds another array than at the last binding is volatile from now on (the code is generated again
        before the next timestep: its reads become fresh)."""
        fn, ins, outs, blobs = self.entries[i]
        plan, calls, seen, ins_of, outs_of = self.state
        deps, fresh_in, fresh_out = plan[i]
        iv = [b.value for b in ins]
        ov = outs if blobs else [b.value for b in outs]
        fn(iv, ov)
        changed = {id(b) for b, s in zip(deps, seen[i]) if s is not _UNSEEN and b.value is not s}
        if changed:
            self.volatile |= changed
            self.body = None
            return
        prebind = self.forms[i].prebind
        bound = None
        if prebind is not None and not fresh_out:
            bound = prebind(iv, ov, frozenset(j for j, _ in fresh_in))
        calls[i] = bound if bound is not None else functools.partial(fn, iv, ov)
        ins_of[i], outs_of[i] = iv, ov
        seen[i] = tuple(b.value for b in deps)
        for j, _ in fresh_in:
            iv[j] = None
        for k, _ in fresh_out:
            ov[k] = None
