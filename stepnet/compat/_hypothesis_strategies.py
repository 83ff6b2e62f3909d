"""The Hypothesis strategies of Caffe2's hypothesis_test_util (re-exported there): dims, elements, arrays and
tensors, segment ids and lengths, segmented and sparse tensors, with Caffe2's names, arguments and defaults.

Written for Hypothesis 6 and NumPy 2. Default float elements are drawn in [-1, 1] at the array's own width;
elements a caller gives for an integer or narrower float array are converted to the array's type first, as the
Hypothesis of Caffe2's time stored them (by assignment: rounded to float32, an integer wrapped to int32), since
Hypothesis 6 refuses a value the array cannot hold exactly.
"""
from __future__ import annotations

import functools

import hypothesis.extra.numpy as hnp
import hypothesis.strategies as st
import numpy as np

_FLOAT_WIDTHS = {np.dtype(np.float16): 16, np.dtype(np.float32): 32, np.dtype(np.float64): 64}


def _dtype(dtype) -> np.dtype | None:
    try:
        return np.dtype(dtype)
    except TypeError:
        return None


def dims(min_value=1, max_value=5):
    """A dimension: an integer in [min_value, max_value]."""
    return st.integers(min_value=min_value, max_value=max_value)


def elements_of_type(dtype=np.float32, filter_=None):
    """Caffe2's default elements of a dtype: floats in [-1, 1], non-negative int32 / int64, booleans; `filter_`
    (a predicate) keeps only the values it accepts. ValueError for another dtype."""
    kind = _dtype(dtype)
    if kind in _FLOAT_WIDTHS:
        elems = st.floats(min_value=-1.0, max_value=1.0, width=_FLOAT_WIDTHS[kind])
    elif kind == np.dtype(np.int32):
        elems = st.integers(min_value=0, max_value=2 ** 31 - 1)
    elif kind == np.dtype(np.int64):
        elems = st.integers(min_value=0, max_value=2 ** 63 - 1)
    elif kind == np.dtype(np.bool_):
        elems = st.booleans()
    else:
        raise ValueError("Unexpected dtype without elements provided")
    return elems if filter_ is None else elems.filter(filter_)


def _as_stored(kind: np.dtype):
    """value -> the value an array of `kind` stores for it (NumPy's C cast: rounding, truncation, wrapping)."""
    def store(value):
        return np.array(value).astype(kind)[()]
    return store


def arrays(dims, dtype=np.float32, elements=None):
    """Arrays of shape `dims` (a list of sizes, or one size) and `dtype`, elements from `elements` (default
    elements_of_type(dtype))."""
    if elements is None:
        elements = elements_of_type(dtype)
    kind = _dtype(dtype)
    if kind is not None and kind.kind in "iuf" and kind != np.dtype(np.float64):
        elements = elements.map(_as_stored(kind))
    return hnp.arrays(dtype, dims, elements=elements)


def tensor(min_dim=1, max_dim=4, dtype=np.float32, elements=None, **kwargs):
    """Arrays of min_dim to max_dim dimensions, each size from dims(**kwargs)."""
    dims_ = st.lists(dims(**kwargs), min_size=min_dim, max_size=max_dim)
    return dims_.flatmap(lambda shape: arrays(shape, dtype, elements))


def tensor1d(min_len=1, max_len=64, dtype=np.float32, elements=None):
    """1-d arrays of min_len to max_len elements."""
    return tensor(1, 1, dtype, elements, min_value=min_len, max_value=max_len)


def tensors(n, min_dim=1, max_dim=4, dtype=np.float32, elements=None, **kwargs):
    """Lists of n arrays of one shape (min_dim to max_dim dimensions, sizes from dims(**kwargs))."""
    dims_ = st.lists(dims(**kwargs), min_size=min_dim, max_size=max_dim)
    return dims_.flatmap(lambda shape: st.lists(arrays(shape, dtype, elements), min_size=n, max_size=n))


def tensors1d(n, min_len=1, max_len=64, dtype=np.float32, elements=None):
    """Lists of n 1-d arrays of one length (min_len to max_len)."""
    return tensors(n, 1, 1, dtype, elements, min_value=min_len, max_value=max_len)


def segment_ids(size, is_sorted):
    """int32 segment ids for `size` rows: sorted ones start at 0 and step by 0 or 1; unsorted ones are anything
    in [0, 2 * size]."""
    if size == 0:
        return st.just(np.empty(shape=[0], dtype=np.int32))
    if is_sorted:
        steps = arrays([size], dtype=np.int32, elements=st.booleans())
        return steps.map(lambda s: (np.cumsum(s, dtype=np.int32) - s[0]).astype(np.int32))
    return arrays([size], dtype=np.int32, elements=st.integers(min_value=0, max_value=2 * size))


def _lengths_from_borders(size: int):
    def lengths_of(borders):
        edges = np.sort(np.concatenate([np.asarray(borders, dtype=np.int32), np.array([0, size], dtype=np.int32)]))
        return np.diff(edges).astype(np.int32)
    return lengths_of


def lengths(size, min_segments=None, max_segments=None, **kwargs):
    """int32 lengths of min_segments to max_segments segments (default 0 to size) summing to `size`; a length
    may be 0."""
    min_segments = 0 if min_segments is None else min_segments
    max_segments = size if max_segments is None else max_segments
    assert 0 <= min_segments <= max_segments
    if size == 0 and max_segments == 0:
        return st.just(np.empty(shape=[0], dtype=np.int32))
    assert max_segments > 0, "size is not 0, need at least one segment"
    borders = st.integers(min_value=max(min_segments - 1, 0), max_value=max_segments - 1).flatmap(
        lambda count: hnp.arrays(np.int32, count, elements=st.integers(min_value=0, max_value=size)))
    return borders.map(_lengths_from_borders(size))


def _data_dims(min_dim, max_dim, allow_empty, kwargs):
    """(whether the first dimension is made 0, the sizes)."""
    gen_empty = st.booleans() if allow_empty else st.just(False)
    return st.tuples(gen_empty, st.lists(dims(**kwargs), min_size=min_dim, max_size=max_dim))


def segmented_tensor(min_dim=1, max_dim=4, dtype=np.float32, is_sorted=True, elements=None,
                     segment_generator=segment_ids, allow_empty=False, **kwargs):
    """(data, segments): data of min_dim to max_dim dimensions (allow_empty: maybe with a first dimension 0
    in front) and segment_generator(rows, is_sorted=is_sorted) for its rows."""
    shapes = _data_dims(min_dim, max_dim, allow_empty, kwargs).map(
        lambda pair: ([0] if pair[0] else []) + pair[1])
    return shapes.flatmap(lambda shape: st.tuples(arrays(shape, dtype, elements),
                                                  segment_generator(shape[0], is_sorted=is_sorted)))


def lengths_tensor(min_segments=None, max_segments=None, *args, **kwargs):
    """segmented_tensor with lengths (min_segments to max_segments of them) in place of segment ids."""
    gen = functools.partial(lengths, min_segments=min_segments, max_segments=max_segments)
    return segmented_tensor(*args, segment_generator=gen, **kwargs)


def sparse_segmented_tensor(min_dim=1, max_dim=4, dtype=np.float32, is_sorted=True, elements=None,
                            allow_empty=False, segment_generator=segment_ids, itype=np.int64, **kwargs):
    """(data, indices, segments): data as segmented_tensor's (never empty), 1 to rows indices into its rows
    (of type itype; none when allow_empty draws it) and segment_generator(number of indices)."""
    def with_count(pair):
        empty, shape = pair
        count = st.just(0) if empty else st.integers(min_value=1, max_value=shape[0])
        return st.tuples(st.just(shape), count)

    def draw(shape_and_count):
        shape, count = shape_and_count
        return st.tuples(
            arrays(shape, dtype, elements),
            arrays(count, dtype=itype, elements=st.integers(min_value=0, max_value=shape[0] - 1)),
            segment_generator(count, is_sorted=is_sorted))

    return _data_dims(min_dim, max_dim, allow_empty, kwargs).flatmap(with_count).flatmap(draw)


def sparse_lengths_tensor(**kwargs):
    """sparse_segmented_tensor with lengths in place of segment ids."""
    return sparse_segmented_tensor(segment_generator=lengths, **kwargs)
