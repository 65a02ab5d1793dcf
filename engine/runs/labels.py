"""What a run is called in every list (the workbench's Runs list and Run screen, the job API, MCP):
one label, fixed when the run is launched.

``run_label`` derives it from the effective config the run records (``config.yaml``): a compare
names its config and baseline, a benchmark its framework and load (a capacity search, a sweep,
repeats); anything else keeps the label of its folder name. The engine writes it into the run's
first events (``submitted`` when a front end launches the run detached, then ``run_started``), so
the label a run shows while it runs, after it ends and after a front end restarts is the same.
Run folders written before the label was recorded get it from their ``config.yaml`` through the
same function (``recorded_run_label``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def run_label(config: Any, folder_label: str) -> str:
    """The label of a run whose effective config is ``config`` (the mapping written to its
    ``config.yaml``) and whose folder is named after ``folder_label``."""
    if not isinstance(config, dict):
        return folder_label
    if isinstance(config.get("benchmark"), dict):
        return _benchmark_label(config["benchmark"], folder_label)
    config_file = config.get("config_file")
    if config_file:
        path = Path(str(config_file))
        name = f"{path.parent.name}/{path.name}" if path.parent.name else path.name
        baseline = (config.get("baseline") or {}).get("id") if isinstance(config.get("baseline"), dict) else None
        return f"{name} · base {baseline}" if baseline else name
    return folder_label


def _benchmark_label(bench: dict, folder_label: str) -> str:
    envs = bench.get("envs") if isinstance(bench.get("envs"), dict) else {}
    client = bench.get("client") if isinstance(bench.get("client"), dict) else {}
    # A capacity search chooses its levels itself: the config's CONC (or rate) is not what ran.
    over = (client.get("capacity_over") or "concurrency") if client.get("find_capacity") else None
    load = " ".join(f"{short}{envs[key]}" for key, short in (("CONC", "c"), ("ISL", "i"), ("OSL", "o"))
                    if envs.get(key) not in (None, "") and not (key == "CONC" and over == "concurrency"))
    if over:
        load = f"capacity {'ramp' if client.get('capacity_mode') == 'ramp' else 'over'} {over} " + load
    sweep = client.get("sweep") if isinstance(client.get("sweep"), dict) else {}
    short = {"concurrency": "c", "input_len": "i", "output_len": "o", "request_rate": "rate"}
    swept = " ".join(f"sweep {short.get(k, k)}{','.join(map(str, v))}" for k, v in sweep.items()
                     if isinstance(v, list))
    repeats = f"x{client['repeats']}" if isinstance(client.get("repeats"), int) and client["repeats"] > 1 else ""
    return " ".join(p for p in (folder_label, load.strip(), swept, repeats) if p)


def recorded_run_label(run_dir: Path, folder_label: str) -> str:
    """The label of a run folder written before runs recorded theirs: ``run_label`` of its
    ``config.yaml`` (read through the one safe YAML path: a FIFO, a huge file or an alias bomb is
    refused, never read), else ``folder_label``. Blocking: a small file read."""
    from engine.config.yamlfile import ConfigError, load_yaml_file
    try:
        config = load_yaml_file(Path(run_dir) / "config.yaml") or {}
    except ConfigError:
        return folder_label
    return run_label(config, folder_label)
