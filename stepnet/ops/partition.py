"""Sharding by key: Partition, LengthsPartition and their inverse GatherByKey (partition_ops.h), and KeySplit
(key_split_ops.h), with Caffe2's semantics.

A key's shard is key mod P, non-negative for negative keys too (Python's %); with pack_first_input=1 the keys
themselves are written as floor(key / P). Partition and LengthsPartition write P groups of outputs, one per
shard, each with one output per input (input i of shard j is output j * inputs + i); a shard keeps its rows in
their order. The ops have no gradient (NO_GRADIENT, as Caffe2 declares for Partition and LengthsPartition;
GatherByKey and KeySplit have none registered).
"""
from __future__ import annotations

import numpy as np

from ..core.errors import ArgumentError, DTypeError, ShapeError
from .base import host_ints, known_ints, on_device, out_spec, value_dependent
from .index import NOT_IN_PLACE, check_vector, read_lengths, require_int
from .registry import NO_GRADIENT, REQUIRED, Arg, op


def shards_of(keys, parts: int) -> np.ndarray:
    """Each key's shard, key mod parts in [0, parts)."""
    return np.mod(np.asarray(keys, dtype=np.int64), parts)


def _parts(op_type: str, n_in: int, n_out: int) -> int:
    if n_out % n_in:
        raise ArgumentError(f"{op_type}: {n_out} outputs for {n_in} inputs; the outputs must be a multiple of the "
                            "inputs (one group of outputs per partition)")
    return n_out // n_in


def _partition_checks(op_type: str, inputs, main_at: int, n_out: int):
    """The checks Partition and LengthsPartition share; the number of partitions."""
    parts = _parts(op_type, len(inputs), n_out)
    main = inputs[main_at]
    require_int(main, f"{op_type}: input {main_at} (the keys)")
    for i, x in enumerate(inputs[main_at + 1:], main_at + 1):
        if tuple(x.shape[:len(main.shape)]) != tuple(main.shape):
            raise ShapeError(f"{op_type}: input {i} {tuple(x.shape)} must start with the keys' shape "
                             f"{tuple(main.shape)}")
    return parts


def _partition(xp, inputs, main_at: int, parts: int, pack: bool):
    """The partitioned inputs' outputs (None in the slots of inputs before main_at)."""
    main = inputs[main_at]
    keys = np.asarray(host_ints(main, "keys"), dtype=np.int64)
    shard = shards_of(keys, parts)
    outs = [None] * (parts * len(inputs))
    for j in range(parts):
        rows = on_device(xp, np.flatnonzero(shard == j), np.int64)
        for i, x in enumerate(inputs[main_at:], main_at):
            if i == main_at:
                picked = keys[shard == j]
                value = on_device(xp, picked // parts if pack else picked, main.dtype)
            else:
                flat = xp.reshape(x, (keys.size, *x.shape[len(main.shape):]))
                value = xp.take(flat, rows, axis=0)
            outs[j * len(inputs) + i] = value
    return outs


def _partition_shape(specs, *, pack_first_input):
    """The inputs' checks; the outputs stay unknown (shape functions are not told the number of outputs, which
    gives the number of partitions)."""
    _partition_checks("Partition", specs, 0, len(specs))
    return []


@op("Partition", inputs=(1, None), outputs=(1, None), inplace=NOT_IN_PLACE, args={"pack_first_input": 0},
    context="structure", shape=_partition_shape, gradient=NO_GRADIENT)
def partition(ctx, xp, *inputs, pack_first_input):
    """KEYS (int, any shape), (more inputs whose shapes start with KEYS') -> for each of the outputs / inputs
    partitions j: the (flattened) keys with key mod P = j, then the matching rows of every other input."""
    parts = _partition_checks("Partition", inputs, 0, len(ctx.outputs))
    return tuple(_partition(xp, inputs, 0, parts, bool(pack_first_input)))


def _lengths_partition_checks(inputs, n_out, read):
    if len(inputs) < 2:
        raise ArgumentError("LengthsPartition needs LENGTHS and the keys (at least 2 inputs)")
    parts = _partition_checks("LengthsPartition", inputs, 1, n_out)
    lengths, keys = inputs[:2]
    lens = read_lengths(lengths, "LENGTHS", read)
    check_vector(keys, "keys (input 1)")
    if lens is not None and sum(lens) != keys.shape[0]:
        raise ShapeError(f"LengthsPartition: LENGTHS sum to {sum(lens)} but there are {keys.shape[0]} keys; they "
                         "must be equal")
    return parts, lens


def _lengths_partition_shape(specs, *, pack_first_input):
    """The inputs' checks; the outputs stay unknown (as for Partition)."""
    _lengths_partition_checks(specs, len(specs), known_ints)
    return []


@op("LengthsPartition", inputs=(2, None), outputs=(1, None), inplace=NOT_IN_PLACE, args={"pack_first_input": 0},
    context="structure", shape=_lengths_partition_shape, gradient=NO_GRADIENT)
def lengths_partition(ctx, xp, *inputs, pack_first_input):
    """LENGTHS, KEYS (a vector in runs of LENGTHS[i]), (more inputs) -> for each partition j: int32 the number of
    keys of each run in it, then the keys and rows as Partition gives them."""
    parts, lens = _lengths_partition_checks(inputs, len(ctx.outputs), host_ints)
    outs = _partition(xp, inputs, 1, parts, bool(pack_first_input))
    shard = shards_of(host_ints(inputs[1], "keys"), parts)
    run = np.repeat(np.arange(len(lens)), lens)
    for j in range(parts):
        outs[j * len(inputs)] = on_device(xp, np.bincount(run[shard == j], minlength=len(lens)), np.int32)
    return tuple(outs)


# --------------------------------------------------------------------------------------------- GatherByKey
def _by_key_checks(keys, shards, read):
    require_int(keys, "GatherByKey: keys")
    check_vector(keys, "keys")
    first = shards[0]
    for i, x in enumerate(shards, 1):
        if len(x.shape) < 1:
            raise ShapeError(f"GatherByKey: input {i} must be at least 1-D, got a 0-D tensor")
        if x.dtype is not None and first.dtype is not None and x.dtype != first.dtype:
            raise DTypeError(f"GatherByKey: input {i} has dtype {x.dtype} but input 1 has {first.dtype}")
        if tuple(x.shape[1:]) != tuple(first.shape[1:]):
            raise ShapeError(f"GatherByKey: input {i} {tuple(x.shape)} and input 1 {tuple(first.shape)} must agree "
                             "after the first dimension")
    rows = sum(x.shape[0] for x in shards)
    if rows != keys.shape[0]:
        raise ShapeError(f"GatherByKey: the shards have {rows} rows in all but there are {keys.shape[0]} keys")
    values = read(keys, "keys")
    if values is not None:
        counts = np.bincount(shards_of(values, len(shards)), minlength=len(shards))
        for i, (x, n) in enumerate(zip(shards, counts.tolist()), 1):
            if x.shape[0] != n:
                raise ShapeError(f"GatherByKey: input {i} has {x.shape[0]} rows but {n} keys fall in its shard "
                                 f"(key mod {len(shards)} = {i - 1})")
    return values


@op("GatherByKey", inputs=(2, None), outputs=1, inplace=NOT_IN_PLACE,
    shape=lambda s: (_by_key_checks(s[0], s[1:], known_ints),
                     [out_spec((s[0].shape[0], *s[1].shape[1:]), s[1].dtype)])[1])
def gather_by_key(xp, keys, *shards):
    """KEYS (the vector Partition split), SHARD_0 .. SHARD_P-1 -> the rows put back in the keys' order: row i is
    the next row of shard KEYS[i] mod P (Partition's inverse)."""
    values = _by_key_checks(keys, shards, host_ints)
    shard = shards_of(values, len(shards))
    out = xp.zeros((keys.shape[0], *shards[0].shape[1:]), dtype=shards[0].dtype)
    for j, x in enumerate(shards):
        out[on_device(xp, np.flatnonzero(shard == j), np.int64)] = x
    return out


# --------------------------------------------------------------------------------------------- KeySplit
def _key_split_checks(keys, limit: int, n_out: int):
    if limit <= 0:
        raise ArgumentError(f"KeySplit: categorical_limit = {limit} must be > 0")
    if n_out != limit:
        raise ArgumentError(f"KeySplit: {n_out} outputs for categorical_limit={limit}; give one output per category")
    if keys.dtype is not None and keys.dtype != np.int64:
        raise DTypeError(f"KeySplit: keys must be int64, got {keys.dtype}")


def _key_values(keys, limit: int, read):
    """The keys (None when unknown), each checked to lie in 0..limit-1."""
    values = read(keys, "keys")
    for i, v in enumerate(values or ()):
        if not 0 <= v < limit:
            raise ShapeError(f"KeySplit: keys[{i}] = {v} is out of range 0..{limit - 1} (categorical_limit)")
    return values


def _key_split_shape(specs, *, categorical_limit):
    _key_split_checks(specs[0], categorical_limit, categorical_limit)
    values = _key_values(specs[0], categorical_limit, known_ints)
    counts = None if values is None else np.bincount(values, minlength=categorical_limit).tolist()
    return [value_dependent((None if counts is None else counts[k],), np.int32) for k in range(categorical_limit)]


@op("KeySplit", inputs=1, outputs=(1, None), inplace=NOT_IN_PLACE, context="structure",
    args={"categorical_limit": Arg("int", REQUIRED)}, shape=_key_split_shape)
def key_split(ctx, xp, keys, *, categorical_limit):
    """KEYS (int64, values in 0..categorical_limit-1) -> output k: int32 the positions of the keys equal to k."""
    _key_split_checks(keys, categorical_limit, len(ctx.outputs))
    values = np.asarray(_key_values(keys, categorical_limit, host_ints), dtype=np.int64)
    return tuple(on_device(xp, np.flatnonzero(values == k), np.int32) for k in range(categorical_limit))
