"""ModelBuilder: an init net and a main net built together, parameters and their gradients, layer helpers
(fc, conv, relu, softmax, ...) that put initializers in the init net, optimizer builders with Caffe2's blob
names and sign conventions (spec §6.3–§6.4), and a runnable PlanDef (`to_plan`)."""
from __future__ import annotations

from .builder import BlobRef, NetBuilder, Scope
from .errors import StepnetError
from .proto import DeviceOption, ExecutionStep, PlanDef

XAVIER = ("XavierFill", {})
ZEROS = ("ConstantFill", {"value": 0.0})
ONES = ("ConstantFill", {"value": 1.0})


class ModelBuilder:
    """`init_net` (run once) and `net` (run every iteration) sharing one name/device scope."""

    def __init__(self, name: str = "model"):
        self.name = name
        self.scope = Scope()
        self.init_net = NetBuilder(name + "_init", self.scope)
        self.net = NetBuilder(name, self.scope)
        self.params: list[str] = []
        self.param_to_grad: dict[str, object] = {}
        self._optimizers = 0

    # ------------------------------------------------------------------------------------ scopes, params
    def name_scope(self, prefix: str):
        return self.scope.name_scope(prefix)

    def device_scope(self, option: DeviceOption | None):
        return self.scope.device_scope(option)

    def create_param(self, name: str, shape, initializer=XAVIER, trainable: bool = True) -> BlobRef:
        """A parameter blob made by a fill op in the init net (name scoped like Caffe2's create_param)."""
        op_type, args = initializer
        blob = self.init_net.add_op(op_type, [], name, shape=[int(d) for d in shape], **args)
        if trainable and blob not in self.params:
            self.params.append(blob)
        self.net.add_external_inputs(blob)
        return blob

    def add_gradient_ops(self, losses) -> dict:
        """The backward pass of the main net; fills param_to_grad."""
        grads = self.net.add_gradient_ops(losses)
        missing = [p for p in self.params if p not in grads]
        for p in self.params:
            if p in grads:
                self.param_to_grad[p] = grads[p]
        self.params_without_grad = missing
        return grads

    # ------------------------------------------------------------------------------------ layers
    def fc(self, blob_in, blob_out, dim_in: int, dim_out: int, weight_init=XAVIER, bias_init=ZEROS, **kwargs):
        out = self.net.scope.scoped(blob_out) if blob_out else self.net.next_name()
        w = self.create_param(f"{out}_w", [dim_out, dim_in], weight_init)
        b = self.create_param(f"{out}_b", [dim_out], bias_init)
        return self.net.FC([blob_in, w, b], BlobRef(out), **kwargs)

    def conv(self, blob_in, blob_out, dim_in: int, dim_out: int, kernel: int, weight_init=XAVIER,
             bias_init=ZEROS, group: int = 1, order: str = "NCHW", **kwargs):
        out = self.net.scope.scoped(blob_out) if blob_out else self.net.next_name()
        shape = ([dim_out, dim_in // group, kernel, kernel] if order == "NCHW"
                 else [dim_out, kernel, kernel, dim_in // group])
        w = self.create_param(f"{out}_w", shape, weight_init)
        b = self.create_param(f"{out}_b", [dim_out], bias_init)
        extra = {"group": group} if group != 1 else {}
        return self.net.Conv([blob_in, w, b], BlobRef(out), kernel=kernel, order=order, **extra, **kwargs)

    def spatial_bn(self, blob_in, blob_out, dim_in: int, epsilon: float = 1e-5, momentum: float = 0.9,
                   is_test: bool = False, order: str = "NCHW"):
        out = BlobRef(self.net.scope.scoped(blob_out))
        scale = self.create_param(f"{out}_s", [dim_in], ONES)
        bias = self.create_param(f"{out}_b", [dim_in], ZEROS)
        mean = self.create_param(f"{out}_rm", [dim_in], ZEROS, trainable=False)
        var = self.create_param(f"{out}_riv", [dim_in], ONES, trainable=False)
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
        out = BlobRef(self.net.scope.scoped(blob_out))
        if is_test:
            return self.net.Dropout(blob_in, [out], ratio=ratio, is_test=1)
        return self.net.Dropout(blob_in, [out, BlobRef(out + "_mask")], ratio=ratio, is_test=0)[0]

    def max_pool(self, blob_in, blob_out=None, **kwargs):
        return self.net.MaxPool(blob_in, blob_out, **kwargs)

    def average_pool(self, blob_in, blob_out=None, **kwargs):
        return self.net.AveragePool(blob_in, blob_out, **kwargs)

    # ------------------------------------------------------------------------------------ optimizers
    def _iteration(self):
        """optimizer_iteration (int64, +1 before the LR is computed) and its mutex, as build_sgd makes them."""
        it = BlobRef("optimizer_iteration")
        if not self.init_net.is_defined(it):
            with self.scope.device_scope(DeviceOption(device_type=0)):
                self.init_net.ConstantFill([], it, shape=[1], value=0, dtype=10)
                self.init_net.CreateMutex([], BlobRef("iteration_mutex"))
            self.net.AtomicIter([BlobRef("iteration_mutex"), it], it)
        return it

    def _lr(self, kind: str, base_lr: float, policy: str, **policy_args):
        it = self._iteration()
        lr = BlobRef(f"{kind}_{self._optimizers}_lr_cpu")
        self._optimizers += 1
        self.net.LearningRate([it], lr, base_lr=float(base_lr), policy=policy, **policy_args)
        return lr

    def _one(self):
        one = BlobRef("ONE_0_0")
        if not self.init_net.is_defined(one):
            self.init_net.ConstantFill([], one, shape=[1], value=1.0)
        return one

    def _dense_params(self):
        if not self.param_to_grad:
            raise StepnetError("no parameter has a gradient: call add_gradient_ops(loss) before an optimizer")
        for p, g in self.param_to_grad.items():
            if not isinstance(g, str):
                raise StepnetError(f"parameter {p!r} has a sparse gradient; the sparse optimizers are not wired "
                                   "into the builder yet: use ScatterWeightedSum / SparseAdagrad ops directly")
            yield p, g

    def sgd(self, base_learning_rate: float, policy: str = "fixed", momentum: float = 0.0, nesterov: bool = True,
            **policy_args):
        """build_sgd: WeightedSum with a negative LR, or MomentumSGDUpdate with a positive one."""
        sign = -1.0 if momentum else 1.0
        lr = self._lr("SgdOptimizer", -sign * base_learning_rate, policy, **policy_args)
        one = None if momentum else self._one()
        for p, g in list(self._dense_params()):
            if momentum:
                m = self.init_net.ConstantFill([p], BlobRef(p + "_momentum"), value=0.0)
                self.net.add_external_inputs(m)
                self.net.MomentumSGDUpdate([g, m, lr, p], [g, m, p], momentum=float(momentum),
                                           nesterov=int(nesterov))
            else:
                self.net.WeightedSum([p, one, g, lr], p)

    def adagrad(self, base_learning_rate: float, epsilon: float = 1e-4, decay: float = 1.0, policy="fixed",
                **policy_args):
        lr = self._lr("AdagradOptimizer", -base_learning_rate, policy, **policy_args)
        for p, g in list(self._dense_params()):
            h = self.init_net.ConstantFill([p], BlobRef(p + "_squared_sum"), value=0.0)
            self.net.add_external_inputs(h)
            self.net.Adagrad([p, h, g, lr], [p, h], epsilon=float(epsilon), decay=float(decay))

    def adam(self, base_learning_rate: float, beta1: float = 0.9, beta2: float = 0.999, epsilon: float = 1e-8,
             policy="fixed", **policy_args):
        lr = self._lr("AdamOptimizer", -base_learning_rate, policy, **policy_args)
        it = self._iteration()
        for p, g in list(self._dense_params()):
            m1 = self.init_net.ConstantFill([p], BlobRef(p + "_first_moment"), value=0.0)
            m2 = self.init_net.ConstantFill([p], BlobRef(p + "_second_moment"), value=0.0)
            self.net.add_external_inputs(m1, m2)
            self.net.Adam([p, m1, m2, g, lr, it], [p, m1, m2], beta1=float(beta1), beta2=float(beta2),
                          epsilon=float(epsilon))

    # ------------------------------------------------------------------------------------ plans
    def to_plan(self, iterations: int, report_net: NetBuilder | None = None, report_every: int | None = None,
                name: str | None = None) -> PlanDef:
        """A PlanDef: run init_net once, then net `iterations` times (report_net every `report_every`)."""
        plan = PlanDef(name=name or self.name + "_plan")
        nets = [self.init_net, self.net] + ([report_net] if report_net is not None else [])
        plan.network.extend(n.proto() for n in nets)
        plan.execution_step.append(ExecutionStep(name="init", network=[self.init_net.name]))
        if report_net is not None and report_every:
            outer = ExecutionStep(name="train", num_iter=max(1, iterations // report_every))
            outer.substep.append(ExecutionStep(name="train_inner", network=[self.net.name], num_iter=report_every))
            outer.substep.append(ExecutionStep(name="report", network=[report_net.name]))
            plan.execution_step.append(outer)
        else:
            plan.execution_step.append(ExecutionStep(name="train", network=[self.net.name], num_iter=iterations))
        return plan
