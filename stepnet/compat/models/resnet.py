"""caffe2.python.models.resnet: ResNets built with brew (He et al. 2015, "Deep Residual Learning for Image
Recognition"). The blob names are Caffe2's (comp_<block>_conv_<k>, comp_<block>_spatbn_<k>, comp_<block>_sum_<k>,
shortcut_projection_<block>[_spatbn], conv1, pool1, final_avg, last_out_L<labels>), so saved Caffe2 models load."""
from __future__ import annotations

from .. import brew

MSRA = ("MSRAFill", {})


class ResNetBuilder:
    """Adds residual blocks to a model, one after another, from prev_blob on; comp_count numbers the blocks and
    comp_idx the layers within one."""

    def __init__(self, model, prev_blob, no_bias, is_test, spatial_bn_mom=0.9):
        self.model, self.prev_blob, self.is_test = model, prev_blob, is_test
        self.comp_count = self.comp_idx = 0
        self.spatial_bn_mom = spatial_bn_mom
        self.no_bias = 1 if no_bias else 0

    def add_conv(self, in_filters, out_filters, kernel, stride=1, pad=0):
        self.comp_idx += 1
        name = f"comp_{self.comp_count}_conv_{self.comp_idx}"
        self.prev_blob = brew.conv(self.model, self.prev_blob, name, in_filters, out_filters, weight_init=MSRA,
                                   kernel=kernel, stride=stride, pad=pad, no_bias=self.no_bias)
        return self.prev_blob

    def add_relu(self):
        self.prev_blob = brew.relu(self.model, self.prev_blob, self.prev_blob)    # in place
        return self.prev_blob

    def add_spatial_bn(self, num_filters):
        name = f"comp_{self.comp_count}_spatbn_{self.comp_idx}"
        self.prev_blob = brew.spatial_bn(self.model, self.prev_blob, name, num_filters, epsilon=1e-3,
                                         momentum=self.spatial_bn_mom, is_test=self.is_test)
        return self.prev_blob

    def _projection(self, blob, in_filters, out_filters, down_sampling, spatial_batch_norm, momentum):
        """The shortcut's 1×1 convolution (and batch norm) where the block changes the number of maps."""
        blob = brew.conv(self.model, blob, f"shortcut_projection_{self.comp_count}", in_filters, out_filters,
                         weight_init=MSRA, kernel=1, stride=2 if down_sampling else 1, no_bias=self.no_bias)
        if spatial_batch_norm:
            bn = {"epsilon": 1e-3, **({} if momentum is None else {"momentum": momentum}), "is_test": self.is_test}
            blob = brew.spatial_bn(self.model, blob, f"shortcut_projection_{self.comp_count}_spatbn", out_filters,
                                   **bn)    # (Caffe2's argument order)
        return blob

    def _finish(self, shortcut, last):
        self.prev_blob = brew.sum(self.model, [shortcut, last], f"comp_{self.comp_count}_sum_{self.comp_idx}")
        self.comp_idx += 1
        self.add_relu()
        self.comp_count += 1

    def add_bottleneck(self, input_filters, base_filters, output_filters, down_sampling=False,
                       spatial_batch_norm=True):
        """1×1 (base), 3×3 (base, stride 2 when down_sampling), 1×1 (output), each with batch norm, plus the input
        (projected when output_filters > input_filters), then ReLU (Figure 3, right)."""
        self.comp_idx = 0
        shortcut = self.prev_blob
        for k_in, k_out, kernel, stride, pad in ((input_filters, base_filters, 1, 1, 0),
                                                 (base_filters, base_filters, 3, 2 if down_sampling else 1, 1)):
            self.add_conv(k_in, k_out, kernel=kernel, stride=stride, pad=pad)
            if spatial_batch_norm:
                self.add_spatial_bn(k_out)
            self.add_relu()
        last = self.add_conv(base_filters, output_filters, kernel=1)
        if spatial_batch_norm:
            last = self.add_spatial_bn(output_filters)
        if output_filters > input_filters:
            shortcut = self._projection(shortcut, input_filters, output_filters, down_sampling, spatial_batch_norm,
                                        self.spatial_bn_mom)
        self._finish(shortcut, last)

    def add_simple_block(self, input_filters, num_filters, down_sampling=False, spatial_batch_norm=True):
        """Two 3×3 convolutions with batch norm, plus the input (projected when the number of maps changes)."""
        self.comp_idx = 0
        shortcut = self.prev_blob
        self.add_conv(input_filters, num_filters, kernel=3, stride=2 if down_sampling else 1, pad=1)
        if spatial_batch_norm:
            self.add_spatial_bn(num_filters)
        self.add_relu()
        last = self.add_conv(num_filters, num_filters, kernel=3, pad=1)
        if spatial_batch_norm:
            last = self.add_spatial_bn(num_filters)
        if num_filters != input_filters:
            shortcut = self._projection(shortcut, input_filters, num_filters, down_sampling, spatial_batch_norm, None)
        self._finish(shortcut, last)


def create_resnet50(model, data, num_input_channels, num_labels, label=None, is_test=False, no_loss=False,
                    no_bias=0, conv1_kernel=7, conv1_stride=2, final_avg_kernel=7):
    """ResNet-50: conv1 (7×7/2, 64) + batch norm + ReLU + 3×3/2 max pool, 3+4+6+3 bottleneck blocks, global
    average pool, FC to num_labels. Returns the FC output (no_loss), (softmax, loss) with a label, else softmax."""
    brew.conv(model, data, "conv1", num_input_channels, 64, weight_init=MSRA, kernel=conv1_kernel,
              stride=conv1_stride, pad=3, no_bias=no_bias)
    brew.spatial_bn(model, "conv1", "conv1_spatbn_relu", 64, epsilon=1e-3, momentum=0.1, is_test=is_test)
    brew.relu(model, "conv1_spatbn_relu", "conv1_spatbn_relu")
    brew.max_pool(model, "conv1_spatbn_relu", "pool1", kernel=3, stride=2)
    builder = ResNetBuilder(model, "pool1", no_bias=no_bias, is_test=is_test, spatial_bn_mom=0.1)
    filters_in = 64
    for base, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):    # conv2_x .. conv5_x (Table 1)
        for k in range(blocks):
            builder.add_bottleneck(filters_in, base, 4 * base, down_sampling=(k == 0 and base > 64))
            filters_in = 4 * base
    final_avg = brew.average_pool(model, builder.prev_blob, "final_avg", kernel=final_avg_kernel, stride=1,
                                  global_pooling=True)
    last_out = brew.fc(model, final_avg, f"last_out_L{num_labels}", 2048, num_labels)
    if no_loss:
        return last_out
    if label is not None:
        softmax, loss = model.SoftmaxWithLoss([last_out, label], ["softmax", "loss"])
        return softmax, loss
    return brew.softmax(model, last_out, "softmax")


def create_resnet_32x32(model, data, num_input_channels, num_groups, num_labels, is_test=False):
    """The CIFAR ResNet of section 4.2 (6n+2 layers, n = num_groups): 3×3 conv (16), then 2n simple blocks of
    16, 32 and 64 maps (the first of the last two groups halving the size), 8×8 average pool, FC, softmax."""
    brew.conv(model, data, "conv1", num_input_channels, 16, kernel=3, stride=1)
    brew.spatial_bn(model, "conv1", "conv1_spatbn", 16, epsilon=1e-3, is_test=is_test)
    brew.relu(model, "conv1_spatbn", "relu1")
    builder = ResNetBuilder(model, "relu1", no_bias=0, is_test=is_test)
    prev = 16
    for group, filters in enumerate((16, 32, 64)):
        for block in range(2 * num_groups):
            builder.add_simple_block(prev if block == 0 else filters, filters,
                                     down_sampling=block == 0 and group > 0)
        prev = filters
    brew.average_pool(model, builder.prev_blob, "final_avg", kernel=8, stride=1)
    brew.fc(model, "final_avg", "last_out", 64, num_labels)
    return brew.softmax(model, "last_out", "softmax")
