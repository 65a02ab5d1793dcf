"""Build small torch-profiler-shaped traces in tests: cpu_op -> cudaLaunchKernel -> GPU event,
linked by correlation and an ac2g flow pair, exactly as Kineto writes them."""

import gzip
import json
from pathlib import Path


class TraceBuilder:
    def __init__(self, cpu=(100, 100), device=0):
        self.events = [{"ph": "M", "name": "process_name", "pid": cpu[0], "tid": 0, "args": {"name": "python3"}},
                       {"ph": "M", "name": "thread_name", "pid": cpu[0], "tid": cpu[1], "args": {"name": "main"}}]
        self.cpu = cpu
        self.device = device
        self.corr = 1
        self.ext = 1

    def op(self, name, ts, dur, dims=None, types=None, parent_ts=None):
        args = {"External id": self.ext}
        if dims is not None:
            args.update({"Input Dims": dims, "Input type": types or ["float"] * len(dims),
                         "Input Strides": [[] for _ in dims], "Concrete Inputs": [""] * len(dims)})
        self.ext += 1
        self.events.append({"ph": "X", "cat": "cpu_op", "name": name, "pid": self.cpu[0], "tid": self.cpu[1],
                            "ts": ts, "dur": dur, "args": args})
        return self.ext - 1

    def launch(self, ts, kernel, gpu_ts, gpu_dur, stream=7, cat="kernel", runtime="cudaLaunchKernel", ext=None,
               flows=True, dur=3.0):
        c = self.corr
        self.corr += 1
        self.events.append({"ph": "X", "cat": "cuda_runtime", "name": runtime, "pid": self.cpu[0],
                            "tid": self.cpu[1], "ts": ts, "dur": dur, "args": {"correlation": c, "External id": ext}})
        gpu_args = {"correlation": c, "stream": stream, "device": self.device}
        if ext is not None:
            gpu_args["External id"] = ext
        self.events.append({"ph": "X", "cat": cat, "name": kernel, "pid": self.device, "tid": stream,
                            "ts": gpu_ts, "dur": gpu_dur, "args": gpu_args})
        if flows:
            self.events.append({"ph": "s", "cat": "ac2g", "name": "ac2g", "id": c, "pid": self.cpu[0],
                                "tid": self.cpu[1], "ts": ts})
            self.events.append({"ph": "f", "cat": "ac2g", "name": "ac2g", "id": c, "pid": self.device,
                                "tid": stream, "ts": gpu_ts, "bp": "e"})
        return c

    def annotation(self, name, ts, dur):
        self.events.append({"ph": "X", "cat": "user_annotation", "name": name, "pid": self.cpu[0],
                            "tid": self.cpu[1], "ts": ts, "dur": dur, "args": {}})

    def op_with_kernel(self, name, ts, kernel, gpu_ts, gpu_dur, dims=None, stream=7, op_dur=10.0):
        ext = self.op(name, ts, op_dur, dims)
        self.launch(ts + 1.0, kernel, gpu_ts, gpu_dur, stream=stream, ext=ext)
        return ext

    def write(self, path: Path, **meta) -> Path:
        doc = {"schemaVersion": 1, **meta, "traceEvents": self.events}
        path = Path(path)
        if path.suffix == ".gz":
            with gzip.open(path, "wt") as fh:
                json.dump(doc, fh)
        else:
            path.write_text(json.dumps(doc))
        return path
