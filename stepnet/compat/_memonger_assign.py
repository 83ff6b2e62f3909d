"""Live ranges of blobs in a linear op order, and their assignment to shared blobs (memonger's
optimize_interference): blobs whose ranges do not overlap can live in one blob.

An assignment is a list of (name, LiveRange) in the order they take the shared blob; every blob of it is
renamed to its last one. GREEDY puts each range (sorted by last use) into the compatible assignment whose
largest size is closest to its own; DYNAMIC_PROGRAMMING searches for the assignment of least total size (the sum
over assignments of their largest blob).
"""
from __future__ import annotations

import copy
import enum
import logging
from collections import namedtuple

log = logging.getLogger("memonger")

LiveRange = namedtuple("LiveRange", ["defined", "used", "size"])


class AssignmentAlgorithm(enum.Enum):
    GREEDY = 0
    DYNAMIC_PROGRAMMING = 1


def compute_ranges(linearized_ops, blob_sizes=None) -> dict:
    """{blob: LiveRange(first op writing it, last op reading it, size from blob_sizes or None)}."""
    if not blob_sizes:
        log.warning("Provide blob sizes to get more accurate assignments.")
    ranges: dict = {}

    def size_of(blob):
        if not blob_sizes:
            return None
        if blob not in blob_sizes:
            raise KeyError(f"memonger: blob_sizes has no size for blob {blob!r}")
        return blob_sizes[blob]

    for i, op in enumerate(linearized_ops):
        for blob in op.input:
            r = ranges.get(blob, LiveRange(None, None, None))
            ranges[blob] = r._replace(used=i if r.used is None else max(r.used, i), size=size_of(blob))
        for blob in op.output:
            r = ranges.get(blob, LiveRange(None, None, None))
            ranges[blob] = r._replace(defined=i if r.defined is None else min(r.defined, i), size=size_of(blob))
    return ranges


def is_compatible(candidate_range, assignment, static_blobs) -> bool:
    """Whether a blob of candidate_range can follow the last blob of assignment (defined after its last use)."""
    name, last = assignment[-1]
    if name in static_blobs:
        return False
    if candidate_range.defined is None or last.defined is None or last.used is None:
        return False
    return candidate_range.defined > last.used


def compute_blob_assignments(assignments) -> dict:
    """{blob: the blob it is renamed to} for every assignment of two or more blobs (to its last blob)."""
    out = {}
    for assignment in assignments:
        if len(assignment) > 1:
            last = assignment[-1][0]
            out.update((blob, last) for blob, _ in assignment)
    return out


def _max_size(assignment) -> int:
    if not assignment:
        return 0
    return max(r.size or 0 for _, r in assignment)


def get_memory_usage(assignments) -> int:
    """The size of the shared blobs: per assignment, its largest blob."""
    return sum(_max_size(a) for a in assignments)


def compute_assignments_greedy(ranges_sorted, init_assignments=None) -> list:
    assignments = init_assignments or []
    placed = {name for a in assignments for name, _ in a}
    for name, range_ in ranges_sorted:
        if name in placed:
            continue
        size = range_.size or 0
        best, best_dist = None, float("inf")
        for k, assignment in enumerate(assignments):
            if is_compatible(range_, assignment, []):
                dist = abs(_max_size(assignment) - size)
                if dist < best_dist:
                    best, best_dist = k, dist
        if best is None:
            assignments.append([(name, range_)])
        else:
            assignments[best].append((name, range_))
    return assignments


def _count(assignments) -> int:
    return sum(len(a) for a in assignments) if assignments else 0


def compute_assignments_dp(ranges_sorted, init_assignment, counter=None) -> list:
    """The assignment of least memory for ranges_sorted (sorted by last use) on top of init_assignment.

    best[k] is the best assignment of the first k + 1 ranges. For range k, take the latest best[j] all of whose
    assignments range k could follow; the ranges j+1..k all overlap range k, so the best for them on top of
    best[j] tries range k in each assignment of best[j] (solving the ranges before it again without that
    assignment) or in a new one."""
    counter = counter or [0]
    counter[0] += 1
    init_assignment = init_assignment or []
    best: list = []
    for k, current in enumerate(ranges_sorted):
        j = k - 1
        while j >= 0 and not all(is_compatible(current[1], a, []) for a in best[j]):
            j -= 1
        base = copy.deepcopy(init_assignment if j < 0 else best[j])
        part = ranges_sorted[j + 1:k + 1]
        previous = best[-1] if best else init_assignment
        result = _find_best(part, base, previous, counter)
        if _count(result) != _count(base) + len(part):
            raise AssertionError("memonger: the dynamic program lost or duplicated a blob")
        best.append(copy.deepcopy(result))
    return best[-1] if best else init_assignment


def _find_best(ranges, init_assignment, previous_best, counter) -> list:
    """Best assignment of `ranges` (all before the last overlap the last) on top of init_assignment;
    previous_best: the best one of ranges[:-1]."""
    last = ranges[-1]
    candidates = []
    for k, assignment in enumerate(init_assignment):
        if not is_compatible(last[1], assignment, []):
            continue
        trial = copy.deepcopy(init_assignment)
        trial[k].append(last)
        if len(ranges) > 1:
            rest = [a for i, a in enumerate(trial) if i != k]
            trial = compute_assignments_dp(ranges[:-1], rest, counter) + [trial[k]]
        candidates.append(trial)
    candidates.append(previous_best + [[last]])
    return min(candidates, key=get_memory_usage)


def get_updated_ranges(ranges, max_live=None) -> list:
    """Ranges with None filled in: defined -1, used max_live (one past the last use), size 1."""
    if max_live is None:
        max_live = max((r.used for _, r in ranges if r.used), default=0) + 1
    out = []
    for name, r in ranges:
        out.append((name, LiveRange(-1 if r.defined is None else r.defined, max_live if r.used is None else r.used,
                                    1 if r.size is None else r.size)))
    return out


def compute_assignments(ranges, static_blobs, algo) -> list:
    """Assignments of the sharable blobs (static ones each keep their own), by `algo`."""
    ordered = sorted(ranges.items(), key=lambda p: (p[1].used is None, p[1].used or 0))
    ordered = get_updated_ranges(ordered)
    sharable = [x for x in ordered if x[0] not in static_blobs]
    static = [x for x in ordered if x[0] in static_blobs]
    log.info("Total sharable blobs %d", len(sharable))
    if algo == AssignmentAlgorithm.DYNAMIC_PROGRAMMING:
        best = compute_assignments_dp(sharable, [])
    elif algo == AssignmentAlgorithm.GREEDY:
        best = compute_assignments_greedy(sharable, [])
    else:
        raise ValueError(f"memonger: unknown assignment algorithm {algo!r}")
    return best + [[x] for x in static]


def verify_assignments(assignments) -> None:
    for assignment in assignments:
        for (_, a), (_, b) in zip(assignment[:-1], assignment[1:]):
            if not a.used < b.defined:
                raise AssertionError(f"memonger: live ranges {a} and {b} of one shared blob overlap")
