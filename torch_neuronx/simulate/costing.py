"""One rank's record costed on a layout (:func:`rank_spans`): its op calls, launches and
collectives, step by step, by :mod:`torch_neuronx.trainium.time_model`. The plan builds its
rows from it (:mod:`.plan`), and the fit of the model's constants re-costs the published rows'
records with it (:mod:`.fit`): one costing for both.

A layout is what :class:`.plan.Layout` provides: ``link(ranks)`` -> (the slowest link the group
crosses, each rank's bandwidth on it) and ``instance.chip.name``.
"""
from __future__ import annotations

from collections import Counter

from torch_neuronx.trainium import time_model
from torch_neuronx.runtime.units import id_ranges as ranges
from torch_neuronx.simulate.rows import BackwardRow, CollectiveRow, OverlapCallRow


def grouped_collectives(rec) -> dict[tuple, int]:
    """{(op, ranks, bytes, shapes, line, step): calls} of a record, in the order first called;
    a relabelled record's groups translated (symmetry.relabel_lightly)."""
    cached = getattr(rec, "grouped", None)
    if cached is None:  # once per record: a decode of 1,500 steps makes 243,000 calls
        cached = rec.grouped = {}
        for c in rec.collectives:
            key = (c.op, c.ranks, c.bytes, c.shapes, c.line, c.step)
            cached[key] = cached.get(key, 0) + 1
    translate = getattr(rec, "group_map", None)
    if not translate:
        return cached
    return {(op, translate.get(g, g), b, s, line, step): n for (op, g, b, s, line, step), n in cached.items()}


def compute_spans(profile, rec, cal) -> dict:
    """{step: Span} of a record's op calls and launches (no collectives yet)."""
    spans = {}
    for step in set(rec.work) | set(rec.launches):
        launches = rec.launches.get(step, {})
        spans[step] = time_model.Span(time_model.work_span(profile, Counter(rec.work.get(step, {})), cal),
                                      launches.get("eager", 0), launches.get("graph", 0))
    return spans


def collective_seconds(op: str, ranks: tuple, nbytes: int, layout, cal) -> tuple[float, float]:
    """(latency, transfer) of one call on ``ranks``, on the slowest link the group crosses."""
    link, bw = layout.link(ranks)
    return time_model.collective_seconds(op, nbytes, len(ranks), bw, link, layout.instance.chip.name, cal)


def costed_collectives(rec, spans: dict, layout, cal, name_of=lambda group: None) -> list[CollectiveRow]:
    """Each distinct collective call of a rank, timed on its group's link; its time goes to its step's span."""
    calls = []
    for (op, group, nbytes, shapes, line, step), n in grouped_collectives(rec).items():
        latency, transfer = collective_seconds(op, group, nbytes, layout, cal)
        span = spans.setdefault(step, time_model.Span())
        span.comm_latency_s += n * latency
        span.comm_transfer_s += n * transfer
        span.comm_calls += n if len(group) > 1 else 0
        calls.append(CollectiveRow(op, name_of(group), nbytes, shapes, line, step, n, latency + transfer))
    return calls


def overlap_calls(rec, backward) -> list[tuple[str, tuple, int, str | None]]:
    """(op, ranks, bytes, line) of each collective a backward launched without waiting for it, its
    group translated for a relabelled rank. A run record holds indices into its collectives, a
    re-costed one the calls themselves."""
    translate = getattr(rec, "group_map", None) or {}
    calls = []
    for call in backward.calls:
        if isinstance(call, int):
            c = rec.collectives[call]
            call = (c.op, c.ranks, c.bytes, c.line)
        op, ranks, nbytes, line = call
        calls.append((op, translate.get(tuple(ranks), tuple(ranks)), nbytes, line))
    return calls


def _compute_after(profile, backward, cal) -> list[float]:
    """The compute seconds (work and launches) left after each launch of ``backward`` (overlap.Backward)."""
    costs = [time_model.work_span(profile, Counter(seg.work), cal) + seg.eager * cal.eager_launch_s
             + seg.graph * cal.graph_launch_s for seg in backward.segments]
    return [sum(costs[i:]) for i in range(len(costs))]


def hidden(rec, spans: dict, layout, profile, cal, cache: dict) -> list[BackwardRow]:
    """Each backward's collectives that run under its compute (DDP's buckets): their time hidden
    goes to the step's span; returns what the plan lists of them."""
    listed = []
    for backward in getattr(rec, "overlaps", None) or []:
        if id(backward) not in cache:  # relabelled ranks share rank 0's backwards
            cache[id(backward)] = _compute_after(profile, backward, cal)
        calls, after = overlap_calls(rec, backward), cache[id(backward)]
        seconds = [sum(collective_seconds(op, ranks, nbytes, layout, cal)) for op, ranks, nbytes, _ in calls]
        hidden_s = time_model.overlapped_seconds(zip(seconds, after))
        spans.setdefault(backward.step, time_model.Span()).hidden_s += hidden_s
        listed.append(BackwardRow(backward.step, hidden_s, sum(seconds) - hidden_s,
                                  [OverlapCallRow(op, ranges(ranks), nbytes, line, t, a)
                                   for (op, ranks, nbytes, line), t, a in zip(calls, seconds, after)]))
    return listed


def graph_hidden(rec, spans: dict, layout, profile, cal) -> None:
    """The time each compiled graph's collectives run under its own independent compute
    (graph_overlap.py), per call, goes to its step's span as hidden."""
    translate = getattr(rec, "group_map", None) or {}
    for entry in getattr(rec, "graph_overlaps", None) or []:
        calls = entry.collectives

        def collective(i, calls=calls):
            op, ranks, nbytes = calls[i]
            return sum(collective_seconds(op, translate.get(tuple(ranks), tuple(ranks)), nbytes, layout, cal))

        hidden_s = time_model.scheduled_hidden(
            entry.events, lambda work: time_model.work_span(profile, Counter(work), cal), collective)
        spans.setdefault(entry.step, time_model.Span()).hidden_s += hidden_s * entry.calls


def rank_spans(rec, layout, profile, cal, compute_cache: dict | None = None, after_cache: dict | None = None,
               name_of=lambda group: None) -> tuple[dict, list[CollectiveRow], list[BackwardRow]]:
    """(each step's Span, the rank's costed collectives, its backwards' overlapped collectives). Ranks
    that share their work (relabelled ones) share its costing through ``compute_cache``."""
    compute_cache = {} if compute_cache is None else compute_cache
    if id(rec.work) not in compute_cache:
        compute_cache[id(rec.work)] = compute_spans(profile, rec, cal)
    spans = {step: time_model.Span(**vars(span)) for step, span in compute_cache[id(rec.work)].items()}
    calls = costed_collectives(rec, spans, layout, cal, name_of)
    overlapped = hidden(rec, spans, layout, profile, cal, {} if after_cache is None else after_cache)
    graph_hidden(rec, spans, layout, profile, cal)
    return spans, calls, overlapped
