"""Confinement of what a caller's configs name: every path the engine would open resolves inside a
root (after symlinks), and code given by a caller runs only on a server started with
``--allow-commands``.

The tools' own path arguments go through ``Roots.resolve``; this module covers the paths *inside*
what those arguments name: a benchmark config (inline or a file under a root), a batch file's
points, the flags a tool passes on, the files a run folder holds that a tool reads back. Checks
run on the document before the engine loads it (the loader reads a dataset to check it, and its
error would tell what is in a file outside the roots), with ``$VAR`` expanded as the loader
expands it, and again on the effective config once it is prepared.

A built-in server kernel override (``server.kernels``) is code the server imports: one of the
bundled library's kernels (``engine.library.CATALOG``) or the server's own defaults is not the
caller's code; any other value (a module, a ``file.py:function``) in an inline config needs
``--allow-commands``, as ``run_cmd`` and the other command keys do, and a file must in any case
lie under a root.

A docker image is code too: a container runs whatever its image holds. An image the caller names (a
tool's ``docker_image`` argument, or ``docker_image`` in an inline config) runs only on a server
started with ``--allow-commands``, unless it is one of the engine's own images for the effective
config's framework (``engine.bench.docker_launch.IMAGES``, the image the engine would choose for
some GPU arch; an exact match of the name and tag, after ``$VAR`` expansion). Kernel containers
(analyze / compare with environment container) have no image of their own, so any image named there
is the caller's. A config file under a root keeps the trust it has for ``run_cmd``: its image is run
as it is, unless a tool argument replaces it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from engine.mcp.security import AccessRefused, Roots

# Keys of an inline benchmark config that start or change processes; such a config is a command line.
COMMAND_KEYS = ("run_cmd", "server_args", "server_env", "benchmark_script", "envs")
# Tokenizer values that name no file.
_NOT_PATHS = ("", "builtin", "none")


def _text(value: Any) -> str:
    return "" if value is None else str(value).strip()


def _mapping(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def _split_kernel(value: str) -> tuple[str, str]:
    """(module, attribute) of a kernel path, as the server splits it (engine.serve.kernels)."""
    if ":" in value:
        module, _, attr = value.rpartition(":")
    else:
        module, _, attr = value.rpartition(".")
    return module.strip(), attr.strip()


def bundled_kernels() -> frozenset[str]:
    """``module:function`` of every kernel that ships with the engine: the library's catalog, the
    server's Triton defaults and its PyTorch references."""
    from engine.jobs.query import bundled_kernel_paths
    return bundled_kernel_paths()


def engine_images(framework: Optional[str]) -> tuple[str, ...]:
    """The images the engine itself runs ``framework``'s server in (one per GPU arch family), in the
    table's order; none for a framework without one (the built-in server) or for kernels (None)."""
    from engine.jobs.query import server_images
    return tuple(dict.fromkeys(server_images().get(framework or "", {}).values()))


def is_engine_image(image: str, framework: Optional[str]) -> bool:
    return _text(image) in engine_images(framework)


def is_bundled_kernel(value: str) -> bool:
    module, attr = _split_kernel(value)
    return bool(module and attr) and not module.endswith(".py") and f"{module}:{attr}" in bundled_kernels()


class Confinement:
    """The checks of one server: its roots, and whether it runs a caller's code."""

    def __init__(self, roots: Roots, allow_commands: bool) -> None:
        self.roots = roots
        self.allow_commands = allow_commands

    # ------------------------------------------------------------------ paths
    def path(self, value: Any, argument: str) -> Path:
        """A path given by a caller or a config, relative to the first root (the jobs' working
        folder), resolved through links; AccessRefused naming ``argument`` when outside."""
        return self.roots.resolve(str(value), argument)

    def file(self, path: Path, argument: str) -> Path:
        """A file a tool reads back (a report, summary.txt, a CSV): it resolves inside a root, or
        AccessRefused naming it and where it leads."""
        p = Path(path)
        real = p.resolve()
        if not self.roots.contains(real):
            raise AccessRefused(
                f"{argument}: {p} resolves to {real}, outside the allowed roots ({', '.join(map(str, self.roots.roots))})",
                hint="a file of a run folder that links out of the roots is not read; remove the link")
        return real

    def files_under(self, folder: Path, argument: str, names: Optional[Callable[[str], bool]] = None) -> None:
        """Every entry under ``folder`` (links not followed into) resolves inside a root: a link
        in it that points out of the roots is refused by name."""
        for dirpath, dirnames, filenames in os.walk(folder):
            for name in [*dirnames, *filenames]:
                if names is not None and not names(name):
                    continue
                entry = Path(dirpath) / name
                if entry.is_symlink():
                    self.file(entry, argument)

    def named(self, value: Any, argument: str, must_exist: bool = False) -> Optional[Path]:
        """A value that is a name or a local path (a tokenizer, a model, an arch): a path (absolute,
        ``~``, ``./``, ``../``, or anything that exists relative to the first root) must resolve
        inside a root; a plain name that is no file here (a Hugging Face id) passes. With
        ``must_exist``, a path that does not exist here passes too (a model path inside a
        container reads nothing on this machine)."""
        text = _text(value)
        if text.lower() in _NOT_PATHS:
            return None
        p = Path(text).expanduser()
        full = p if p.is_absolute() else self.roots.first / p
        exists = os.path.lexists(full)
        if not (exists or text.startswith(("/", "~", "."))):
            return None
        if must_exist and not exists:
            return None
        return self.path(text, argument)

    # ------------------------------------------------------------------ code
    def kernel_override(self, key: str, value: Any, argument: str, code_rule: bool) -> None:
        """One ``server.kernels`` value: a file must lie under a root; anything but a bundled
        kernel is the caller's code, refused unless commands are allowed (``code_rule``: an
        inline config)."""
        text = _text(value)
        where = f"{argument}.{key}"
        if not text:
            return
        module, _attr = _split_kernel(text)
        if module.endswith(".py"):
            self.path(module, where)
        if code_rule and not self.allow_commands and not is_bundled_kernel(text):
            raise AccessRefused(
                f"{where}: {text!r} is not one of the bundled library kernels; importing it into the server runs "
                "code given by the caller, which this server does not do",
                hint="restart the server with --allow-commands, name a library kernel (engine.library: "
                     "e.g. engine.library.rmsnorm:rmsnorm_triton), or put the config in a file under a root")

    def docker_image(self, image: Any, framework: Optional[str], argument: str) -> None:
        """An image the caller chose: refused unless commands are allowed or it is one of the engine's
        own images for ``framework`` (None: a kernel container, which has none)."""
        text = _text(image)
        if not text or self.allow_commands or is_engine_image(text, framework):
            return
        own = engine_images(framework)
        if own:
            what, leave = (f"not one of the engine's {framework} images",
                           f"leave docker_image unset (the engine picks its {framework} image for the GPU arch: "
                           f"{', '.join(own)}), ")
        else:
            what = (f"an image chosen by the caller (the engine has no image of its own for {framework})" if framework
                    else "an image chosen by the caller (kernel containers have no engine image)")
            leave = ""
        raise AccessRefused(
            f"{argument}: {text!r} is {what}; a container made from it runs code given by the caller, which this "
            "server does not do",
            hint=f"restart the server with --allow-commands, {leave}or put the image in a config file under a root")

    def commands(self, arguments: dict[str, Any]) -> None:
        from engine.mcp.security import require_commands
        require_commands(self.allow_commands, arguments)

    # ------------------------------------------------------------------ benchmark configs
    def benchmark_body(self, body: Any, where: str, inline: bool) -> None:
        """The ``benchmark:`` mapping of a config (``$VAR`` expanded as the loader does): every
        path in it under a root; with ``inline``, command keys and kernel overrides that are
        code need --allow-commands."""
        from engine.jobs.query import expand_env_vars
        if not isinstance(body, dict):
            return
        if inline:
            risky = [k for k in COMMAND_KEYS if body.get(k)]
            if risky:
                self.commands({f"{where}.{k}": body[k] for k in risky})
        body = expand_env_vars(body)
        server, client, profiler = _mapping(body.get("server")), _mapping(body.get("client")), _mapping(body.get("profiler"))
        for key, value in _mapping(server.get("kernels")).items():
            self.kernel_override(str(key), value, f"{where}.server.kernels", inline)
        if _text(client.get("dataset_path")):
            self.path(client["dataset_path"], f"{where}.client.dataset_path")
        self.named(client.get("tokenizer"), f"{where}.client.tokenizer")
        self.named(body.get("model"), f"{where}.model", must_exist=True)
        self.named(body.get("gpu_arch"), f"{where}.gpu_arch")
        self.named(_mapping(profiler.get("tracelens")).get("gpu_arch_config"), f"{where}.profiler.tracelens.gpu_arch_config")
        for field, value in (("hf_cache_path", body.get("hf_cache_path")),
                             ("server_lifecycle.pid_dir", _mapping(body.get("server_lifecycle")).get("pid_dir")),
                             ("profiler.gpu_monitor.pid_dir", _mapping(profiler.get("gpu_monitor")).get("pid_dir"))):
            if _text(value):
                self.path(value, f"{where}.{field}")

    def benchmark_file(self, path: Path, where: str) -> None:
        """A benchmark YAML on disk (already resolved under a root): what it names."""
        from engine.jobs.query import load_located_yaml
        data = load_located_yaml(path).data
        if isinstance(data, dict):
            self.benchmark_body(data.get("benchmark"), f"{where} ({path})", inline=False)

    def flags(self, flags: dict, where: str = "") -> None:
        """The overrides a tool passes on (keyed by ``BenchmarkOverrides``' field names)."""
        prefix = f"{where}." if where else ""
        if _text(flags.get("dataset_path")):
            self.path(flags["dataset_path"], f"{prefix}dataset_path")
        self.named(flags.get("tokenizer"), f"{prefix}tokenizer")
        self.named(flags.get("model"), f"{prefix}model", must_exist=True)
        self.named(flags.get("gpu_arch"), f"{prefix}gpu_arch")

    def batch_file(self, path: Path, where: str) -> None:
        """A batch YAML (magpie benchmark --batch): each point's config under a root, and what it names."""
        from engine.jobs.query import batch_points
        for at, config, flags in batch_points(path, where):
            resolved = self.path(config, at)
            self.benchmark_file(resolved, at)
            self.flags(flags, at)

    def prepared(self, prepared: Any, where: str, image_from: Optional[str] = None) -> None:
        """The effective config(s) of a prepared benchmark (after flags): what they name. With
        ``image_from`` (the argument, or inline config field, it came from) the effective
        ``docker_image`` is the caller's, checked against the effective framework's images."""
        points = getattr(prepared, "prepared", None)
        configs = [p.config for p in points] if points is not None else [prepared.config]
        for i, cfg in enumerate(configs):
            at = f"{where}[point {i}]" if points is not None else where
            self.benchmark_body(cfg.model_dump(by_alias=True), at, inline=False)
            if image_from:
                self.docker_image(cfg.docker_image, cfg.framework, image_from)

    def paths(self, values: Iterable[Any], argument: str) -> list[Path]:
        return [self.path(v, f"{argument}[{i}]") for i, v in enumerate(values)]


__all__ = ["COMMAND_KEYS", "Confinement", "bundled_kernels", "engine_images", "is_bundled_kernel",
           "is_engine_image"]
