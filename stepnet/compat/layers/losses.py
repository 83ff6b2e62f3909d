"""Loss layers (excluded from prediction): BatchLRLoss (logistic), BatchMSELoss, BatchSigmoidCrossEntropyLoss,
BatchSoftmaxLoss and MarginRankLoss."""
from __future__ import annotations

import numpy as np

from .. import core, schema
from .layers import ModelLayer
from .tags import Tags


def _subset(input_record, *fields) -> bool:
    return schema.is_schema_subset(schema.Struct(*[(f, schema.Scalar()) for f in fields]), input_record)


def _float_weight(net, input_record):
    """input_record.weight as float32, gradient stopped."""
    weight = input_record.weight()
    if input_record.weight.field_type().base != np.float32:
        weight = net.Cast(weight, weight + "_float32", to=core.DataType.FLOAT)
    return net.StopGradient([weight], [net.NextScopedBlob("weight_stop_gradient")])


class BatchLRLoss(ModelLayer):
    """The mean (or sum) over the batch of the sigmoid cross entropy of logit against label (optionally
    smoothed to [neg_label_target, pos_label_target], weighted by `weight`, fused with the Jensen-Shannon
    divergence of `prediction`)."""

    def __init__(self, model, input_record, name="batch_lr_loss", average_loss=True, jsd_weight=0.0,
                 pos_label_target=1.0, neg_label_target=0.0, homotopy_weighting=False, **kwargs):
        super().__init__(model, name, input_record, **kwargs)
        self.average_loss = average_loss
        assert _subset(input_record, "label", "logit")
        self.jsd_fuse = False
        assert 0 <= jsd_weight <= 1
        if jsd_weight > 0 or homotopy_weighting:
            assert "prediction" in input_record
            self.init_weight(jsd_weight, homotopy_weighting)
            self.jsd_fuse = True
        self.homotopy_weighting = homotopy_weighting
        assert 0 <= pos_label_target <= 1
        assert 0 <= neg_label_target <= 1
        assert pos_label_target >= neg_label_target
        self.pos_label_target = pos_label_target
        self.neg_label_target = neg_label_target
        self.tags.update([Tags.EXCLUDE_FROM_PREDICTION])
        self.output_schema = schema.Scalar(np.float32, self.get_next_blob_reference("output"))

    def init_weight(self, jsd_weight, homotopy_weighting):
        if not homotopy_weighting:
            self.jsd_weight = self.model.add_global_constant(f"{self.name}_jsd_weight", jsd_weight)
            self.xent_weight = self.model.add_global_constant(f"{self.name}_xent_weight", 1. - jsd_weight)
            return

        def param(suffix, shape, init):
            return self.create_param(param_name=f"{self.name}_{suffix}", shape=shape, initializer=init,
                                     optimizer=self.model.NoOptim)
        self.mutex = param("mutex", None, ("CreateMutex", ))
        self.counter = param("counter", [1], ("ConstantFill", {"value": 0, "dtype": core.DataType.INT64}))
        self.xent_weight = param("xent_weight", [1], ("ConstantFill", {"value": 1., "dtype": core.DataType.FLOAT}))
        self.jsd_weight = param("jsd_weight", [1], ("ConstantFill", {"value": 0., "dtype": core.DataType.FLOAT}))

    def update_weight(self, net):
        """xent weight = (1 + 1e-6 t)^-0.1 at iteration t (LearningRate 'inv'); jsd weight = 1 - it."""
        net.AtomicIter([self.mutex, self.counter], [self.counter])
        net.LearningRate([self.counter], [self.xent_weight], base_lr=1.0, policy="inv", gamma=1e-6, power=0.1)
        net.Sub([self.model.global_constants["ONE"], self.xent_weight], [self.jsd_weight])
        return self.xent_weight, self.jsd_weight

    def add_ops(self, net):
        label = net.Cast(self.input_record.label(), net.NextScopedBlob("label_float32"), to=core.DataType.FLOAT)
        label = net.ExpandDims(label, net.NextScopedBlob("expanded_label"), dims=[1])
        if self.pos_label_target != 1.0 or self.neg_label_target != 0.0:
            label = net.StumpFunc(label, net.NextScopedBlob("smoothed_label"), threshold=0.5,
                                  low_value=self.neg_label_target, high_value=self.pos_label_target)
        loss = net.SigmoidCrossEntropyWithLogits([self.input_record.logit(), label],
                                                 net.NextScopedBlob("cross_entropy"))
        if self.jsd_fuse:
            jsd = net.BernoulliJSD([self.input_record.prediction(), label], net.NextScopedBlob("jsd"))
            if self.homotopy_weighting:
                self.update_weight(net)
            loss = net.WeightedSum([loss, self.xent_weight, jsd, self.jsd_weight], net.NextScopedBlob("loss"))
        if "weight" in self.input_record.fields:
            loss = net.Mul([loss, _float_weight(net, self.input_record)],
                           net.NextScopedBlob("weighted_cross_entropy"))
        if self.average_loss:
            net.AveragedLoss(loss, self.output_schema.field_blobs())
        else:
            net.ReduceFrontSum(loss, self.output_schema.field_blobs())


class BatchMSELoss(ModelLayer):
    """The mean over the batch of the squared L2 distance of prediction to label (optionally weighted)."""

    def __init__(self, model, input_record, name="batch_mse_loss", **kwargs):
        super().__init__(model, name, input_record, **kwargs)
        assert _subset(input_record, "label", "prediction")
        self.tags.update([Tags.EXCLUDE_FROM_PREDICTION])
        self.output_schema = schema.Scalar(np.float32, self.get_next_blob_reference("output"))

    def add_ops(self, net):
        prediction = net.Squeeze(self.input_record.prediction(), net.NextScopedBlob("squeezed_prediction"),
                                 dims=[1])
        label = self.input_record.label.field_blobs()
        prediction_type = self.input_record.prediction.field_type()
        if self.input_record.label.field_type().base != prediction_type.base:
            label = net.Cast(label, net.NextScopedBlob("cast_label"),
                             to=schema.data_type_for_dtype(prediction_type))
        label = net.StopGradient(label, net.NextScopedBlob("stopped_label"))
        l2dist = net.SquaredL2Distance([label, prediction], net.NextScopedBlob("l2"))
        if "weight" in self.input_record.fields:
            l2dist = net.Mul([l2dist, _float_weight(net, self.input_record)],
                             net.NextScopedBlob("weighted_l2_distance"))
        net.AveragedLoss(l2dist, self.output_schema.field_blobs())


class BatchSigmoidCrossEntropyLoss(ModelLayer):
    """The mean of the sigmoid cross entropy of prediction (logits) against label, of the same shape."""

    def __init__(self, model, input_record, name="batch_sigmoid_cross_entropy_loss", **kwargs):
        super().__init__(model, name, input_record, **kwargs)
        assert schema.is_schema_subset(schema.Struct(("label", schema.Scalar(np.float32)),
                                                     ("prediction", schema.Scalar(np.float32))), input_record)
        assert input_record.prediction.field_type().shape == input_record.label.field_type().shape, \
            "prediction and label must have the same shape"
        self.tags.update([Tags.EXCLUDE_FROM_PREDICTION])
        self.output_schema = schema.Scalar((np.float32, tuple()), self.get_next_blob_reference("loss"))

    def add_ops(self, net):
        xent = net.SigmoidCrossEntropyWithLogits([self.input_record.prediction(), self.input_record.label()],
                                                 net.NextScopedBlob("sigmoid_cross_entropy"))
        net.AveragedLoss(xent, self.output_schema.field_blobs())


class BatchSoftmaxLoss(ModelLayer):
    """SoftmaxWithLoss of prediction against label (class ids, or probabilities with label_prob; smoothed
    through label_smoothing_matrix K x K when given); outputs softmax and loss."""

    def __init__(self, model, input_record, name="batch_softmax_loss", label_smoothing_matrix=None,
                 label_prob=False, **kwargs):
        super().__init__(model, name, input_record, **kwargs)
        assert _subset(input_record, "label", "prediction")
        self.label_prob = label_prob
        self.label_smoothing_matrix = label_smoothing_matrix
        if self.label_smoothing_matrix is not None:
            self.initialize_label_smoothing_constants()
        self.output_schema = schema.Struct(
            ("softmax", schema.Scalar(input_record.prediction.field_type(), self.get_next_blob_reference("softmax"))),
            ("loss", schema.Scalar(np.float32, self.get_next_blob_reference("loss"))))

    def initialize_label_smoothing_constants(self):
        matrix = np.array(self.label_smoothing_matrix).astype(np.float32)
        assert len(matrix.shape) == 2
        label_dim = matrix.shape[0]
        assert label_dim == matrix.shape[1]
        self.label_smoothing_matrix = self.model.add_global_constant(
            f"{self.name}_label_smoothing_matrix", array=matrix, dtype=np.dtype(np.float32))
        self.label_dim = self.model.add_global_constant(f"{self.name}_label_dim", array=label_dim,
                                                        dtype=np.dtype(np.int64))
        self.label_prob = True      # a smoothed label is a distribution

    def compute_smoothed_label(self, net):
        assert self.label_smoothing_matrix is not None
        label = self.input_record.label()
        if self.input_record.label.field_type().base != np.int64:
            int64_label = net.NextScopedBlob("int64_label")
            net.Cast([label], [int64_label], to=core.DataType.INT64)
        else:
            int64_label = label
        one_hot_label = net.NextScopedBlob("one_hot_label")
        smoothed_label = net.NextScopedBlob("smoothed_label")
        net.OneHot([int64_label, self.label_dim], [one_hot_label])
        net.MatMul([one_hot_label, self.label_smoothing_matrix], smoothed_label)
        return smoothed_label

    def add_ops(self, net):
        label = self.input_record.label.field_blobs()
        if self.label_smoothing_matrix is not None:
            label = [self.compute_smoothed_label(net)]
        elif not self.label_prob and self.input_record.label.field_types()[0].base != np.int32:
            label = [net.Cast(label, net.NextScopedBlob("int32_label"), to=core.DataType.INT32)]
        softmax_input = self.input_record.prediction.field_blobs() + label
        if "weight" in self.input_record:
            weight = self.input_record.weight()
            if self.input_record.weight.field_type().base != np.float32:
                weight = net.Cast(weight, weight + "_float32", to=core.DataType.FLOAT)
            softmax_input += [weight]
        net.SoftmaxWithLoss(softmax_input, self.output_schema.field_blobs(), label_prob=self.label_prob)


class MarginRankLoss(ModelLayer):
    """Hinge loss max(0, margin - (pos - neg)) of each positive score against each of its negatives (a List),
    summed (or averaged)."""

    def __init__(self, model, input_record, name="margin_rank_loss", margin=0.1, average_loss=False, **kwargs):
        super().__init__(model, name, input_record, **kwargs)
        assert margin >= 0, "For hinge loss, margin should be no less than 0"
        self._margin = margin
        self._average_loss = average_loss
        assert schema.is_schema_subset(schema.Struct(("pos_prediction", schema.Scalar()),
                                                     ("neg_prediction", schema.List(np.float32))), input_record)
        self.tags.update([Tags.EXCLUDE_FROM_PREDICTION])
        self.output_schema = schema.Scalar(np.float32, self.get_next_blob_reference("output"))

    def add_ops(self, net):
        neg_score = self.input_record.neg_prediction["values"]()
        pos_score = net.LengthsTile([self.input_record.pos_prediction(),
                                     self.input_record.neg_prediction["lengths"]()],
                                    net.NextScopedBlob("pos_score_repeated"))
        const_1 = net.ConstantFill(neg_score, net.NextScopedBlob("const_1"), value=1, dtype=core.DataType.INT32)
        rank_loss = net.MarginRankingCriterion([pos_score, neg_score, const_1], net.NextScopedBlob("rank_loss"),
                                               margin=self._margin)
        if self._average_loss:
            net.AveragedLoss(rank_loss, self.output_schema.field_blobs())
        else:
            net.ReduceFrontSum(rank_loss, self.output_schema.field_blobs())


class BatchDistillLRLoss(ModelLayer):
    """Distillation: (1 - teacherWeight) * mean xent(logit, label) + teacherWeight * mean xent(logit,
    teacher_label), sigmoid cross entropies."""

    def __init__(self, model, input_record, name="batch_distill_lr_loss", teacherWeight=0.0, **kwargs):  # noqa: N803
        super().__init__(model, name, input_record, **kwargs)
        assert 0 <= teacherWeight <= 1, f"teacherWeight={teacherWeight:0.2f} should be in [0, 1]"
        self._teacherWeight = teacherWeight
        assert _subset(input_record, "teacher_label", "label", "logit")
        self.tags.update([Tags.EXCLUDE_FROM_PREDICTION])
        self.output_schema = schema.Scalar(np.float32, self.get_next_blob_reference("output"))

    def _expanded_float(self, net, field, name):
        blob = self.input_record[field]()
        if self.input_record[field].field_type() != np.float32:
            blob = net.Cast(blob, net.NextScopedBlob("float_" + name), to=core.DataType.FLOAT)
        return net.ExpandDims(blob, net.NextScopedBlob("expanded_" + name), dims=[1])

    def add_ops(self, net):
        label = self._expanded_float(net, "label", "label")
        teacher_label = self._expanded_float(net, "teacher_label", "teacher_label")
        logit = self.input_record.logit()
        true_xent = net.SigmoidCrossEntropyWithLogits([logit, label], net.NextScopedBlob("cross_entropy"))
        teacher_xent = net.SigmoidCrossEntropyWithLogits([logit, teacher_label],
                                                         net.NextScopedBlob("teacher_cross_entropy"))
        scaled_true = net.Scale(true_xent, net.NextScopedBlob("scaled_cross_entropy"),
                                scale=1.0 - self._teacherWeight)
        scaled_teacher = net.Scale(teacher_xent, net.NextScopedBlob("scaled_teacher_cross_entropy"),
                                   scale=float(self._teacherWeight))
        true_loss = net.AveragedLoss(scaled_true, net.NextScopedBlob("true_loss"))
        teacher_loss = net.AveragedLoss(scaled_teacher, net.NextScopedBlob("teacher_loss"))
        net.Add([true_loss, teacher_loss], self.output_schema.field_blobs())
