"""Sizes in bytes and durations as people read them."""


def format_bytes(nbytes: float) -> str:
    """``512 B``, ``1.50 KiB``, ``12.00 MiB``, ``2.00 GiB``: binary units, whole bytes below 1 KiB."""
    sign, value = ("-", -nbytes) if nbytes < 0 else ("", nbytes)
    if value < 1024:
        return f"{sign}{int(value)} B"
    for unit in ("KiB", "MiB", "GiB"):
        value /= 1024
        if value < 1024:
            return f"{sign}{value:.2f} {unit}"
    return f"{sign}{value / 1024:.2f} TiB"


_TIME_UNITS = (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6), ("ns", 1e-9))


def format_seconds(seconds: float) -> str:
    """``1.25 s``, ``340 ms``, ``12.5 µs``, ``0.8 ns``: three significant digits in the unit that keeps
    the number between 1 and 999 (so a small time never prints as ``0.0000 ms``)."""
    if seconds == 0:
        return "0 s"
    sign, value = ("-", -seconds) if seconds < 0 else ("", seconds)
    for unit, scale in _TIME_UNITS:
        if value >= scale * 0.9995:  # rounds to at least 1 in this unit
            break
    scaled = value / scale
    if scaled < 0.01:
        return f"{sign}<0.01 ns"
    return f"{sign}{scaled:.3g} {unit}" if scaled < 999.5 else f"{sign}{scaled:.0f} {unit}"


def seconds_range(seconds) -> str:
    """'1.2 s–4.5 s': a (low, high) range of seconds."""
    return f"{format_seconds(seconds[0])}–{format_seconds(seconds[1])}"


def seconds_estimate(seconds: float, interval) -> str:
    """'19.6 ms (15.1–25.3 ms)': an estimate and its interval."""
    return f"{format_seconds(seconds)} ({seconds_range(interval)})"


def id_ranges(ids) -> str:
    """[0, 1, 2, 3, 6] -> '0-3,6'; [] -> '-'."""
    parts: list[str] = []
    ids = sorted(ids)
    start = 0
    for i in range(1, len(ids) + 1):
        if i == len(ids) or ids[i] != ids[i - 1] + 1:
            first, last = ids[start], ids[i - 1]
            parts.append(str(first) if first == last else f"{first}-{last}")
            start = i
    return ",".join(parts) or "-"
