"""The numba kernel of :mod:`agent_gym.retrieval_index.engines.impact_bm25`: MaxScore top-k over impact postings.

Imported only by that module (numba is optional). ``cache=True`` writes the compiled code to
numba's cache, so only the first process on a machine compiles it.
"""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True, nogil=True, inline="always", _nrt=False)
def _advance(postings: np.ndarray, position: int, end: int, target: int) -> int:
    """First position in ``[position, end)`` whose row is ``>= target`` (galloping, then binary search)."""
    if position >= end or postings[position] >= target:
        return position
    step = 1
    low = position
    high = position + 1
    while high < end and postings[high] < target:
        low = high
        step *= 2
        high = position + step
    if high > end:
        high = end
    # postings[low] < target; the answer lies in (low, high].
    low += 1
    while low < high:
        middle = (low + high) // 2
        if postings[middle] < target:
            low = middle + 1
        else:
            high = middle
    return low


# Rows of the shortest query lists scored exactly before the main pass (see _search_one). Each costs a galloping
# lookup into every list: 64 searched wiki-100k in 118 ms of CPU where 256 took 144 (synthetic-1m: the same
# 820 ms for 16 to 256; AMD EPYC, one thread).
_PREPASS_BUDGET = 64
# Rows per window of the main pass: its score buffer (float32, 16 KB) stays in the L1 cache.
_WINDOW = 4096
# A window with fewer essential postings than _WINDOW / _SPARSE_RATIO is scored row by row.
_SPARSE_RATIO = 32
# Rows per sub-window of a dense window: the unit in which the lists that cannot lift a row past the k-th score
# alone are pruned (see _score_dense).
_SUB = 256
# The buffer scan compares float32 sums against the k-th score rounded to float32: a hair lower, so
# rounding never hides a row that ties it (the exact comparison follows).
_CUTOFF_SLACK = 1.0 - 1e-6


@numba.njit(cache=True, nogil=True, inline="always", _nrt=False)
def _better(score: float, row: int, other_score: float, other_row: int) -> bool:
    """Whether a hit ranks above another: higher score, or the same score and a lower row (Lucene's order)."""
    return score > other_score or (score == other_score and row < other_row)


@numba.njit(cache=True, nogil=True, _nrt=False)
def _offer(heap_scores: np.ndarray, heap_rows: np.ndarray, size: int, k: int, score: float, row: int) -> int:
    """Put a hit into the top-``k`` min-heap (worst at the root) if it belongs there; return the new size."""
    if size < k:
        child = size
        heap_scores[child] = score
        heap_rows[child] = row
        while child > 0:
            parent = (child - 1) // 2
            if _better(heap_scores[parent], heap_rows[parent], heap_scores[child], heap_rows[child]):
                heap_scores[child], heap_scores[parent] = heap_scores[parent], heap_scores[child]
                heap_rows[child], heap_rows[parent] = heap_rows[parent], heap_rows[child]
                child = parent
            else:
                break
        return size + 1
    if not _better(score, row, heap_scores[0], heap_rows[0]):
        return size
    heap_scores[0] = score
    heap_rows[0] = row
    _sift_down(heap_scores, heap_rows, size)
    return size


@numba.njit(cache=True, nogil=True, _nrt=False)
def _offer_new(
    heap_scores: np.ndarray, heap_rows: np.ndarray, size: int, k: int, score: float, row: int, seeded: np.ndarray
) -> int:
    """:func:`_offer`, for a row not among the ``seeded`` ones the first pass already offered."""
    if size == k and not _better(score, row, heap_scores[0], heap_rows[0]):
        return size
    if len(seeded) > 0:
        found = np.searchsorted(seeded, row)
        if found < len(seeded) and seeded[found] == row:
            return size
    return _offer(heap_scores, heap_rows, size, k, score, row)


@numba.njit(cache=True, nogil=True, inline="always", _nrt=False)
def _seek(
    seg_pos: np.ndarray, seg_block: np.ndarray, block: int, low: np.ndarray, position: int, seg: int, seg_stop: int,
    end: int, target: int,
) -> tuple[int, int]:
    """Move a list's cursor (posting ``position`` in segment ``seg``) to its first row ``>= target``.

    A segment holds the list's rows of one block (``seg_block[seg] * block`` + 16-bit offsets): the blocks wholly
    below ``target`` are skipped by their start rows, then the offsets are galloped. The cursor stays
    normalized: a position at the end of a segment moves on to the next one.
    """
    if position >= end:
        return position, seg
    moved = False
    while seg + 1 < seg_stop and np.int64(seg_block[seg + 1]) * block <= target:
        seg += 1
        moved = True
    if moved:
        position = seg_pos[seg]
    stop = seg_pos[seg + 1]
    position = _advance(low, position, stop, target - np.int64(seg_block[seg]) * block)
    if position == stop and seg + 1 < seg_stop:
        seg += 1
    return position, seg


@numba.njit(cache=True, nogil=True, fastmath={"nnan", "ninf", "nsz"}, _nrt=False)
def _add_window(
    seg_pos: np.ndarray, seg_block: np.ndarray, block: int, low: np.ndarray, quant: np.ndarray, position: int,
    seg: int, seg_stop: int, end: int, base: int, limit: int, block_base: int, codebook: np.ndarray, code_base: int,
    weight: float, buffer: np.ndarray,
) -> tuple[int, int]:
    """Add one list's postings with rows in ``[position's row, limit)`` into the buffer of the window that starts
    at row ``base``; return where the list stops (position, segment). The window lies in one block
    (``block_base`` its first row), so in at most one segment; its end is found by galloping first, so the add
    loop tests nothing else. A posting adds ``codebook[code_base + quant] * weight`` (its impact, weighted)."""
    if position >= end or np.int64(seg_block[seg]) * block != block_base:
        return position, seg  # the list's next row lies in a later block
    segment_end = seg_pos[seg + 1]
    offset = base - block_base
    stop = _advance(low, position, segment_end, limit - block_base)
    factor = np.float32(weight)
    for at in range(position, stop):
        # Indices as uint64: numba wraps a negative signed index around, a compare and select per load
        # (measured ~4 % of wiki-100k's kernel); these are never negative.
        row = np.uint64(np.int64(low[at]) - offset)
        buffer[row] += codebook[np.uint64(code_base + np.int64(quant[at]))] * factor
    if stop == segment_end and seg + 1 < seg_stop:
        seg += 1
    return stop, seg


@numba.njit(cache=True, nogil=True, _nrt=False)
def _sift_down(heap_scores: np.ndarray, heap_rows: np.ndarray, size: int) -> None:
    """Restore the min-heap (the worst hit at the root) downwards from the root."""
    parent = 0
    while True:
        left = 2 * parent + 1
        if left >= size:
            return
        worst = left
        right = left + 1
        if right < size and _better(heap_scores[left], heap_rows[left], heap_scores[right], heap_rows[right]):
            worst = right
        if _better(heap_scores[parent], heap_rows[parent], heap_scores[worst], heap_rows[worst]):
            heap_scores[worst], heap_scores[parent] = heap_scores[parent], heap_scores[worst]
            heap_rows[worst], heap_rows[parent] = heap_rows[parent], heap_rows[worst]
            parent = worst
        else:
            return


# The helpers below run with numba's reference counting off (``_nrt=False``: they allocate nothing): each array
# passed to a function, or bound to a name by inlining, costs an atomic increment and decrement, and in the loops
# over windows and candidate rows those took 24 % of a search (perf, wiki-100k).


@numba.njit(cache=True, nogil=True, _nrt=False)
def _score_seeded(
    seeded: np.ndarray, cursor: np.ndarray, cursor_seg: np.ndarray, seg_stop: np.ndarray, end: np.ndarray,
    code_base: np.ndarray, weight: np.ndarray, seg_pos: np.ndarray, seg_block: np.ndarray, block: int,
    low: np.ndarray, quant: np.ndarray, codebook: np.ndarray, heap_scores: np.ndarray, heap_rows: np.ndarray,
    size: int, k: int,
) -> int:
    """Score each of the ``seeded`` rows (ascending) exactly over every list and offer it to the heap; return the
    heap's size. ``cursor``/``cursor_seg`` are the lists' cursors, moved forward as the rows go."""
    for index in range(len(seeded)):
        row = seeded[index]
        score = 0.0
        for slot in range(len(cursor)):
            at, segment = _seek(seg_pos, seg_block, block, low, cursor[slot], cursor_seg[slot], seg_stop[slot],
                                end[slot], row)
            cursor[slot] = at
            cursor_seg[slot] = segment
            if at < end[slot] and np.int64(seg_block[segment]) * block + np.int64(low[at]) == row:
                score += codebook[code_base[slot] + np.int64(quant[at])] * weight[slot]
        size = _offer(heap_scores, heap_rows, size, k, score, row)
    return size


@numba.njit(cache=True, nogil=True, _nrt=False)
def _score_sparse(
    rows: np.ndarray, buffer: np.ndarray, base: int, first_essential: int, bound: np.ndarray, threshold: float,
    position: np.ndarray, seg: np.ndarray, seg_stop: np.ndarray, end: np.ndarray, code_base: np.ndarray,
    weight: np.ndarray, seg_pos: np.ndarray, seg_block: np.ndarray, block: int, low: np.ndarray, quant: np.ndarray,
    codebook: np.ndarray, heap_scores: np.ndarray, heap_rows: np.ndarray, size: int, k: int, seeded: np.ndarray,
) -> int:
    """A sparse window: each candidate row (ascending, repeats allowed) starts from its essential lists' sum in the
    window ``buffer`` (cleared as it is read), adds the other lists' impacts by galloping lookups while its bound
    can still pass ``threshold``, and is offered to the heap; return the heap's size."""
    for index in range(len(rows)):
        row = rows[index]
        score = buffer[row - base]
        if score == 0.0:
            continue  # a repeat of a row already taken
        buffer[row - base] = 0.0
        for slot in range(first_essential - 1, -1, -1):
            if score + bound[slot] < threshold:
                break
            at, segment = _seek(seg_pos, seg_block, block, low, position[slot], seg[slot], seg_stop[slot], end[slot],
                                row)
            position[slot] = at
            seg[slot] = segment
            if at < end[slot] and np.int64(seg_block[segment]) * block + np.int64(low[at]) == row:
                score += codebook[code_base[slot] + np.int64(quant[at])] * weight[slot]
        size = _offer_new(heap_scores, heap_rows, size, k, score, row, seeded)
    return size


@numba.njit(cache=True, nogil=True, _nrt=False)
def _merge_run(rows: np.ndarray, start: int, stop: int, scratch: np.ndarray) -> None:
    """Merge the ascending run ``rows[start:stop]`` into the ascending ``rows[:start]``, from the back.

    A sparse window's candidates are a few such runs, one per list. Sorting them with numba's quicksort took 8 %
    of wiki-100k's kernel (perf); merging them as they come took its kernel from 82 to 74 ms (AMD EPYC).
    """
    count = stop - start
    for index in range(count):
        scratch[index] = rows[start + index]
    left = start - 1
    right = count - 1
    write = stop - 1
    while right >= 0:
        if left >= 0 and rows[left] > scratch[right]:
            rows[write] = rows[left]
            left -= 1
        else:
            rows[write] = scratch[right]
            right -= 1
        write -= 1


@numba.njit(cache=True, nogil=True, inline="always", _nrt=False)
def _part_maxima(buffer_bits: np.ndarray, submax_bits: np.ndarray, first: int, stop: int, span: int) -> None:
    """The best sum of each sub-window ``first .. stop - 1``, into ``submax_bits``. The sums are >= 0, and
    non-negative floats order as their bits do: an integer max over a loop of fixed length vectorizes, where a
    float max or a loop ending at ``span`` did not (measured: 0.03 against 1.1 us a window)."""
    for part in range(first, stop):
        top = np.int32(0)
        start = part * _SUB
        if start + _SUB <= span:
            # A slice, indexed from 0: ``buffer_bits[start + index]`` compiled to gathers (a negative index
            # wraps around in numba, so the loads were not provably contiguous).
            part_bits = buffer_bits[start : start + _SUB]
            for index in range(_SUB):
                top = max(top, part_bits[index])
        else:  # a window cut short by its block's end
            for offset in range(start, span):
                top = max(top, buffer_bits[offset])
        submax_bits[part] = top


@numba.njit(cache=True, nogil=True, fastmath={"nnan", "ninf", "nsz"}, _nrt=False)
def _score_dense(
    buffer: np.ndarray, buffer_bits: np.ndarray, submax: np.ndarray, submax_bits: np.ndarray, base: int,
    limit: int, block_base: int, first_essential: int, bound: np.ndarray, threshold: float, position: np.ndarray,
    seg: np.ndarray, seg_stop: np.ndarray, end: np.ndarray, code_base: np.ndarray, weight: np.ndarray,
    seg_pos: np.ndarray, seg_block: np.ndarray, block: int, low: np.ndarray, quant: np.ndarray,
    codebook: np.ndarray, heap_scores: np.ndarray, heap_rows: np.ndarray, size: int, k: int, seeded: np.ndarray,
) -> int:
    """A dense window, its essential lists already summed in ``buffer``: add the other lists, offer the rows
    above the k-th score, clear the buffer; return the heap's size.

    The other lists go largest bound first, each only into the sub-windows (``_SUB`` rows) whose best sum so far
    plus ``bound[slot]`` (the most the lists not yet added can give) can still reach ``threshold``; a sub-window
    that fails once fails for every later list (the bounds shrink). Adding every list everywhere walked 4x the
    essential postings on wiki-100k; this walks about a third of them (measured, 1,154 questions).
    ``buffer_bits`` and ``submax_bits`` are int32 views of ``buffer`` and ``submax``.
    """
    span = limit - base
    parts = (span + _SUB - 1) // _SUB
    _part_maxima(buffer_bits, submax_bits, 0, parts, span)
    # A hair lower than the k-th score: float32 sums never hide a row that could tie it.
    floor = threshold * _CUTOFF_SLACK
    for slot in range(first_essential - 1, -1, -1):
        need = floor - bound[slot]
        part = 0
        while part < parts:
            # submax 0: no essential row here, so at most bound[first_essential - 1] < threshold
            if submax[part] <= 0.0 or submax[part] < need:
                part += 1
                continue
            first = part  # a run of live sub-windows: one add, then their maxima again
            while part < parts and submax[part] > 0.0 and submax[part] >= need:
                part += 1
            at, segment = _seek(seg_pos, seg_block, block, low, position[slot], seg[slot], seg_stop[slot], end[slot],
                                base + first * _SUB)
            position[slot], seg[slot] = _add_window(
                seg_pos, seg_block, block, low, quant, at, segment, seg_stop[slot], end[slot], base,
                min(limit, base + part * _SUB), block_base, codebook, code_base[slot], weight[slot], buffer)
            _part_maxima(buffer_bits, submax_bits, first, part, span)
    cutoff = np.float32(heap_scores[0] * _CUTOFF_SLACK) if size == k else np.float32(0.0)
    for part in range(parts):
        # Once the k-th score is settled, most sub-windows hold no row above it: only the others are walked.
        if submax[part] < cutoff or submax[part] <= 0.0:
            continue
        for offset in range(part * _SUB, min(span, (part + 1) * _SUB)):
            if buffer[offset] >= cutoff and buffer[offset] > 0.0:
                size = _offer_new(heap_scores, heap_rows, size, k, buffer[offset], base + offset, seeded)
                if size == k:
                    cutoff = np.float32(heap_scores[0] * _CUTOFF_SLACK)
    for offset in range(span):  # a loop, not buffer[:]: a slice is an array to reference-count
        buffer[offset] = 0.0
    return size


@numba.njit(cache=True, nogil=True)
def _search_one(
    terms: np.ndarray,
    term_segs: np.ndarray,
    seg_pos: np.ndarray,
    seg_block: np.ndarray,
    low: np.ndarray,
    quant: np.ndarray,
    term_code: np.ndarray,
    codebook: np.ndarray,
    term_max: np.ndarray,
    block: int,
    k: int,
    out_rows: np.ndarray,
    out_scores: np.ndarray,
    buffer: np.ndarray,
) -> int:
    # A repeated query word counts once per occurrence, as in Lucene's boolean query: merge
    # repeats into one posting list with a multiplier.
    sorted_terms = np.sort(terms)
    unique = 0
    multiplier = np.zeros(len(sorted_terms), dtype=np.float64)
    merged = np.empty(len(sorted_terms), dtype=np.int64)
    for i in range(len(sorted_terms)):
        if unique > 0 and merged[unique - 1] == sorted_terms[i]:
            multiplier[unique - 1] += 1.0
        else:
            merged[unique] = sorted_terms[i]
            multiplier[unique] = 1.0
            unique += 1
    # Order the lists by their largest contribution, smallest first: a prefix of them is the
    # "non-essential" set whose summed maxima cannot reach the k-th score.
    upper = np.empty(unique, dtype=np.float64)
    for i in range(unique):
        upper[i] = term_max[merged[i]] * multiplier[i]
    order = np.argsort(upper, kind="mergesort")
    m = unique
    # A list's cursor: its posting ``position`` in segment ``seg`` (segments ``seg < seg_stop``), its end.
    position = np.empty(m, dtype=np.int64)
    seg = np.empty(m, dtype=np.int64)
    seg_stop = np.empty(m, dtype=np.int64)
    end = np.empty(m, dtype=np.int64)
    code_base = np.empty(m, dtype=np.int64)  # a posting's impact: codebook[code_base + quant]
    weight = np.empty(m, dtype=np.float64)
    bound = np.empty(m, dtype=np.float64)  # bound[i]: sum of upper[order[0..i]]
    running = 0.0
    for slot in range(m):
        term = merged[order[slot]]
        seg[slot] = term_segs[term]
        seg_stop[slot] = term_segs[term + 1]
        position[slot] = seg_pos[seg[slot]]
        end[slot] = seg_pos[seg_stop[slot]]
        code_base[slot] = term_code[term]
        weight[slot] = multiplier[order[slot]]
        running += upper[order[slot]]
        bound[slot] = running
    heap_scores = np.empty(k, dtype=np.float64)
    heap_rows = np.empty(k, dtype=np.int64)
    size = 0
    # Start from a threshold near the final one: score exactly every row of the shortest lists
    # (the rare words, usually the answer's name) before the document-at-a-time pass. Without it
    # the k-th score rises only as rare rows turn up in row order, and the long lists of common
    # words are walked almost to the end.
    by_length = np.argsort(end - position, kind="mergesort")
    total = 0
    chosen = 0
    while chosen < m and total + end[by_length[chosen]] - position[by_length[chosen]] <= _PREPASS_BUDGET:
        total += end[by_length[chosen]] - position[by_length[chosen]]
        chosen += 1
    gathered = np.empty(total, dtype=np.int64)
    filled = 0
    for i in range(chosen):
        slot = by_length[i]
        for segment in range(seg[slot], seg_stop[slot]):
            for at in range(seg_pos[segment], seg_pos[segment + 1]):
                gathered[filled] = np.int64(seg_block[segment]) * block + np.int64(low[at])
                filled += 1
    seeded = np.unique(gathered)
    size = _score_seeded(seeded, position.copy(), seg.copy(), seg_stop, end, code_base, weight, seg_pos, seg_block,
                         block, low, quant, codebook, heap_scores, heap_rows, size, k)
    threshold = heap_scores[0] if size == k else -1.0  # BM25 weights are positive
    first_essential = 0
    while size == k and first_essential < m and bound[first_essential] < threshold:
        first_essential += 1
    # Windows of rows, each started at the next row of an "essential" list (one whose words can still
    # lift a document past the k-th score). The essential lists are added into a
    # dense window buffer, term at a time: a sequential add costs about a nanosecond per posting, a
    # galloping lookup ten or more. Rows that only the other lists touch score at most their
    # summed maxima, below the k-th score, so they never need scoring. A window ends at its block's end at
    # the latest, so each list adds from one segment.
    no_row = np.int64(1) << 40
    window_start = np.empty(m, dtype=np.int64)
    candidates = np.empty(_WINDOW // _SPARSE_RATIO, dtype=np.int64)  # a sparse window's rows: fewer than this
    scratch = np.empty(_WINDOW // _SPARSE_RATIO, dtype=np.int64)
    submax = np.empty(_WINDOW // _SUB, dtype=np.float32)  # a dense window's best sum in each sub-window
    submax_bits = submax.view(np.int32)
    buffer_bits = buffer.view(np.int32)
    while first_essential < m:
        base = no_row
        for slot in range(first_essential, m):
            if position[slot] < end[slot]:
                row = np.int64(seg_block[seg[slot]]) * block + np.int64(low[position[slot]])
                if row < base:
                    base = row
        if base == no_row:
            break
        block_base = base - base % block
        limit = min(base + _WINDOW, block_base + block)
        essential_count = 0
        for slot in range(first_essential, m):
            window_start[slot] = position[slot]
            position[slot], seg[slot] = _add_window(
                seg_pos, seg_block, block, low, quant, position[slot], seg[slot], seg_stop[slot], end[slot], base,
                limit, block_base, codebook, code_base[slot], weight[slot], buffer)
            essential_count += position[slot] - window_start[slot]
        if essential_count * _SPARSE_RATIO < _WINDOW:
            # Few rows: score each, in row order, with galloping lookups into the other lists.
            filled = 0
            for slot in range(first_essential, m):
                run = filled
                for at in range(window_start[slot], position[slot]):
                    candidates[filled] = block_base + np.int64(low[at])
                    filled += 1
                if run > 0 and filled > run and candidates[run] < candidates[run - 1]:
                    _merge_run(candidates, run, filled, scratch)
            rows = candidates[:filled]
            size = _score_sparse(rows, buffer, base, first_essential, bound, threshold, position, seg, seg_stop, end,
                                 code_base, weight, seg_pos, seg_block, block, low, quant, codebook, heap_scores,
                                 heap_rows, size, k, seeded)
        else:
            size = _score_dense(buffer, buffer_bits, submax, submax_bits, base, limit, block_base, first_essential,
                                bound, threshold, position, seg, seg_stop, end, code_base, weight, seg_pos,
                                seg_block, block, low, quant, codebook, heap_scores, heap_rows, size, k, seeded)
        if size == k:
            threshold = heap_scores[0]
            while first_essential < m and bound[first_essential] < threshold:
                first_essential += 1
    # Best first (insertion sort: k is small).
    for rank in range(1, size):
        score = heap_scores[rank]
        row = heap_rows[rank]
        back = rank - 1
        while back >= 0 and _better(score, row, heap_scores[back], heap_rows[back]):
            heap_scores[back + 1] = heap_scores[back]
            heap_rows[back + 1] = heap_rows[back]
            back -= 1
        heap_scores[back + 1] = score
        heap_rows[back + 1] = row
    for rank in range(size):
        out_rows[rank] = heap_rows[rank]
        out_scores[rank] = heap_scores[rank]
    return size


@numba.njit(cache=True, nogil=True)
def search_batch(
    query_terms: np.ndarray,
    query_starts: np.ndarray,
    term_segs: np.ndarray,
    seg_pos: np.ndarray,
    seg_block: np.ndarray,
    low: np.ndarray,
    quant: np.ndarray,
    term_code: np.ndarray,
    codebook: np.ndarray,
    term_max: np.ndarray,
    block: int,
    k: int,
    out_rows: np.ndarray,
    out_scores: np.ndarray,
    out_counts: np.ndarray,
) -> None:
    """Top ``k`` rows and scores of each query (its term ids are ``query_terms[starts[q]:starts[q+1]]``).

    The postings (see :mod:`agent_gym.retrieval_index.engines.impact_bm25`): term ``t``'s segments are
    ``term_segs[t] .. term_segs[t+1]``; segment ``s`` holds postings ``seg_pos[s] .. seg_pos[s+1]``, rows
    ``seg_block[s] * block + low[i]``, impacts ``codebook[term_code[t] +
    quant[i]]``; ``term_max[t]`` is the largest.
    """
    buffer = np.zeros(_WINDOW, dtype=np.float32)
    for query in range(len(query_starts) - 1):
        terms = query_terms[query_starts[query] : query_starts[query + 1]]
        out_counts[query] = _search_one(
            terms, term_segs, seg_pos, seg_block, low, quant, term_code, codebook, term_max, block, k,
            out_rows[query], out_scores[query], buffer,
        )


# The kernel's array types, as :func:`agent_gym.retrieval_index.engines.impact_bm25.ImpactBM25` passes them.
SIGNATURE = ("void(i4[::1], i8[::1], u4[::1], i8[::1], u2[::1], u2[::1], u1[::1], u4[::1], f4[::1], f4[::1], i8, i8, "
             "i4[:,::1], f4[:,::1], i4[::1])")


def build_extension(out_dir: str, name: str) -> None:
    """Compile :func:`search_batch` ahead of time into a C extension module ``name`` in ``out_dir``.

    The module needs neither numba nor LLVM to run: a process that loads it instead of JIT-compiled code
    holds ~135 MB less (measured: 69 vs 204 MB RSS after a search). Run in a child process (it imports
    LLVM); needs a C compiler.
    """
    import warnings

    from numba.pycc import CC
    from numba.pycc import compiler as pycc_compiler

    class ReleasingTheGil(pycc_compiler.Flags):
        """pycc's flags, with the module's wrapper releasing the GIL around the kernel as ``nogil=True`` does for
        the JIT: the kernel touches only the arrays it is given, and a batch split across threads (``threads=2``)
        must run on as many cores. pycc has no option for it; without it two threads measured 1.00x of one."""

        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)
            self.release_gil = True

    pycc_compiler.Flags = ReleasingTheGil  # this child process only: it compiles the module and exits
    warnings.simplefilter("ignore")  # pycc's pending-deprecation notice
    compiler = CC(name)
    compiler.output_dir = out_dir
    compiler.target_cpu = "host"  # built on the machine that runs it, for its CPU
    compiler.export("search_batch", SIGNATURE)(search_batch.py_func)
    compiler.compile()
