"""``neuron-cache [--dir PATH] {list,size,clear}``: inspect or clear the compile cache (TorchNeuron's
NEFF cache layout, :mod:`torch_neuronx.neuron_dynamo_backend.caching.neff_cache`). Also
``python -m torch_neuronx.neuron_cache``.
"""
from __future__ import annotations

import argparse
import datetime
import os
import sys

from torch_neuronx.neuron_dynamo_backend.caching import neff_cache
from torch_neuronx.runtime import format_bytes


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, returned as exit status 2 by main()
        raise _UsageError(message)


def _parser() -> _Parser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--dir", default=argparse.SUPPRESS, help="cache directory "
                        "(default: $TORCH_NEURONX_NEFF_CACHE_DIR or /tmp/neff_cache)")
    parser = _Parser(prog="neuron-cache", parents=[common],
                     description="Inspect or clear the torch_neuronx compile cache.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    commands.add_parser("list", parents=[common], help="one line per entry, then a total")
    commands.add_parser("size", parents=[common], help="total size and entry count")
    commands.add_parser("clear", parents=[common], help="remove every entry")
    return parser


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
              f"{os.path.join(cache.directory, neff_cache.INDUCTOR_SUBDIR)} (removed by clear)")


def main(argv=None) -> int:
    try:
        args = _parser().parse_args(argv)
    except _UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except SystemExit as e:  # --help
        return e.code if isinstance(e.code, int) else 0
    try:
        cache = neff_cache.NeffCache(getattr(args, "dir", None))
    except ValueError as e:  # a bad environment variable
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        if args.command == "clear":
            print(f"removed {cache.clear()} entries from {cache.directory}")
        else:
            _show(cache, args.command == "list")
        return 0
    except OSError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
