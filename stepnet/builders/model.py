"""ModelBuilder: an init net and a main net built together, parameters and their gradients, layer helpers
(fc, conv, relu, softmax, ...) that put initializers in the init net, optimizer builders with Caffe2's op
sequences, blob names and sign conventions (spec §6.3–§6.4), and a runnable PlanDef (`to_plan`).

Where this differs from Caffe2's ModelHelper/optimizer.py, on purpose:
- add_gradient_ops refuses a loss whose shape is known (from shape inference of the init net and the net,
  plus `shapes=` for inputs such as DB reads) to hold more than one value. Caffe2 accepts it and seeds the
  loss's gradient with ConstantFill(loss, value=1), i.e. it differentiates the *sum* of the elements; that is
  still what happens when the shape is unknown at build time, or when the gradient is given explicitly
  (`add_gradient_ops({loss: None})` or `{loss: "my_grad"}` skips the check).
- an optimizer refuses a trainable parameter that got no gradient (Caffe2 silently skips it): usually a
  layer that does not reach the loss. Pass `params=[...]` to optimize a subset, or create it trainable=False.
- optimizer blob counters (`SgdOptimizer_<k>_lr_cpu`) count per model, not per Python process, and the
  ONE blob, the LR blob and the clipping multiplier are made once per optimizer, not once per parameter
  (Caffe2 repeats identical ops per parameter; the results are the same).
"""
from __future__ import annotations

from .builder import BlobRef, NetBuilder
from ..core.errors import ArgumentError, ShapeError, StepnetError
from ..io.proto import DeviceOption, ExecutionStep, PlanDef

XAVIER = ("XavierFill", {})
ZEROS = ("ConstantFill", {"value": 0.0})
ONES = ("ConstantFill", {"value": 1.0})
GPU_DEVICE_TYPES = (1, 6)  # CUDA, HIP
CLIP_SCOPE = "norm_clipped_grad_update"


class ModelBuilder:
    """`init_net` (run once) and `net` (run every iteration) sharing one name/device scope.

    ModelBuilder(name, param_model=other) builds another net over the same parameters (Caffe2's
    param_model): it shares the init net, the scope, the parameters and their gradients, so a test net
    calling the same layer helpers reuses the trained weights instead of creating new ones."""

    def __init__(self, name: str = "model", param_model: "ModelBuilder | None" = None):
        self.name = name
        self.net = NetBuilder(name, param_model.scope if param_model else None)
        if param_model is not None:
            self.scope, self.init_net = param_model.scope, param_model.init_net
            self.params, self.param_to_grad = param_model.params, param_model.param_to_grad
            self.param_shapes, self._counts = param_model.param_shapes, param_model._counts
        else:
            self.scope, self.init_net = self.net.scope, NetBuilder(name + "_init", self.net.scope)
            self.params: list[str] = []
            self.param_to_grad: dict[str, object] = {}
            self.param_shapes: dict[str, tuple] = {}
            self._counts: dict[str, int] = {}
        self.params_without_grad: list[str] = []
        self.gradient_ops_added = False

    # ------------------------------------------------------------------------------------ scopes, params
    def name_scope(self, prefix: str):
        return self.scope.name_scope(prefix)

    def device_scope(self, option: DeviceOption | None):
        return self.scope.device_scope(option)

    def _out(self, blob_out) -> BlobRef:
        """An output name in the current scope; None makes <net>_blob_<k> (scoped, as Caffe2's brew does)."""
        return BlobRef(self.scope.scoped(str(blob_out if blob_out else self.net.next_name())))

    def create_param(self, name: str, shape, initializer=XAVIER, trainable: bool = True) -> BlobRef:
        """A parameter blob made by a fill op in the init net (name scoped like Caffe2's create_param).
        A name that already exists is returned as it is (its shape must agree), as Caffe2 does."""
        blob = BlobRef(self.scope.scoped(name))
        shape = tuple(int(d) for d in shape)
        if blob in self.param_shapes:
            if self.param_shapes[blob] != shape:
                raise ShapeError(f"parameter {blob!r} exists with shape {self.param_shapes[blob]}; it cannot "
                                 f"be created again with shape {shape}")
        else:
            op_type, args = initializer
            self.init_net.add_op(op_type, [], blob, shape=list(shape), **args)
            self.param_shapes[blob] = shape
            if trainable:
                self.params.append(blob)
        self.net.add_external_inputs(blob)
        return blob

    def add_gradient_ops(self, losses, shapes: dict | None = None) -> dict:
        """The backward pass of the main net (once); fills param_to_grad. A list of losses is checked to be
        scalars where inference knows their shape; `shapes` gives {blob: shape or TensorSpec} for inputs
        whose shape inference cannot see (fed blobs, DB reads)."""
        if self.gradient_ops_added:
            raise StepnetError(f"model {self.name!r}: add_gradient_ops was already called; call it once, "
                               "with every loss")
        losses = [losses] if isinstance(losses, str) else losses
        seeded = [] if isinstance(losses, dict) else list(losses)
        self._check_scalar_losses(seeded, shapes or {})
        grads = self.net.add_gradient_ops(losses)
        self.gradient_ops_added = True
        self.params_without_grad = [p for p in self.params if p not in grads]
        for p in self.params:
            if p in grads:
                self.param_to_grad[p] = grads[p]
        return grads

    def _check_scalar_losses(self, losses, shapes) -> None:
        if not losses:
            return
        import numpy as np

        from ..core.spec import TensorSpec, spec
        from ..passes.shapes import infer_net
        known = {name: s if isinstance(s, TensorSpec) else spec(s) for name, s in shapes.items()}
        known = infer_net(self.net.proto(), {**infer_net(self.init_net.proto(), {}), **known})
        for loss in losses:
            s = known.get(str(loss))
            if s is not None and s.shape is not None and None not in s.shape and int(np.prod(s.shape)) != 1:
                raise ShapeError(f"loss {str(loss)!r} has shape {s.shape}, not a scalar: its gradient would "
                                 "be seeded with ones, training the sum of its elements; reduce it first "
                                 "(AveragedLoss, SumElements) or give its gradient explicitly "
                                 "(add_gradient_ops({loss: grad_blob}))")

    # ------------------------------------------------------------------------------------ layers
    def fc(self, blob_in, blob_out, dim_in: int, dim_out: int, weight_init=XAVIER, bias_init=ZEROS, **kwargs):
        out = self._out(blob_out)
        w = self.create_param(BlobRef(f"{out}_w"), [dim_out, dim_in], weight_init)
        b = self.create_param(BlobRef(f"{out}_b"), [dim_out], bias_init)
        return self.net.FC([blob_in, w, b], out, **kwargs)

    def conv(self, blob_in, blob_out, dim_in: int, dim_out: int, kernel: int, weight_init=XAVIER,
             bias_init=ZEROS, group: int = 1, order: str = "NCHW", **kwargs):
        out = self._out(blob_out)
        shape = ([dim_out, dim_in // group, kernel, kernel] if order == "NCHW"
                 else [dim_out, kernel, kernel, dim_in // group])
        w = self.create_param(BlobRef(f"{out}_w"), shape, weight_init)
        b = self.create_param(BlobRef(f"{out}_b"), [dim_out], bias_init)
        extra = {"group": group} if group != 1 else {}
        return self.net.Conv([blob_in, w, b], out, kernel=kernel, order=order, **extra, **kwargs)

    def spatial_bn(self, blob_in, blob_out, dim_in: int, epsilon: float = 1e-5, momentum: float = 0.9,
                   is_test: bool = False, order: str = "NCHW"):
        out = self._out(blob_out)
        scale = self.create_param(BlobRef(f"{out}_s"), [dim_in], ONES)
        bias = self.create_param(BlobRef(f"{out}_b"), [dim_in], ZEROS)
        mean = self.create_param(BlobRef(f"{out}_rm"), [dim_in], ZEROS, trainable=False)
        var = self.create_param(BlobRef(f"{out}_riv"), [dim_in], ONES, trainable=False)
        if is_test:
            return self.net.SpatialBN([blob_in, scale, bias, mean, var], out, is_test=1, epsilon=epsilon,
                                      order=order)
        outs = [out, mean, var, BlobRef(f"{out}_sm"), BlobRef(f"{out}_siv")]
        return self.net.SpatialBN([blob_in, scale, bias, mean, var], outs, is_test=0, epsilon=epsilon,
                                  momentum=momentum, order=order)[0]

    def relu(self, blob_in, blob_out=None, **kwargs):
        return self.net.Relu(blob_in, blob_out, **kwargs)

    def tanh(self, blob_in, blob_out=None, **kwargs):
        return self.net.Tanh(blob_in, blob_out, **kwargs)

    def sigmoid(self, blob_in, blob_out=None, **kwargs):
        return self.net.Sigmoid(blob_in, blob_out, **kwargs)

    def softmax(self, blob_in, blob_out=None, **kwargs):
        return self.net.Softmax(blob_in, blob_out, **kwargs)

    def dropout(self, blob_in, blob_out, ratio: float = 0.5, is_test: bool = False):
        out = self._out(blob_out)
        if is_test:
            return self.net.Dropout(blob_in, [out], ratio=ratio, is_test=1)
        return self.net.Dropout(blob_in, [out, BlobRef(out + "_mask")], ratio=ratio, is_test=0)[0]

    def max_pool(self, blob_in, blob_out=None, **kwargs):
        return self.net.MaxPool(blob_in, blob_out, **kwargs)

    def average_pool(self, blob_in, blob_out=None, **kwargs):
        return self.net.AveragePool(blob_in, blob_out, **kwargs)

    def data_parallel(self, fuse: bool | None = None) -> None:
        """Train data-parallel over the processes of an mpiexec job (stepnet.passes.data_parallel, in place of
        Caffe2's data_parallel_model): the init net broadcasts the parameters from rank 0; after the backward
        pass every parameter gradient is summed over the K ranks and scaled by 1/K (sparse ones allgathered).
        Call it after add_gradient_ops, before or after the optimizer. fuse: all dense gradients in one buffer
        (one allreduce per step); default data_parallel.FUSE_DEFAULT (True: measured as fast or faster)."""
        from ..passes.data_parallel import FUSE_DEFAULT, data_parallel
        if not self.gradient_ops_added:
            raise StepnetError(f"model {self.name!r}: data_parallel reduces gradients; call add_gradient_ops first")
        dp = data_parallel(self.init_net.proto(), self.net.proto(), list(self.param_shapes), self.param_to_grad,
                           fuse=FUSE_DEFAULT if fuse is None else fuse)
        self.init_net.replace(dp.init_net)
        self.net.replace(dp.net)
        self.param_to_grad.update(dp.grads)

    # ------------------------------------------------------------------------------------ optimizers
    def _iteration(self) -> BlobRef:
        """optimizer_iteration (int64, +1 before the LR is computed) and its mutex, as build_sgd makes
        them."""
        it = BlobRef("optimizer_iteration")
        if not self.init_net.is_defined(it):
            with self.scope.device_scope(DeviceOption(device_type=0)):
                self.init_net.ConstantFill([], it, shape=[1], value=0, dtype=10)
                self.init_net.CreateMutex([], BlobRef("iteration_mutex"))
                self.net.AtomicIter([BlobRef("iteration_mutex"), it], it)
        return it

    def _unique_name(self, kind: str, k: int, base: str) -> BlobRef:
        """Caffe2's make_unique_blob_name: <Optimizer>_<k>_<base>_cpu, or _gpu<id> under a GPU device
        scope."""
        dev = self.scope.device
        if dev is not None and dev.device_type in GPU_DEVICE_TYPES:
            return BlobRef(f"{kind}_{k}_{base}{dev.node_name}_gpu{dev.device_id}")
        return BlobRef(f"{kind}_{k}_{base}{dev.node_name if dev is not None else ''}_cpu")

    def _lr(self, kind: str, base_lr: float, policy: str, multiplier, **policy_args) -> BlobRef:
        """The LR blob (LearningRate of optimizer_iteration), scaled by the clipping multiplier if any."""
        it = self._iteration()
        k = self._counts.get(kind, 0)
        self._counts[kind] = k + 1
        lr = self.net.LearningRate([it], self._unique_name(kind, k, "lr"), base_lr=float(base_lr),
                                   policy=policy, **policy_args)
        if multiplier is not None:
            copy = self.net.CopyFromCPUInput(multiplier, self._unique_name(kind, k, "lr_multiplier"))
            lr = self.net.Mul([lr, copy], self._unique_name(kind, k, "scaled_lr"), broadcast=1)
        return lr

    def _one(self) -> BlobRef:
        dev = self.scope.device or DeviceOption(device_type=0)
        one = BlobRef(f"ONE_{dev.device_type}_{dev.device_id}{dev.node_name}")
        if not self.init_net.is_defined(one):
            self.init_net.ConstantFill([], one, shape=[1], value=1.0)
        return one

    def _pairs(self, params, what: str) -> list:
        """(param, dense grad) to optimize; every parameter asked for must have a gradient."""
        if not self.gradient_ops_added:
            raise StepnetError(f"{what}: no gradients yet; call add_gradient_ops(loss) before an optimizer")
        wanted = [BlobRef(str(p)) for p in (self.params if params is None else params)]
        unknown = [p for p in wanted if p not in self.param_shapes and p not in self.param_to_grad]
        if unknown:
            raise StepnetError(f"{what}: {', '.join(map(repr, unknown))} is not a parameter of model "
                               f"{self.name!r} (create it with create_param or a layer helper)")
        missing = [p for p in wanted if p not in self.param_to_grad]
        if missing:
            raise StepnetError(f"{what}: parameter {', '.join(map(repr, missing))} has no gradient: no loss "
                               "depends on it; connect it to the loss, create it with trainable=False, or "
                               "pass params=[...] without it")
        pairs = [(p, self.param_to_grad[p]) for p in wanted]
        for p, g in pairs:
            if not isinstance(g, str):
                raise StepnetError(f"{what}: parameter {p!r} has a sparse gradient; the sparse optimizers "
                                   "are not wired into the builder: use ScatterWeightedSum / SparseAdagrad "
                                   "directly")
        return pairs

    def _clip_multiplier(self, pairs, max_norm):
        """Caffe2's _calc_norm_ratio: clip_norm / max(global gradient norm, clip_norm), a CPU scalar."""
        if max_norm is None:
            return None
        if not max_norm > 0:
            raise ArgumentError(f"clip_gradient_norm must be > 0, got {max_norm}")
        with self.name_scope(CLIP_SCOPE):
            sums = []
            for i, (_, g) in enumerate(pairs):
                sq = self.net.SumSqrElements(BlobRef(g), f"grad_{i}_squared_sum")
                sums.append(self.net.EnsureCPUOutput(sq))
            with self.device_scope(DeviceOption(device_type=0)):
                total = self.net.Sum(sums, "grad_squared_full_sum")
                norm = self.net.Pow(total, "global_norm", exponent=0.5)
                clip = self.init_net.ConstantFill([], "clip_norm", shape=[], value=float(max_norm))
                self.net.add_external_inputs(clip)
                biggest = self.net.Max([norm, clip], "max_norm")
                return self.net.Div([clip, biggest], "norm_ratio")

    @staticmethod
    def _check_lr(base_learning_rate: float) -> None:
        if base_learning_rate < 0:
            raise ArgumentError(f"base_learning_rate must be >= 0 (the sign is set by the optimizer), got "
                                f"{base_learning_rate}")

    def sgd(self, base_learning_rate: float, policy: str = "fixed", momentum: float = 0.0,
            nesterov: bool = True, params=None, clip_gradient_norm: float | None = None, **policy_args):
        """build_sgd: WeightedSum with a negative LR, or MomentumSGDUpdate with a positive one.
        clip_gradient_norm is Caffe2's max_gradient_norm: the LR is scaled by clip / max(global gradient
        norm, clip). params: the parameters to update (default: every trainable one)."""
        self._check_lr(base_learning_rate)
        pairs = self._pairs(params, "sgd")
        if base_learning_rate == 0:
            return  # Caffe2 adds no ops for a zero learning rate
        multiplier = self._clip_multiplier(pairs, clip_gradient_norm)
        lr_sign = -1.0 if momentum else 1.0
        lr = self._lr("SgdOptimizer", -(lr_sign * base_learning_rate), policy, multiplier, **policy_args)
        one = self._one()
        for p, g in pairs:
            if momentum:
                m = self.init_net.ConstantFill([p], BlobRef(p + "_momentum"), value=0.0)
                self.net.add_external_inputs(m)
                self.net.MomentumSGDUpdate([g, m, lr, p], [g, m, p], momentum=float(momentum),
                                           nesterov=int(nesterov))
            else:
                self.net.WeightedSum([p, one, g, lr], p)

    def adagrad(self, base_learning_rate: float, epsilon: float = 1e-4, decay: float = 1.0, policy="fixed",
                params=None, clip_gradient_norm: float | None = None, **policy_args):
        """build_adagrad: Adagrad([param, squared_sum, grad, lr]) with lr = -base_learning_rate."""
        self._check_lr(base_learning_rate)
        pairs = self._pairs(params, "adagrad")
        if base_learning_rate == 0:
            return
        multiplier = self._clip_multiplier(pairs, clip_gradient_norm)
        lr = self._lr("AdagradOptimizer", -base_learning_rate, policy, multiplier, **policy_args)
        for p, g in pairs:
            h = self.init_net.ConstantFill([p], BlobRef(p + "_squared_sum"), value=0.0)
            self.net.add_external_inputs(h)
            self.net.Adagrad([p, h, g, lr], [p, h], epsilon=float(epsilon), decay=float(decay))

    def adam(self, base_learning_rate: float, beta1: float = 0.9, beta2: float = 0.999, epsilon: float = 1e-8,
             policy="fixed", params=None, clip_gradient_norm: float | None = None, **policy_args):
        """build_adam: Adam([param, m1, m2, grad, lr, iteration]) with lr = -base_learning_rate."""
        self._check_lr(base_learning_rate)
        pairs = self._pairs(params, "adam")
        if base_learning_rate == 0:
            return
        multiplier = self._clip_multiplier(pairs, clip_gradient_norm)
        lr = self._lr("AdamOptimizer", -base_learning_rate, policy, multiplier, **policy_args)
        it = self._iteration()
        for p, g in pairs:
            m1 = self.init_net.ConstantFill([p], BlobRef(p + "_first_moment"), value=0.0)
            m2 = self.init_net.ConstantFill([p], BlobRef(p + "_second_moment"), value=0.0)
            self.net.add_external_inputs(m1, m2)
            self.net.Adam([p, m1, m2, g, lr, it], [p, m1, m2], beta1=float(beta1), beta2=float(beta2),
                          epsilon=float(epsilon))

    # ------------------------------------------------------------------------------------ plans
    def to_plan(self, iterations: int, report_net: NetBuilder | None = None, report_every: int | None = None,
                name: str | None = None, final_nets=()) -> PlanDef:
        """A PlanDef: run init_net once, then net `iterations` times, report_net after every `report_every`
        iterations (and after the last one), then each of final_nets once (e.g. a test net).

        With a report net the training loop is two nested steps; `stepnet run --iterations N` counts the inner
        one's iterations (plan.training_loops), stopping the last round early and reporting after it. When
        iterations is not a multiple of report_every the remainder is a loop of its own, which --iterations
        sets too; rebuild such a plan to change the length of a run."""
        if iterations < 1:
            raise ArgumentError(f"iterations must be >= 1, got {iterations}")
        plan = PlanDef(name=name or self.name + "_plan")
        nets = [self.init_net, self.net] + ([report_net] if report_net is not None else []) + list(final_nets)
        names = [n.name for n in nets]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise StepnetError(f"to_plan: two nets are named {', '.join(map(repr, dupes))}; give them "
                               "distinct names")
        plan.network.extend(n.proto() for n in nets)
        plan.execution_step.append(ExecutionStep(name="init", network=[self.init_net.name]))
        if report_net is not None:
            every = min(report_every or iterations, iterations)
            rounds, rest = divmod(iterations, every)
            outer = ExecutionStep(name="train", num_iter=rounds)
            outer.substep.append(ExecutionStep(name="train_inner", network=[self.net.name], num_iter=every))
            outer.substep.append(ExecutionStep(name="report", network=[report_net.name]))
            plan.execution_step.append(outer)
            if rest:
                plan.execution_step.append(ExecutionStep(name="train_rest", network=[self.net.name],
                                                         num_iter=rest))
                plan.execution_step.append(ExecutionStep(name="report_last", network=[report_net.name]))
        else:
            plan.execution_step.append(ExecutionStep(name="train", network=[self.net.name],
                                                     num_iter=iterations))
        for k, net in enumerate(final_nets):
            plan.execution_step.append(ExecutionStep(name=f"final_{k}", network=[net.name]))
        return plan
