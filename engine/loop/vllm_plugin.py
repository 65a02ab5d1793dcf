"""A loop winner integrated into vLLM through an out-of-tree (OOT) plugin (issue 13 step 6).

vLLM's layers are ``CustomOp`` subclasses, and ``CustomOp.__new__`` instantiates the class that
``CustomOp.register_oot`` registered under the in-tree class's name in place of that class
(``vllm/model_executor/custom_op.py``: ``op_registry_oot``, keyed by ``cls.__name__``). A plugin's
``register()`` does that registration; vLLM calls every ``vllm.general_plugins`` entry point in each
of its processes (API server, engine core, workers) before the model is built
(``vllm/plugins/__init__.py``: ``load_general_plugins``; ``VLLM_PLUGINS`` unset loads every plugin
of a group, set it loads only the comma-listed entry-point names, in every plugin group).

``write_vllm_plugin`` writes a small installable package for one registry op:

* ``rmsnorm``  -> ``vllm.model_executor.layers.layernorm.RMSNorm``, both forms:
  ``forward(x)`` and the fused residual form ``forward(x, residual)``, which adds the residual
  first and returns ``(normed, x + residual)`` as vLLM's ``fused_add_rms_norm`` does. An RMSNorm
  with ``var_hidden_size`` (variance over part of the row) keeps vLLM's implementation.
* ``activation`` -> ``vllm.model_executor.layers.activation.SiluAndMul``.
* ``rotary`` -> ``vllm.model_executor.layers.rotary_embedding.RotaryEmbedding`` and its subclasses
  that only change the cos/sin cache (Llama-3, linear/NTK/YaRN scaling, ...: none redefines a
  forward), for instances with ``is_neox_style`` and ``rotary_dim == head_size``; any other
  instance keeps vLLM's own implementation and the log says so. The winner gets the instance's own
  cos/sin cache in float32 (the registry's contract), q and k as ``[T, heads, head_size]``.
* ``attention`` / ``decode_attention``: refused. vLLM's ``Attention`` layer is a plain
  ``nn.Module`` that calls the attention backend the platform selects (with its KV-cache layout and
  metadata), not a ``CustomOp``: there is no class to replace.

The OOT class subclasses the in-tree class (so vLLM's ``__init__``, weights and buffers are
untouched) and routes every ``forward_*`` dispatch target that vLLM's ``CustomOp`` defines
(``forward_native``, ``forward_cuda``, ``forward_hip``, ``forward_cpu``, ``forward_xpu``,
``forward_tpu``, ``forward_oot`` in 0.32) to the winner, so the platform and the
``compilation_config.custom_ops`` setting cannot pick vLLM's kernel instead. A winner given by
file is copied into the package (self-contained); a dotted one is imported by name, from the
folder its top-level package lives in here (added to the server's PYTHONPATH) unless that is a
site-packages folder. ``register()`` imports the winner at once and raises if it cannot: vLLM
calls it outside any ``try``, so the server does not start, rather than serving vLLM's own op
under the winner's name. It prints ``magpie OOT: RMSNorm -> <winner>`` to stderr (the server log)
in each vLLM process that loads it.

``install_vllm_plugin`` installs the package with ``pip install --target`` into a folder of its
own, with the server's Python (no dependencies, no index, no build isolation): the user's
environment is not modified; the plugin is visible only to a server whose PYTHONPATH names that
folder (entry points are found in dist-info folders on ``sys.path``). ``integrate_vllm`` is the
loop's integrate step for ``framework: vllm``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Optional

from engine.errors import MagpieError

PLUGIN_GROUP = "vllm.general_plugins"
# Registry op -> the vLLM class it replaces (vLLM 0.32's module paths).
VLLM_CLASSES = {
    "rmsnorm": ("vllm.model_executor.layers.layernorm", "RMSNorm"),
    "activation": ("vllm.model_executor.layers.activation", "SiluAndMul"),
    "rotary": ("vllm.model_executor.layers.rotary_embedding", "RotaryEmbedding"),
}
NOT_A_CUSTOM_OP = (
    "vLLM's attention is not a CustomOp: its Attention layer is a plain nn.Module that calls the attention "
    "backend the platform selects (FlashAttention, Triton, the CPU backend ...) with that backend's KV-cache layout "
    "and metadata, so there is no class that CustomOp.register_oot could replace; a varlen attention winner would "
    "have to become a vLLM attention backend")
WINNER_MODULE = "_winner"
_PIP_VARS_DROPPED = ("PYTHONPATH", "PIP_USER", "PIP_PREFIX", "PIP_ROOT", "PIP_TARGET", "PIP_REQUIRE_VIRTUALENV")


class VllmPluginError(MagpieError):
    """The winner cannot be integrated into vLLM as an out-of-tree plugin."""

    title = "vLLM plugin"


def plugin_name(op: str) -> str:
    """The entry-point name (what VLLM_PLUGINS lists) and the package name of ``op``'s plugin."""
    return f"magpie_oot_{op}"


def distribution_name(op: str) -> str:
    return f"magpie-vllm-oot-{op.replace('_', '-')}"


def _split_winner(winner_path: str) -> tuple[str, str]:
    """(module or file, function) of ``package.module:function``, ``package.module.function`` or
    ``/path/file.py:function``: the forms ``engine.serve.kernels.import_kernel`` accepts."""
    path = winner_path.strip()
    module, _, attr = path.rpartition(":") if ":" in path else path.rpartition(".")
    if not module or not attr:
        raise VllmPluginError(f"{winner_path!r} is not a kernel path (expected 'package.module:function', "
                              "'package.module.function' or '/path/file.py:function')")
    return module, attr


def _import_root(module: str) -> tuple[list[str], Optional[str]]:
    """Folders the server's PYTHONPATH needs for ``import module`` (the folder holding its top-level
    package as found here), and a note when none is added."""
    top = module.split(".")[0]
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        spec = None
    origin = None
    if spec is not None and spec.submodule_search_locations:
        origin = Path(list(spec.submodule_search_locations)[0])
    elif spec is not None and spec.origin and spec.origin not in ("built-in", "frozen"):
        origin = Path(spec.origin)
    if origin is None:
        return [], f"{top} is not importable here: the server's Python must import {module} by itself"
    root = origin.resolve().parent
    if root.name in ("site-packages", "dist-packages"):
        return [], f"{top} is installed in {root}: the server's Python must have it installed too"
    return [str(root)], None


def write_vllm_plugin(folder: Path | str, op: str, winner_path: str) -> dict:
    """Write the plugin package for registry op ``op`` with the winner at ``winner_path`` into
    ``folder`` (created; emptied of an earlier plugin). Returns what was written: name, entry point,
    vLLM class, the import the plugin makes, the files (relative to ``folder``), and ``pythonpath``
    (folders a dotted winner needs on the server's PYTHONPATH)."""
    if op in ("attention", "decode_attention"):
        raise VllmPluginError(f"kernels.{op} cannot be integrated into vLLM: {NOT_A_CUSTOM_OP}",
                              hint="integrate rmsnorm, activation or rotary winners into vLLM, or benchmark "
                                   "the built-in server (framework: builtin) for attention")
    if op not in VLLM_CLASSES:
        raise VllmPluginError(f"kernels.{op}: no vLLM class corresponds to this registry op "
                              f"(integrable: {', '.join(VLLM_CLASSES)})")
    module, attr = _split_winner(winner_path)
    folder = Path(folder)
    name = plugin_name(op)
    package = folder / name
    if package.exists():
        shutil.rmtree(package)
    package.mkdir(parents=True)
    pythonpath: list[str] = []
    note = None
    if module.endswith(".py"):
        src = Path(module).expanduser().resolve()
        if not src.is_file():
            raise VllmPluginError(f"the winner's file {src} does not exist ({winner_path!r})")
        shutil.copyfile(src, package / f"{WINNER_MODULE}.py")
        import_path = f".{WINNER_MODULE}:{attr}"
    else:
        pythonpath, note = _import_root(module)
        import_path = f"{module}:{attr}"
    vllm_module, vllm_class = VLLM_CLASSES[op]
    header = (f'"""magpie optimize: vLLM\'s {vllm_class} replaced by the winner for registry op `{op}`.\n\n'
              "The winner is WINNER below. Generated by engine/loop/vllm_plugin.py; see its docstring.\n\"\"\"\n\n"
              "import importlib\nimport sys\n\n"
              f"OP = {op!r}\nWINNER = {winner_path!r}\nIMPORT = {import_path!r}\n"
              f"VLLM_MODULE = {vllm_module!r}\nVLLM_CLASS = {vllm_class!r}\n")
    (package / "__init__.py").write_text(header + _REGISTER_MODULE, encoding="utf-8")
    (folder / "pyproject.toml").write_text(_PYPROJECT.format(dist=distribution_name(op), name=name, op=op,
                                                             group=PLUGIN_GROUP), encoding="utf-8")
    files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()
                   and "__pycache__" not in p.parts and (p.parent == folder or package in p.parents))
    return {"name": name, "distribution": distribution_name(op), "entry_point": f"{name} = {name}:register",
            "group": PLUGIN_GROUP, "op": op, "vllm_class": f"{vllm_module}.{vllm_class}", "winner": winner_path,
            "import": import_path, "winner_copied": module.endswith(".py"), "files": files,
            "pythonpath": pythonpath, "note": note}


def vllm_python(path: Optional[str] = None) -> str:
    """The interpreter of the ``vllm`` console script on ``path`` (default: this PATH): the
    server's Python, as the local launcher finds it (``engine.bench.launch._script_python``)."""
    from engine.bench.launch import _script_python
    script = shutil.which("vllm", path=path if path is not None else os.environ.get("PATH"))
    if script is None:
        raise VllmPluginError("no `vllm` console script on PATH: cannot tell which Python runs the vLLM server",
                              hint="put the environment that has vLLM first on PATH (e.g. activate its venv)")
    python = _script_python(script)
    if python is None:
        raise VllmPluginError(f"{script} names no runnable interpreter on its #! line")
    return python


def _clean_env(pythonpath: Optional[str] = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _PIP_VARS_DROPPED}
    env.update({"PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1", "PYTHONNOUSERSITE": "1"})
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return env


def install_vllm_plugin(python: str, plugin_dir: Path | str, site_dir: Path | str, timeout_s: float = 600.0) -> dict:
    """``python -m pip install --no-deps --no-build-isolation --no-index --upgrade --target site_dir
    plugin_dir``: the plugin and its dist-info (with the entry point) land in ``site_dir`` only.
    Returns the command, the dist-info folder and its entry_points.txt."""
    plugin_dir, site_dir = Path(plugin_dir).resolve(), Path(site_dir).resolve()
    site_dir.mkdir(parents=True, exist_ok=True)
    argv = [python, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index", "--upgrade",
            "--target", str(site_dir), str(plugin_dir)]
    with tempfile.TemporaryDirectory(prefix="magpie-vllm-plugin-") as tmp:
        # Built from a copy: setuptools leaves build/ and *.egg-info in the tree it builds.
        src = Path(tmp) / plugin_dir.name
        shutil.copytree(plugin_dir, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
        try:
            r = subprocess.run([*argv[:-1], str(src)], capture_output=True, text=True, timeout=timeout_s,
                               env=_clean_env(), stdin=subprocess.DEVNULL, cwd=tmp)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise VllmPluginError(f"installing the plugin failed: `{' '.join(argv)}`: {exc}") from None
    if r.returncode != 0:
        raise VllmPluginError(f"installing the plugin failed (exit {r.returncode}): `{' '.join(argv)}`\n"
                              f"{(r.stdout + r.stderr)[-3000:]}",
                              hint="the server's Python needs pip and setuptools (no build isolation, no index)")
    infos = sorted(site_dir.glob("*.dist-info"))
    found = [(i, (i / "entry_points.txt").read_text(encoding="utf-8")) for i in infos
             if (i / "entry_points.txt").is_file() and f"[{PLUGIN_GROUP}]" in (i / "entry_points.txt").read_text()]
    if not found:
        raise VllmPluginError(f"pip installed no dist-info with a [{PLUGIN_GROUP}] entry point into {site_dir}")
    info, entry_points = found[-1]
    return {"argv": argv, "dist_info": str(info), "entry_points": entry_points}


_CHECK = """
import importlib, importlib.metadata as md, json, sys
name = sys.argv[1]
eps = [e for e in md.entry_points(group=sys.argv[2]) if e.name == name]
if not eps:
    sys.exit(f"no entry point {name} in group {sys.argv[2]} on sys.path")
module = importlib.import_module(eps[0].module)
fn = module.load_winner()
print(json.dumps({"entry_point": eps[0].value, "module_file": module.__file__, "winner": repr(fn)}))
"""


def check_vllm_plugin(python: str, pythonpath: str, name: str, timeout_s: float = 300.0) -> dict:
    """In the server's Python with ``pythonpath``: the entry point is found and the plugin imports
    its winner (without vLLM: the same import ``register()`` makes first). Fails here rather than
    at the server's start."""
    try:
        r = subprocess.run([python, "-c", _CHECK, name, PLUGIN_GROUP], capture_output=True, text=True,
                           timeout=timeout_s, env=_clean_env(pythonpath), stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise VllmPluginError(f"checking the plugin with {python} failed: {exc}") from None
    if r.returncode != 0:
        raise VllmPluginError(f"the server's Python ({python}, PYTHONPATH={pythonpath}) cannot load plugin {name}: "
                              f"{(r.stdout + r.stderr)[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def integrate_vllm(raw: dict, op: str, winner_path: str, folder: Path,
                   log: Any = lambda s: None) -> tuple[dict, list[dict], dict]:
    """The loop's integrate step for ``framework: vllm``: the plugin in ``folder/vllm_plugin``,
    installed into ``folder/site`` with the server's Python, and the integrated config = ``raw``
    (the clean YAML's data) with ``benchmark.server_env`` extended by PYTHONPATH (the site folder,
    the dotted winner's import root, then the clean server's: its server_env's, else this
    environment's, which it inherits) and, where the clean run's plugins were
    restricted by VLLM_PLUGINS (in its server_env or this environment), that list plus this plugin.
    Unset, VLLM_PLUGINS stays unset: vLLM then loads every installed plugin, as in the clean run,
    and this one with them; setting it to this plugin alone would drop the others (platform
    plugins included) from the re-benchmark. Returns (integrated data, changed fields, details)."""
    bench = raw.get("benchmark") or {}
    if str(bench.get("run_mode") or "local").strip().lower() == "docker":
        raise VllmPluginError("run_mode docker: the plugin is installed on this host, where the server's container "
                              "cannot see it", hint="run the loop's vLLM benchmark with run_mode: local")
    if (bench.get("client") or {}).get("base_url"):
        raise VllmPluginError("client.base_url: the benchmark measures a server it does not start, so the "
                              "re-benchmark could not load the plugin into it", hint="let magpie start the server")
    clean_env = {str(k): str(v) for k, v in (bench.get("server_env") or {}).items()}
    python = vllm_python(clean_env.get("PATH"))
    plugin_dir, site = folder / "vllm_plugin", folder / "site"
    for d in (plugin_dir, site):
        if d.exists():
            shutil.rmtree(d)
    plugin = write_vllm_plugin(plugin_dir, op, winner_path)
    install = install_vllm_plugin(python, plugin_dir, site)
    # The clean server's PYTHONPATH (its server_env's, else the one it inherits from here) goes last.
    inherited = clean_env.get("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    parts = [str(site.resolve()), *plugin["pythonpath"], *inherited.split(os.pathsep)]
    new_env = {"PYTHONPATH": os.pathsep.join(dict.fromkeys(p for p in parts if p))}
    restriction = clean_env.get("VLLM_PLUGINS", os.environ.get("VLLM_PLUGINS"))
    if restriction is not None:
        names = [n for n in restriction.split(",") if n]
        new_env["VLLM_PLUGINS"] = ",".join(names + ([plugin["name"]] if plugin["name"] not in names else []))
    check = check_vllm_plugin(python, new_env["PYTHONPATH"], plugin["name"])
    integrated = json.loads(json.dumps(raw))  # a deep copy of plain YAML data
    integrated["benchmark"]["server_env"] = {**clean_env, **new_env}
    changed = [{"field": f"benchmark.server_env.{k}", "clean": clean_env.get(k), "integrated": v}
               for k, v in new_env.items() if clean_env.get(k) != v]
    log(f"magpie optimize: kernels.{op} = {winner_path} goes into vLLM as plugin {plugin['name']} "
        f"({plugin['vllm_class']}), installed into {site} with {python}")
    if plugin["note"]:
        log(f"magpie optimize: note: {plugin['note']}")
    details = {"plugin": {**plugin, "dir": str(plugin_dir), "dist_info": install["dist_info"],
                          "entry_points": install["entry_points"]},
               "site": str(site), "server_python": python, "install_argv": install["argv"], "check": check,
               "vllm_plugins": ("VLLM_PLUGINS was unset in the clean run: left unset (vLLM loads every plugin it "
                                "finds, this one with them)") if restriction is None else
                               f"the clean run's VLLM_PLUGINS {restriction!r} plus {plugin['name']}"}
    return integrated, changed, details


_PYPROJECT = """\
# The out-of-tree vLLM plugin for registry op {op}, written by magpie optimize.
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "{dist}"
version = "0.1.0"
description = "magpie optimize: a loop winner replacing vLLM's op for registry op {op}"
requires-python = ">=3.9"

[project.entry-points."{group}"]
{name} = "{name}:register"

[tool.setuptools]
packages = ["{name}"]
"""

# The body of the generated module, after its constants (OP, WINNER, IMPORT, VLLM_MODULE,
# VLLM_CLASS). It imports nothing outside the standard library at import time: vLLM, torch and the
# winner are imported by register().
_REGISTER_MODULE = '''
_registered = False
_said = set()


def _log(message):
    print(f"magpie OOT: {message}", file=sys.stderr, flush=True)


def _log_once(message):
    if message not in _said:
        _said.add(message)
        _log(message)


def load_winner():
    """The winner's function; a relative module is one of this package (a winner given by file)."""
    module_name, _, attr = IMPORT.rpartition(":")
    fn = importlib.import_module(module_name, package=__name__)
    for part in attr.split("."):
        fn = getattr(fn, part)
    if not callable(fn):
        raise TypeError(f"{WINNER} is a {type(fn).__name__}, not a function")
    return fn


# ------------------------------------------------------------------ the calls, in the registry's shapes
def rmsnorm_forward(fn, x, residual, weight, eps):
    """vLLM's RMSNorm.forward(x[, residual]): with a residual, x + residual is normalized and is also
    the new residual (vLLM's fused_add_rms_norm), and both are returned."""
    if residual is not None:
        x = x + residual
        residual = x
    shape = x.shape
    out = fn(x.reshape(-1, shape[-1]), weight, eps).reshape(shape)
    return out if residual is None else (out, residual)


def activation_forward(fn, x):
    """vLLM's SiluAndMul.forward(x[..., 2d]) -> [..., d]."""
    shape = x.shape
    return fn(x.reshape(-1, shape[-1])).reshape(*shape[:-1], shape[-1] // 2)


def rotary_forward(fn, positions, query, key, head_size, cos_sin_cache):
    """vLLM's RotaryEmbedding.forward(positions, query[T, Hq*D], key[T, Hkv*D]) -> (query, key)."""
    positions = positions.flatten()
    tokens = positions.shape[0]
    q, k = fn(positions, query.reshape(tokens, -1, head_size), key.reshape(tokens, -1, head_size), cos_sin_cache)
    return q.reshape(query.shape), k.reshape(key.shape)


# ------------------------------------------------------------------ the OOT classes
def _custom_op_base(base):
    for klass in base.__mro__:
        if klass.__name__ == "CustomOp":
            return klass
    raise TypeError(f"{base.__module__}.{base.__name__} is not a vLLM CustomOp")


def dispatch_names(base):
    """Every forward_* method vLLM's CustomOp may dispatch to (forward_native, forward_cuda, ...)."""
    return sorted(n for n, v in vars(_custom_op_base(base)).items() if n.startswith("forward_") and callable(v))


def oot_class(base, forward, usable):
    """A subclass of vLLM's ``base`` (its __init__, weights and buffers unchanged) whose every
    dispatch target runs ``forward(self, ...)``, unless ``usable(self)`` said no at construction:
    then that instance keeps vLLM's own methods."""
    holder = []

    def route(name):
        def method(self, *args, **kwargs):
            if self._magpie_ok:
                return forward(self, *args, **kwargs)
            return getattr(super(holder[0], self), name)(*args, **kwargs)
        method.__name__ = method.__qualname__ = name
        return method

    def __init__(self, *args, **kwargs):
        base.__init__(self, *args, **kwargs)
        self._magpie_ok = bool(usable(self))
        if self._magpie_ok:  # once per class and process: the model really holds the replacement
            _log_once(f"vLLM built {holder[0].__name__} in place of {base.__name__}: its forward runs {WINNER}")

    attrs = {name: route(name) for name in dispatch_names(base)}
    attrs.update(__init__=__init__, __module__=__name__, magpie_winner=WINNER)
    cls = type(f"Magpie{base.__name__}", (base,), attrs)
    holder.append(cls)
    return cls


def _rmsnorm(fn, base):
    def forward(self, x, residual=None):
        return rmsnorm_forward(fn, x, residual, self.weight, self.variance_epsilon)

    def usable(self):
        if getattr(self, "variance_size_override", None) is not None:
            _log_once(f"{base.__name__} with var_hidden_size {self.variance_size_override} (variance over part "
                      f"of the row): vLLM's own implementation kept for it")
            return False
        return True
    return [oot_class(base, forward, usable)]


def _activation(fn, base):
    def forward(self, x):
        return activation_forward(fn, x)
    return [oot_class(base, forward, lambda self: True)]


def _cache_only_subclasses(base):
    """``base`` and its subclasses (loaded now) that only change the cos/sin cache: none of the
    classes between them and ``base`` defines forward, forward_static or a dispatch target."""
    names = set(dispatch_names(base)) | {"forward", "forward_static"}
    out, todo = [base], list(base.__subclasses__())
    while todo:
        sub = todo.pop(0)
        todo.extend(sub.__subclasses__())
        between = sub.__mro__[:sub.__mro__.index(base)]
        if sub.__name__.startswith("Magpie") or any(names & set(vars(k)) for k in between):
            continue
        out.append(sub)
    return out


def _rotary(fn, base):
    import torch

    def forward(self, positions, query, key=None):
        cache = self._magpie_cos_sin
        if cache.device != query.device:
            cache = cache.to(query.device)
        if key is None:  # no key (cross-layer KV sharing): vLLM's own math for this call
            return self.forward_static(positions, query, None, self.head_size, self.rotary_dim,
                                       cache.to(query.dtype), self.is_neox_style)
        return rotary_forward(fn, positions, query, key, self.head_size, cache)

    def usable(self):
        kind = type(self).__mro__[1].__name__
        if not self.is_neox_style or self.rotary_dim != self.head_size or not hasattr(self, "cos_sin_cache"):
            _log_once(f"{kind}(head_size={self.head_size}, rotary_dim={self.rotary_dim}, "
                      f"is_neox_style={self.is_neox_style}): the winner takes NeoX-style rotation of the whole head "
                      f"only; vLLM's own implementation kept for it")
            return False
        self.register_buffer("_magpie_cos_sin", self.cos_sin_cache.to(torch.float32), persistent=False)
        return True
    return [oot_class(klass, forward, usable) for klass in _cache_only_subclasses(base)]


_BUILDERS = {"rmsnorm": _rmsnorm, "activation": _activation, "rotary": _rotary}


def register():
    """vLLM's general-plugin entry point: register the OOT class(es), once per process."""
    global _registered
    if _registered:
        return
    fn = load_winner()  # a winner that does not import stops the server's start here
    base = getattr(importlib.import_module(VLLM_MODULE), VLLM_CLASS)
    registry = importlib.import_module(_custom_op_base(base).__module__).op_registry_oot
    classes = _BUILDERS[OP](fn, base)
    for cls in classes:
        name = cls.__mro__[1].__name__
        if name in registry:
            raise RuntimeError(f"magpie OOT: vLLM already has an out-of-tree {name} ({registry[name]}); "
                               f"cannot register {WINNER} for it")
        cls.__mro__[1].register_oot(cls, name=name)
    _registered = True
    replaced = ", ".join(c.__mro__[1].__name__ for c in classes)
    _log(f"{replaced} -> {WINNER} (dispatch: {', '.join(dispatch_names(base))})")
'''
