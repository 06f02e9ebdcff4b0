"""``neuron-cache [--dir PATH] {list,size,clear,verify}``: inspect, verify or clear the compile cache
(TorchNeuron's NEFF cache layout, :mod:`torch_neuronx.neuron_dynamo_backend.caching.neff_cache`),
each time saying who owns its directories, their mode and what the cache trusts there
(:mod:`.trust`). Also ``python -m torch_neuronx.neuron_cache``.
"""
from __future__ import annotations

import argparse
import datetime
import sys
import warnings

from torch_neuronx.neuron_dynamo_backend.caching import neff_cache, trust
from torch_neuronx.runtime import format_bytes


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, returned as exit status 2 by main()
        raise _UsageError(message)


def _parser() -> _Parser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--dir", default=argparse.SUPPRESS, help="cache directory, examined as it is "
                        "(default: the one compiles use: $TORCH_NEURONX_NEFF_CACHE_DIR or /tmp/neff_cache, "
                        "or the per-user one that replaces a directory others can write)")
    parser = _Parser(prog="neuron-cache", parents=[common],
                     description="Inspect or clear the torch_neuronx compile cache.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    commands.add_parser("list", parents=[common], help="one line per entry, then a total")
    commands.add_parser("size", parents=[common], help="total size and entry count")
    commands.add_parser("clear", parents=[common], help="remove every entry")
    commands.add_parser("verify", parents=[common], help="check every entry's checksum (and, with a key, its MAC) "
                        "without loading it; exit 1 if one would not load")
    return parser


_STATES = {
    trust.PRIVATE: "yours alone: used as it is",
    trust.SHARED: "others can write it: an entry loads only if its MAC verifies",
    trust.TRUSTED: f"others can write it: used as it is, because {trust.TRUST_ENV} is set",
    trust.REFUSED: "others can write it: compiles load nothing from it",
}


def _placement_line(label: str, placement: trust.Placement) -> str:
    if placement.path is None:
        return f"{label:<9}none usable ({placement.asked.path}: {placement.asked.problem})"
    check = trust.check_directory(placement.path)
    line = f"{label:<9}{placement.path}: {check.describe()}; {_STATES[placement.state]}"
    if placement.state == trust.REFUSED:
        line += f" ({check.problem})"
    if placement.asked is not None:
        line += f"; instead of {placement.asked.path} ({placement.asked.problem})"
    return line


def _describe(cache: neff_cache.NeffCache) -> None:
    """Who owns the cache's directories, their mode, and what the cache trusts there."""
    print(_placement_line("cache", cache.placement))
    signing = f"signed and verified with the key from {cache.key.source}" if cache.key else \
        "unsigned (no key: TORCH_NEURONX_NEFF_CACHE_KEY or _KEY_FILE)"
    print(f"{'entries':<9}{signing}")
    print(_placement_line("locks", cache.local))
    print(f"{'inductor':<9}{cache.inductor_directory() or 'Inductor default directory (none of the cache is safe)'}")


def _verify(cache: neff_cache.NeffCache) -> int:
    """Each entry as a load would find it: 0 when all would load, 1 otherwise."""
    bad = 0
    for entry in cache.entries():
        problem = cache.examine(entry.key)
        if problem is not None:
            bad += 1
            print(f"{entry.key}  {problem}")
    print(f"{len(cache.entries()) - bad} of {len(cache.entries())} entries would load, {cache.directory}")
    return 1 if bad else 0


def _show(cache: neff_cache.NeffCache, listing: bool) -> None:
    """The entries (with ``listing``), then the total and Inductor's working cache."""
    entries = cache.entries()
    total = sum(e.size for e in entries)
    if listing:
        for e in entries:
            mtime = datetime.datetime.fromtimestamp(e.mtime).isoformat(timespec="seconds")
            print(f"{e.key}  {e.size:>12}  {mtime}")
    print(f"total {total} bytes ({format_bytes(total)}) in {len(entries)} entries, {cache.directory}")
    inductor = cache.inductor_size()
    if inductor:
        print(f"plus {inductor} bytes ({format_bytes(inductor)}) of Inductor's working cache in "
              f"{', '.join(cache.inductor_directories())} (removed by clear)")


def main(argv=None) -> int:
    try:
        args = _parser().parse_args(argv)
    except _UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except SystemExit as e:  # --help
        return e.code if isinstance(e.code, int) else 0
    try:
        directory = getattr(args, "dir", None)
        with warnings.catch_warnings():  # what they would say, the description below says
            warnings.simplefilter("ignore")
            cache = neff_cache.NeffCache(directory, fallback=directory is None)
    except ValueError as e:  # a bad environment variable
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        _describe(cache)
        if args.command == "clear":
            print(f"removed {cache.clear()} entries from {cache.directory}")
        elif args.command == "verify":
            return _verify(cache)
        else:
            _show(cache, args.command == "list")
        return 0
    except OSError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
