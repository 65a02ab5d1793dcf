"""CSV output formatted like pandas ``DataFrame.to_csv(index=False)`` for the report's values.

* floats: ``repr`` (pandas' default full precision); NaN and None: an empty cell;
* bools: ``True`` / ``False``; ints: ``str``;
* tuples, lists and dicts: their Python ``repr``; floats that TraceLens computed with numpy
  (kernel-detail statistics) are ``NpFloat`` and print as ``np.float64(x)`` inside them, as numpy 2
  does;
* quoting: ``csv.QUOTE_MINIMAL``, ``\\n`` line ends, UTF-8 (``µ`` appears in column names).
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any, Iterable, Mapping


class NpFloat(float):
    """A float that prints like numpy 2's ``np.float64`` scalar inside containers."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"np.float64({float.__repr__(self)})"

    def __str__(self) -> str:
        return float.__repr__(self)


def format_cell(v: Any) -> str:
    if v is None:
        return ""
    t = type(v)
    if t is str:
        return v
    if t is bool:
        return "True" if v else "False"
    if t is int:
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return ""
        return float.__repr__(v)
    if isinstance(v, (tuple, list, dict, set)):
        return repr(v)
    # numpy scalars and anything else: their plain str (np.float64 str is the float repr).
    try:
        import numpy as np  # local: only for the rare numpy scalar
        if isinstance(v, np.floating):
            f = float(v)
            return "" if math.isnan(f) else float.__repr__(f)
        if isinstance(v, np.integer):
            return str(int(v))
        if isinstance(v, np.bool_):
            return "True" if v else "False"
    except ImportError:  # pragma: no cover
        pass
    return str(v)


def write_csv(path: Path, columns: list[str], rows: Iterable[list]) -> None:
    with open(path, "w", encoding="utf-8", newline="") as fh:
        w = csv.writer(fh, quoting=csv.QUOTE_MINIMAL, lineterminator="\n")
        w.writerow(columns)
        for row in rows:
            w.writerow([format_cell(v) for v in row])


def write_csvs(tables: Mapping[str, Any], out_dir: str | Path) -> list[Path]:
    """One ``<sheet>.csv`` per table (objects with ``columns`` and ``rows``); returns the paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, table in tables.items():
        p = out / f"{name}.csv"
        write_csv(p, list(table.columns), table.rows)
        paths.append(p)
    return paths
