"""Hand tensors from one harness worker to another without copying them through the parent.

A candidate's outputs (and its inputs after the call) are judged in the reference worker,
a process the candidate's code never runs in. GPU tensors travel as CUDA/HIP IPC handles
(torch's own reduction: the receiver maps the sender's memory and compares on the device);
CPU tensors as a shared file mapping under /dev/shm (one copy, no serialisation).
Descriptors are plain JSON. The sender keeps the tensors alive until the receiver has replied.
"""

from __future__ import annotations

import base64
import os
import pickle
import tempfile
import uuid
from pathlib import Path
from typing import Any


def share_dir() -> Path:
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() and os.access("/dev/shm", os.W_OK) else \
        Path(tempfile.gettempdir())
    return base


def export_tensor(t, files: list[str]) -> dict:
    """A JSON-able descriptor of ``t``; CPU tensors are copied into a shared file recorded in ``files``."""
    import torch
    meta = {"shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", "")}
    if t.device.type == "cpu":
        flat = t.detach().contiguous().reshape(-1)
        if flat.dtype == torch.bool:
            flat = flat.view(torch.uint8)
        path = share_dir() / f"magpie-{os.getpid()}-{uuid.uuid4().hex[:12]}.bin"
        nbytes = flat.numel() * flat.element_size()
        path.write_bytes(b"")
        os.truncate(path, max(nbytes, 1))
        files.append(str(path))
        if flat.numel():
            dst = torch.from_file(str(path), shared=True, size=flat.numel(), dtype=flat.dtype)
            dst.copy_(flat)
            del dst
        return {**meta, "kind": "file", "path": str(path)}
    from torch.multiprocessing.reductions import reduce_tensor
    payload = pickle.dumps(reduce_tensor(t.detach()))
    return {**meta, "kind": "ipc", "payload": base64.b64encode(payload).decode("ascii")}


def import_tensor(desc: dict):
    import torch
    dtype = getattr(torch, desc["dtype"])
    if desc["kind"] == "file":
        numel = 1
        for s in desc["shape"]:
            numel *= int(s)
        stored = torch.uint8 if dtype == torch.bool else dtype
        if numel == 0:
            return torch.empty(desc["shape"], dtype=dtype)
        t = torch.from_file(desc["path"], shared=False, size=numel, dtype=stored)
        if dtype == torch.bool:
            t = t.view(torch.bool)
        return t.reshape(desc["shape"])
    fn, args = pickle.loads(base64.b64decode(desc["payload"]))  # noqa: S301 - from our own worker
    return fn(*args)


def export_tree(obj: Any, files: list[str]) -> Any:
    """Tensors anywhere in lists/tuples/dicts become descriptors; other values stay as they are."""
    import torch
    if isinstance(obj, torch.Tensor):
        return {"__tensor__": export_tensor(obj, files)}
    if isinstance(obj, (list, tuple)):
        return {"__seq__": type(obj).__name__, "items": [export_tree(o, files) for o in obj]}
    if isinstance(obj, dict):
        return {"__dict__": [[k, export_tree(v, files)] for k, v in obj.items()]}
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    return {"__repr__": repr(obj)}


def import_tree(obj: Any) -> Any:
    if isinstance(obj, dict):
        if "__tensor__" in obj:
            return import_tensor(obj["__tensor__"])
        if "__seq__" in obj:
            items = [import_tree(o) for o in obj["items"]]
            return tuple(items) if obj["__seq__"] == "tuple" else items
        if "__dict__" in obj:
            return {k: import_tree(v) for k, v in obj["__dict__"]}
        if "__repr__" in obj:
            return _Opaque(obj["__repr__"])
    return obj


class _Opaque:
    """A value that could not cross processes; equal to another only by its repr."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Opaque) and other.text == self.text

    def __repr__(self) -> str:
        return self.text


def remove_files(files: list[str]) -> None:
    for f in files:
        try:
            os.unlink(f)
        except OSError:
            pass
    files.clear()
