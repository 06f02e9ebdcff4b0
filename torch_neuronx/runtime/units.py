"""Sizes in bytes as people read them."""


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
