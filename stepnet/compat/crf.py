"""Caffe2's crf module: CRFWithLoss, a linear-chain CRF's negative log-likelihood built from ordinary ops.

The tags are padded with two more, begin (num_classes) and end (num_classes + 1): the predictions (T x
num_classes scores of a sequence) get two low-scoring columns and a begin row and an end row, the labels the
begin and end tags, and the transitions matrix is (num_classes + 2) square. The loss is
logsumexp over all paths of their scores minus the score of the labelled path, a path's score being the sum of
its unary scores (predictions) and of its transitions. The sum over all paths is a RecurrentNetwork over the
padded rows (the forward algorithm: state_t[j] = logsumexp_i(state_{t-1}[i] + x_t[j] + transitions[i, j])).
As in Caffe2 only one sequence (batch size 1) is supported."""
from __future__ import annotations

import numpy as np

from . import brew, core, model_helper, recurrent

LOW_SCORE = -1000.0   # the score of an impossible tag (the begin/end tags inside the sequence, and so on)


class CRFWithLoss:
    """A CRF over num_classes tags; transitions_blob: a (num_classes + 2) square blob, else one is made (uniform in
    [-1, 1]) in the param init net. The transitions are added to model.params."""

    def __init__(self, model, num_classes, transitions_blob=None):
        self.model, self.num_classes = model, num_classes
        self.num_classes_padded = num_classes + 2
        if not transitions_blob:
            transitions_blob = model.param_init_net.UniformFill(
                [], [core.ScopedBlobReference("crf_transitions")],
                shape=[self.num_classes_padded, self.num_classes_padded], min=-1.0, max=1.0)
        self.transitions = transitions_blob
        model.params.append(self.transitions)

    # ------------------------------------------------------------------------------------------ the loss
    def crf_loss(self, predictions, labels, seq_lengths=None):
        """The loss blob (a scalar) for predictions (T x num_classes) and labels (T ints)."""
        net = self.model.net
        # the transitions are read at one moment (a parallel update may change the parameter meanwhile)
        transitions = net.Copy(self.transitions, core.ScopedBlobReference("transitions_snapshot"))
        path_unary = self._gather_entries_sum(predictions, labels, self.num_classes)
        predictions = self._pad_predictions(predictions)
        labels = self._pad_labels(labels)
        path_binary = self._path_binary_scores(labels, transitions, seq_lengths)
        path_total = net.Add([path_binary, path_unary], core.ScopedBlobReference("path_total"))
        zero_index = self.model.param_init_net.ConstantFill([], shape=[1], value=0)
        initial_state = net.Gather([predictions, zero_index], core.ScopedBlobReference("rnn_initial"),
                                   dense_gradient=True)
        rows = net.RemovePadding([predictions], padding_width=1, end_padding_width=0)
        rows = net.ExpandDims([rows], core.ScopedBlobReference("rnn_input_data"), dims=[1])
        transitions_copy = net.Copy(transitions, core.ScopedBlobReference("transitions_copy"))
        all_paths = self._crf_forward(rows, initial_state, transitions_copy)
        return net.Sub([all_paths, path_total], core.ScopedBlobReference("crf_loss"))

    def _pad_predictions(self, predictions):
        """predictions with two LOW_SCORE columns (begin, end), then a begin row on top and an end row below."""
        net, init = self.model.net, self.model.param_init_net
        n = self.num_classes
        begin = np.array([[LOW_SCORE] * n + [0, LOW_SCORE]], np.float32)
        end = np.array([[LOW_SCORE] * n + [LOW_SCORE, 0]], np.float32)
        begin = init.GivenTensorFill([], "b_scores", shape=[1, self.num_classes_padded], values=begin)
        end = init.GivenTensorFill([], "e_scores", shape=[1, self.num_classes_padded], values=end)
        zero_index = net.ConstantFill([], shape=[1], value=0)
        length = net.Cast(net.Gather([net.Shape([predictions]), zero_index]), to="int32")
        column = net.ExpandDims(net.ConstantFill([net.LengthsRangeFill(length)], value=LOW_SCORE), dims=[1])
        widened, _ = net.Concat([predictions, column, column], outputs=2, axis=1)
        padded, _ = net.Concat([begin, widened, end], outputs=2, axis=0)
        return padded

    def _pad_labels(self, labels):
        init = self.model.param_init_net
        begin = init.ConstantFill([], shape=[1], value=self.num_classes)
        end = init.ConstantFill([], shape=[1], value=self.num_classes + 1)
        labels = self.model.net.Cast([labels], to="int64")
        padded, _ = self.model.net.Concat([begin, labels, end], axis=0, outputs=2)
        return padded

    def _path_binary_scores(self, labels, transitions, seq_lengths=None):
        """The sum of transitions[label_t, label_t+1] over the padded labels (a gather from the flat matrix)."""
        net = self.model.net
        to_ids = net.RemovePadding([labels], padding_width=1, end_padding_width=0)    # (Caffe2 also asks for the
        from_ids = net.RemovePadding([labels], padding_width=0, end_padding_width=1)  # lengths, never read)
        width = net.ConstantFill([from_ids], value=self.num_classes_padded)
        flat_ids = net.Add([net.Mul([from_ids, width]), to_ids])
        entries = net.Gather([net.FlattenToVec([transitions]), flat_ids], dense_gradient=True)
        return self.model.ReduceFrontSum(entries)

    def _gather_entries_sum(self, in_data, indices, index_size):
        """sum_t in_data[t, indices[t]] (a one-hot dot product)."""
        net = self.model.net
        indices = net.Cast([indices], to="int64")
        size = self.model.param_init_net.ConstantFill([], shape=[1], value=index_size)
        one_hot = net.OneHot([indices, size])
        scores = net.DotProduct([net.FlattenToVec(one_hot), net.FlattenToVec(in_data)])
        return net.ReduceFrontSum([scores])

    def _crf_forward(self, input_blob, initial_state, transitions_copy, seq_lengths=None):
        """logsumexp of the last forward state: the log of the summed exp-scores of all paths."""
        net = self.model.net
        last = self.build_crf_net(input_blob, initial_state, transitions_copy)
        last, _ = net.Reshape([last], outputs=2, shape=(self.num_classes_padded,))
        zero_segment_id = self.model.param_init_net.ConstantFill(
            [], value=0, shape=[self.num_classes_padded], dtype=core.DataType.INT32)
        total = net.SortedSegmentRangeLogSumExp([last, zero_segment_id])
        total, _ = net.Reshape(total, outputs=2, shape=())
        return total

    def build_crf_net(self, input_blob, initial_state, transitions):
        """Add the forward algorithm's RecurrentNetwork (scope crf_net) over input_blob (T x 1 x D); returns its
        last state (1 x 1 x D)."""
        scope = "crf_net"
        d = self.num_classes_padded

        def s(name):
            return f"{scope}/{name}"

        step = model_helper.ModelHelper(name="crf_step", param_model=self.model)
        input_t, cell_t_prev, _ = step.net.AddExternalInputs(
            core.ScopedBlobReference("input_t"), core.ScopedBlobReference("cell_t_prev"), transitions)
        zero_segment_id = step.param_init_net.ConstantFill(
            [], [s("zero_segment_id")], value=0, shape=[d], dtype=core.DataType.INT32)
        step.param_init_net.AddExternalOutput(zero_segment_id)
        # scores[i, j] = prev[i] + x_t[j] + transitions[i, j], then logsumexp over i for each j
        prev_t = brew.transpose(step, cell_t_prev, [s("prev_transpose")], axes=(0, 2, 1))
        prev_tiled = step.net.Tile(prev_t, [s("prev_tiled")], tiles=d, axis=2)
        input_tiled = step.net.Tile(input_t, [s("input_t_tiled")], tiles=d, axis=1)
        with_prev = step.net.Add([prev_tiled, input_tiled], [s("input_with_prev")])
        with_transitions = step.net.Add([with_prev, transitions], [s("prev_with_transitions")], broadcast=1)
        square, _ = step.net.Reshape(with_transitions, [s("all_with_transitions_reshaped"),
                                                        s("all_with_transitions_orig")], shape=(d, d))
        summed = step.net.SortedSegmentRangeLogSumExp([square, zero_segment_id], [s("cell_t_flat")])
        # the state's shape (1 x 1 x D; Caffe2 writes the 1 x D sum into it and lets its gradient follow sizes)
        cell_t, _ = step.net.Reshape(summed, [s("cell_t"), s("cell_t_flat_shape")], shape=(1, 1, d))
        step.net.AddExternalOutputs(cell_t)
        _, out_last = recurrent.recurrent_net(
            net=self.model.net, cell_net=step.net, inputs=[(input_t, input_blob)],
            initial_cell_inputs=[(cell_t_prev, initial_state)], links={cell_t_prev: cell_t}, scope=scope,
            outputs_with_grads=(1,))
        return out_last

    # ------------------------------------------------------------------------------------------ decoding
    def update_predictions(self, classes):
        """A Python op: the predictions changed so that each step's highest score is the Viterbi path's tag
        (its score swapped with the previous best's)."""

        def viterbi_swap(inputs, outputs):
            scores = np.array(inputs[0].data)
            transitions = inputs[1].data
            trellis = np.zeros(scores.shape)
            back = np.zeros(scores.shape, dtype=np.int32)
            trellis[0] = scores[0]
            for t in range(1, scores.shape[0]):
                candidates = trellis[t - 1][:, None] + transitions
                trellis[t] = scores[t] + candidates.max(axis=0)
                back[t] = candidates.argmax(axis=0)
            path = [int(np.argmax(trellis[-1]))]
            for pointers in back[:0:-1]:
                path.append(int(pointers[path[-1]]))
            path.reverse()
            for row, tag in zip(scores, path):
                best = int(np.argmax(row))
                row[tag], row[best] = row[best], row[tag]
            result = scores[1:-1, :-2]
            outputs[0].reshape(result.shape)
            outputs[0].data[...] = result

        padded = self._pad_predictions(classes)
        return self.model.net.Python(viterbi_swap)([padded, self.transitions],
                                                   core.ScopedBlobReference("post_crf_classes"))
