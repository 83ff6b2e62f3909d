"""Caffe2's tt_core: the cores of a tensor-train (TT) layer, the weights Caffe2's TT operator reads.

A TT layer stands for an FC layer whose weight matrix, of prod(inp_sizes) x prod(out_sizes), is written as d
cores (Oseledets, 2011; Novikov et al., 2015): core i is a tensor of tt_ranks[i] x inp_sizes[i] x out_sizes[i] x
tt_ranks[i + 1], with tt_ranks[0] = tt_ranks[d] = 1. The TT operator takes all cores flattened and concatenated
into one float32 vector. init_tt_cores makes random ones for training from scratch; matrix_to_tt decomposes a
trained FC weight (by successive truncated SVDs, tt_svd).
"""
from __future__ import annotations

import numpy as np


def _check_sizes(inp_sizes, out_sizes, tt_ranks) -> None:
    if len(inp_sizes) != len(out_sizes):
        raise ValueError(f"The number of input dimensions ({len(inp_sizes)}) must be equal to the number of output "
                         f"dimensions ({len(out_sizes)}).")
    if len(tt_ranks) != len(inp_sizes) + 1:
        raise ValueError(f"The number of tt-ranks ({len(tt_ranks)}) must be one more than the number of input and "
                         f"output dims ({len(out_sizes)}).")


def init_tt_cores(inp_sizes, out_sizes, tt_ranks, seed: int = 1234) -> np.ndarray:
    """Random TT cores, orthogonalized left to right, as one float32 vector (numpy's global generator is seeded
    with `seed`, as Caffe2 does). Each core is drawn from N(0, 1), multiplied on the left by the R factor of the
    previous core's QR decomposition, and, except the last, replaced by its own Q factor (as a
    (r_i n_i m_i) x r_{i+1} matrix); the whole is scaled by 0.1 / (prod(inp_sizes) prod(tt_ranks)) ** (1 / d)."""
    np.random.seed(seed)
    _check_sizes(inp_sizes, out_sizes, tt_ranks)
    inp, out, ranks = np.array(inp_sizes), np.array(out_sizes), np.array(tt_ranks)
    d = inp.shape[0]
    cores = np.zeros(np.sum(inp * out * ranks[1:] * ranks[:-1]))
    left = 1   # the R factor carried to the next core (none before the first)
    at = 0
    for i in range(d):
        rows, cols = ranks[i], inp[i] * out[i] * ranks[i + 1]
        core = np.dot(left, np.random.normal(0, 1, size=(rows, cols)))
        core = core.reshape(ranks[i] * inp[i] * out[i], ranks[i + 1])
        if i < d - 1:
            core, left = np.linalg.qr(core)
        cores[at:at + core.size] = core.ravel()
        at += core.size
    scale = (np.prod(inp) * np.prod(ranks)) ** (1.0 / d)
    return cores.astype(np.float32) * np.float32(0.1 / scale)   # in float32, as Caffe2's numpy computed it


def matrix_to_tt(W, inp_sizes, out_sizes, tt_ranks) -> np.ndarray:
    """The TT cores of an FC weight W (prod(inp_sizes) x prod(out_sizes), used as X W^T by the layer), as one
    float32 vector in the order and layout the TT operator reads (each core n_i x r_{i+1} x r_i x m_i, the last
    core first)."""
    _check_sizes(inp_sizes, out_sizes, tt_ranks)
    W = np.asarray(W)
    if W.ndim != 2 or W.shape[0] != np.prod(inp_sizes):
        raise ValueError(f"The product of the input sizes ({np.prod(inp_sizes)}) must be equal to first dimension "
                         f"of W ({W.shape[0] if W.ndim else W.shape}).")
    if W.shape[1] != np.prod(out_sizes):
        raise ValueError(f"The product of the output sizes ({np.prod(out_sizes)}) must be equal to second "
                         f"dimension of W ({W.shape[1]}).")
    inp, out, ranks = np.array(inp_sizes), np.array(out_sizes), np.array(tt_ranks)
    d = inp.size
    # W^T as a tensor of (i_1..i_d, o_1..o_d), its axes interleaved (i_1, o_1, i_2, o_2, ...) and each pair merged
    tensor = W.transpose().copy().reshape(np.concatenate((inp, out)))
    interleaved = [axis for k in range(d) for axis in (k, d + k)]
    tensor = np.transpose(tensor, axes=interleaved).reshape(inp * out)
    cores = tt_svd(tensor, inp * out, ranks)
    result = np.zeros(cores.shape, dtype=np.float32)
    at = 0
    for i in range(d):
        shape = (ranks[i], inp[i], out[i], ranks[i + 1])
        size = int(np.prod(shape))
        core = cores[at:at + size].reshape(shape).transpose((1, 3, 0, 2))
        end = result.shape[0] - at
        result[end - size:end] = core.ravel()
        at += size
    return result


def tt_svd(W, sizes, tt_ranks) -> np.ndarray:
    """The TT decomposition of a d-way tensor W of `sizes` with `tt_ranks` (float32, cores concatenated): for
    each mode but the last, the reshaped remainder's truncated SVD keeps the first r_{k+1} left singular vectors
    as core k and carries diag(S) V on."""
    sizes, tt_ranks = np.asarray(sizes), np.asarray(tt_ranks)
    if len(tt_ranks) != len(sizes) + 1:
        raise ValueError(f"tt_ranks has {len(tt_ranks)} entries for {len(sizes)} sizes; it needs one more")
    rest = np.array(W, copy=True)
    d = sizes.size
    cores = np.zeros(np.sum(tt_ranks[:-1] * sizes * tt_ranks[1:]), dtype="float32")
    at = 0
    for k in range(d - 1):
        rank = tt_ranks[k + 1]
        rest = np.reshape(rest, [tt_ranks[k] * sizes[k], -1])
        U, S, V = np.linalg.svd(rest, full_matrices=False)
        U, S, V = U[:, :rank], S[:rank], V[:rank, :]
        size = tt_ranks[k] * sizes[k] * rank
        cores[at:at + size] = U.ravel()
        at += size
        rest = np.dot(np.diag(S), V)
    size = tt_ranks[d - 1] * sizes[d - 1] * tt_ranks[d]
    cores[at:at + size] = rest.ravel()
    return cores


def fc_net_to_tt_net(net):
    """Caffe2 declares this (a whole net's FC layers as TT layers) but never implemented it."""
    raise NotImplementedError("fc_net_to_tt_net: Caffe2 never implemented it; convert each FC weight with "
                              "matrix_to_tt and use a TT operator in its place")
