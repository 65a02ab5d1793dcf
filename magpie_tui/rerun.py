"""Re-running a finished run with the config it recorded (the Runs list's ``R`` and ``Y``).

A kernel run (analyze/compare) records the kernel config it read (``config_file``), the baseline
it compared against and its kernels: the re-run names the same file, baseline and kernels. A
benchmark run records its whole effective config under ``benchmark:`` (beside ``overrides`` and
``warnings``, which are not config keys): the re-run starts from a copy of that section, so the
overrides it had are part of the config rather than flags.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from engine.runs.catalog import RunInfo
from engine.runs.launch import LaunchRequest

RERUN_FOLDER = ".rerun"  # under the results folder; hidden from the Runs list and the config tree


class RerunError(ValueError):
    """The run folder does not say enough to start it again; the message says what is missing."""


def _recorded_config(info: RunInfo) -> dict:
    path = info.path / "config.yaml"
    try:
        cfg = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise RerunError(f"{path}: cannot read the recorded config ({exc.strerror or exc})") from exc
    except yaml.YAMLError as exc:
        raise RerunError(f"{path}: not valid YAML ({exc})") from exc
    if not isinstance(cfg, dict):
        raise RerunError(f"{path}: expected a mapping, the run's recorded config")
    return cfg


def rerun_config_path(info: RunInfo, output_dir: Path) -> Path:
    return Path(output_dir) / RERUN_FOLDER / f"{info.name}.yaml"


def rerun_request(info: RunInfo, output_dir: Path, write: bool = True) -> LaunchRequest:
    """The launch that repeats ``info``. ``write=False`` only builds it (for the command line
    shown before asking); with ``write=True`` a benchmark's config copy is written first."""
    from magpie_tui.screens.reports import resolve_config_file
    if info.mode not in ("analyze", "compare", "benchmark"):
        raise RerunError(f"{info.name}: a {info.mode} run cannot be re-run from here (analyze, compare or "
                         "benchmark runs can)")
    cfg = _recorded_config(info)
    if info.mode == "benchmark":
        bench = cfg.get("benchmark")
        if not isinstance(bench, dict):
            raise RerunError(f"{info.path / 'config.yaml'}: no 'benchmark' section to run again")
        target = rerun_config_path(info, output_dir)
        if write:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(yaml.safe_dump({"benchmark": bench}, sort_keys=False), encoding="utf-8")
        return LaunchRequest("benchmark", target, output_dir)
    config = resolve_config_file(info.path, cfg.get("config_file"))
    if config is None:
        raise RerunError(f"{info.path / 'config.yaml'}: config_file {cfg.get('config_file')!r} is missing or "
                         "no longer exists; start it from the Configs screen instead")
    baseline = cfg.get("baseline") if isinstance(cfg.get("baseline"), dict) else {}
    baseline_id = baseline.get("id") if info.mode == "compare" else None
    kernels = [str(k.get("id")) for k in cfg.get("kernels") or [] if isinstance(k, dict) and k.get("id")]
    only = [k for k in kernels if k != baseline_id] or None
    repeats = (cfg.get("settings") or {}).get("repeats") if isinstance(cfg.get("settings"), dict) else None
    return LaunchRequest(info.mode, config, output_dir, repeats=repeats, baseline=baseline_id, only=only)
