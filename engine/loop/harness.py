"""The harness and candidate modules the loop writes for one registry op of the built-in server.

``harness/harness.py`` follows the Model / get_inputs convention of ``magpie compare``: its
``Model`` calls the implementation the server uses today (the baseline), ``get_inputs()``
rebuilds the most time-weighted call the profiled trace recorded (shapes, dtypes, the values of
small integer tensors such as ``cu_seqlens``) and ``get_correctness_inputs()`` the others, so a
candidate is timed at the shape that matters most and must be correct at all of them. The user
may edit the file (shapes, tolerances) between ``--until harness`` and ``--resume``.

Each candidate becomes ``candidates/<id>.py`` with a ``ModelNew`` that calls the candidate's
function with the same arguments; the function's dotted path (``package.module:function``) or
file path (``/path/file.py:function``) is what the integrate step writes into the server's
``kernels:`` block.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Optional

HARNESS_DIR = "harness"
HARNESS_FILE = "harness.py"
MAX_SHAPES = 3
MIN_SHARE_PCT = 5.0  # a recorded call shape below this share of the op's time is left out
ROPE_THETA = 500000.0


# ---------------------------------------------------------------------------- used by the written modules
def load_implementation(path: str) -> Any:
    """The function at ``package.module:function``, ``package.module.function`` or
    ``/path/file.py:function``."""
    from engine.serve.kernels import import_kernel
    return import_kernel("harness", path)


def load_harness(path: Path) -> Any:
    """The harness module at ``path`` (a candidate reads its SCALARS from it)."""
    from engine.serve.kernels import load_module_file
    return load_module_file(str(path))


def build_inputs(op: str, args: list[dict]) -> list:
    """The tensor arguments of one recorded call (scalars are the harness's SCALARS)."""
    import torch
    tensors = [a for a in args if "shape" in a]
    out = []
    positions_limit = None
    if op == "rotary" and len(tensors) == 4:
        positions_limit = int(tensors[3]["shape"][0])
    for i, a in enumerate(tensors):
        dtype = getattr(torch, a["dtype"])
        shape = [int(d) for d in a["shape"]]
        if a.get("values") is not None:
            out.append(torch.tensor(a["values"], dtype=dtype).reshape(shape))
        elif not dtype.is_floating_point:
            high = positions_limit or max(1, shape[0] if shape else 1)
            out.append(torch.randint(0, high, shape, dtype=dtype))
        elif op == "rotary" and i == 3:
            out.append(_cos_sin_cache(shape[0], shape[1], dtype))
        elif op == "rmsnorm" and i == 1:
            out.append(torch.rand(shape, dtype=torch.float32).add_(0.5).to(dtype))  # a weight near 1
        else:
            out.append(torch.randn(shape, dtype=torch.float32).to(dtype))
    return out


def _cos_sin_cache(positions: int, dim: int, dtype: Any) -> Any:
    import torch
    inv_freq = 1.0 / ROPE_THETA ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    angles = torch.outer(torch.arange(positions, dtype=torch.float64), inv_freq)
    return torch.cat((angles.cos(), angles.sin()), dim=-1).to(dtype)


# ---------------------------------------------------------------------------- written by the loop
def chosen_calls(row: dict) -> list[dict]:
    """The recorded calls of a bottleneck row the harness rebuilds: most time-weighted first, at
    most MAX_SHAPES, each at least MIN_SHARE_PCT of the op's time (the first always)."""
    calls = row.get("call_args") or []
    keep = [c for i, c in enumerate(calls) if i == 0 or c.get("share_of_op_pct", 0.0) >= MIN_SHARE_PCT]
    return keep[:MAX_SHAPES]


def describe_call(args: list[dict]) -> str:
    parts = []
    for a in args:
        if "shape" in a:
            parts.append(f"{a['dtype']}[{','.join(str(d) for d in a['shape'])}]")
        elif "scalar" in a:
            parts.append(repr(a["scalar"]))
    return "(" + ", ".join(parts) + ")"


def write_harness(folder: Path, op: str, implementation: str, calls: list[dict]) -> dict:
    """Write ``folder/harness.py`` for ``op`` at the recorded ``calls``; what the step records."""
    if not calls:
        raise ValueError(f"no recorded call of kernels.{op} to build a harness from")
    scalars = [a["scalar"] for a in calls[0]["args"] if "scalar" in a]
    folder.mkdir(parents=True, exist_ok=True)
    shapes = [{"args": describe_call(c["args"]), "share_pct": c.get("share_of_op_pct")} for c in calls]
    lines = [
        f'"""Harness of the built-in server\'s kernels.{op}, written by magpie optimize from the profiled run.',
        "",
        "Model calls the implementation the server uses today (the baseline of the compare). get_inputs()",
        "rebuilds the most time-weighted call the trace recorded; get_correctness_inputs() the others: a",
        "candidate is timed at the first and must be correct at every one. Edit CALLS, SCALARS, RTOL or",
        "ATOL here before `magpie optimize --resume` runs the candidates step.",
        "",
    ]
    lines += [f"    call {i}: {s['args']}, {s['share_pct']}% of the op's time" for i, s in enumerate(shapes)]
    lines += [
        '"""',
        "",
        "import torch",
        "",
        "from engine.loop.harness import build_inputs, load_implementation",
        "",
        f"OP = {op!r}",
        f"IMPLEMENTATION = {implementation!r}",
        "CALLS = [  # one recorded call per line: its arguments in order",
        *[f"    {json.dumps(c['args'])}," for c in calls],
        "]",
        f"SCALARS = {_py(scalars)}  # passed after the tensors, as the server passes them",
        "RTOL = None  # None: the harness's default for the output dtype",
        "ATOL = None",
        "",
        "",
        "class Model(torch.nn.Module):",
        "    def __init__(self):",
        "        super().__init__()",
        "        self.fn = load_implementation(IMPLEMENTATION)",
        "",
        "    def forward(self, *tensors):",
        "        return self.fn(*tensors, *SCALARS)",
        "",
        "",
        "def get_inputs():",
        "    return build_inputs(OP, CALLS[0])",
        "",
        "",
        "def get_correctness_inputs():",
        "    return [build_inputs(OP, c) for c in CALLS[1:]]",
        "",
        "",
        "def get_init_inputs():",
        "    return []",
        "",
    ]
    (folder / HARNESS_FILE).write_text("\n".join(lines), encoding="utf-8")
    return {"op": op, "file": f"{folder.name}/{HARNESS_FILE}", "implementation": implementation, "shapes": shapes,
            "scalars": scalars}


def _py(values: list) -> str:
    return "[" + ", ".join("float('inf')" if isinstance(v, float) and math.isinf(v) else repr(v) for v in values) + "]"


def write_candidate(folder: Path, cid: str, path: str, description: str, harness_file: Path) -> Path:
    """``folder/<cid>.py``: a ModelNew calling the function at ``path`` like the harness's Model."""
    folder.mkdir(parents=True, exist_ok=True)
    rel = Path("..") / harness_file.parent.name / harness_file.name
    text = f'''"""Candidate {cid}: {description}
Calls {path} with the harness's arguments (written by magpie optimize)."""

from pathlib import Path

import torch

from engine.loop.harness import load_harness, load_implementation

PATH = {path!r}
_HARNESS = load_harness((Path(__file__).resolve().parent / {str(rel)!r}).resolve())


class ModelNew(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fn = load_implementation(PATH)

    def forward(self, *tensors):
        return self.fn(*tensors, *_HARNESS.SCALARS)


def get_inputs():  # the compare takes every kernel's inputs from the baseline's harness
    return _HARNESS.get_inputs()


def get_init_inputs():
    return []
'''
    out = folder / f"{cid}.py"
    out.write_text(text, encoding="utf-8")
    return out


def harness_tolerances(harness_file: Path) -> tuple[Optional[float], Optional[float]]:
    """RTOL and ATOL as the (possibly edited) harness declares them: read from its source where
    each is set once, at the top, to a number or None (as written), without running the module,
    whose import of torch takes seconds in the loop's process; else as the loaded module has them."""
    declared = _declared_tolerances(harness_file)
    if declared is not None:
        return declared
    module = load_harness(harness_file.resolve())
    return getattr(module, "RTOL", None), getattr(module, "ATOL", None)


_TOLERANCES = ("RTOL", "ATOL")


def _declared_tolerances(harness_file: Path) -> Optional[tuple[Optional[float], Optional[float]]]:
    """(RTOL, ATOL) when the source assigns each at most once, at module level, a literal number
    or None, and binds neither name anywhere else; None when only running it can tell."""
    import ast
    try:
        tree = ast.parse(harness_file.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return None
    values: dict[str, Any] = {}
    plain: set[int] = set()  # the Name nodes of the plain top-level assignments ``RTOL = <literal>``
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id in _TOLERANCES):
            continue
        name = node.targets[0].id
        try:
            value = ast.literal_eval(node.value)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return None
        if name in values or (value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)))):
            return None
        values[name] = value
        plain.add(id(node.targets[0]))
    for node in ast.walk(tree):  # bound any other way (a second assignment, a loop, an import, global): run it
        if isinstance(node, ast.Name) and node.id in _TOLERANCES and not isinstance(node.ctx, ast.Load) \
                and id(node) not in plain:
            return None
        if isinstance(node, (ast.Global, ast.Nonlocal)) and set(node.names) & set(_TOLERANCES):
            return None
        if isinstance(node, (ast.Import, ast.ImportFrom)) and any(
                (a.asname or a.name) in _TOLERANCES or a.name == "*" for a in node.names):
            return None
    return values.get("RTOL"), values.get("ATOL")
