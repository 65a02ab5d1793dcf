"""The benchmark overrides: one typed model that every front end fills in.

``BenchmarkOverrides`` is the set of values that replace a benchmark YAML's own (None: keep the
YAML's). Each field says once what it is: its type, its help text, the command-line flag it is
given by, the MCP tool argument it is given by, and where in ``benchmark:`` it lands. The
command line's flags are generated from it (``add_cli_flags``), the MCP benchmark tool and the
workbench's launch form are checked against it (tests/unit/test_overrides.py), and a key it
does not have is an error that names the nearest one::

    BenchmarkOverrides.build({"concurency": 64})
    # ConfigError: flags: concurency: unknown override; did you mean concurrency?

The values keep their type from the front end to the run: ``concurrency`` is an int here, and
only becomes Magpie's ``envs.CONC`` string inside the effective config, where Magpie's YAML keeps
it (``config_value``); a YAML's own ``envs.CONC: "32"`` is read as before.

The command line's item syntaxes live here too (``parse_sweep``: ``KEY=V1,V2``;
``parse_goodput``: ``KEY:MS``), so the CLI and the MCP server read them the same way without
importing each other.
"""

from __future__ import annotations

import argparse
import difflib
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Mapping, Optional, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, field_validator

from engine.config.yamlfile import ConfigError


@dataclass(frozen=True)
class Override:
    """How one override is given and where it lands (``Annotated`` metadata of a field)."""
    config: str  # its place under benchmark: (envs.X: one of Magpie's environment strings)
    help: str  # the command line's help text
    short: Optional[str] = None  # e.g. -m
    dest: Optional[str] = None  # the argparse dest where a global option already has the name
    mcp: Optional[str] = None  # the MCP tool's argument name where it differs (Magpie's MCP names)
    choices: Optional[tuple[str, ...]] = None  # command-line choices, when not the type's own
    metavar: Optional[str] = None
    items: Optional[Literal["sweep", "slo"]] = None  # KEY=V1,V2 items (repeatable) / KEY:MS items
    off: Optional[str] = None  # a boolean's --no-... flag, its help text
    cli: bool = True  # False: the command line declares it in another group (gpu_arch: the trace flags)
    form: bool = False  # one of the common overrides the workbench's launch form offers

    def flag(self, name: str) -> str:
        return "--" + name.replace("_", "-")


_SLO = "KEY:MS"


class BenchmarkOverrides(BaseModel):
    """What replaces a benchmark YAML's values, from any front end. None: not given."""
    model_config = ConfigDict(extra="forbid", frozen=True)

    model: Annotated[Optional[str], Override("model", "model (HF id or local path; builtin: ignored, see server.size)",
                                      short="-m")] = None
    precision: Annotated[Optional[str], Override("precision", "precision label (fp8, bf16, ...)", short="-p")] = None
    tp: Annotated[Optional[int], Override("envs.TP", "tensor parallel size (envs.TP)")] = None
    concurrency: Annotated[Optional[int], Override("envs.CONC", "client max concurrency (envs.CONC)", form=True)] = None
    input_len: Annotated[Optional[int], Override("envs.ISL", "input tokens per request (envs.ISL)", form=True)] = None
    output_len: Annotated[Optional[int], Override("envs.OSL", "output tokens per request (envs.OSL)", form=True)] = None
    num_prompts: Annotated[Optional[int], Override("envs.NUM_PROMPTS",
                                            "requests per run (envs.NUM_PROMPTS; default CONC x 10)", form=True)] = None
    request_rate: Annotated[Optional[float], Override("client.request_rate", "requests/s (default: all at once)")] = None
    burstiness: Annotated[Optional[float], Override("client.burstiness", "gamma shape of arrivals (1 = Poisson)")] = None
    range_ratio: Annotated[Optional[float], Override(
        "envs.RANDOM_RANGE_RATIO", "Magpie's RANDOM_RANGE_RATIO r in [0, 1]: lengths drawn from [L*r, L] as Magpie's "
        "InferenceX client draws them (1 = fixed lengths; default 0.5, as in Magpie)")] = None
    vllm_range_ratio: Annotated[Optional[float], Override(
        "client.vllm_range_ratio", "vllm bench serve's --random-range-ratio r in [0, 1): lengths drawn from "
        "[L*(1-r), L*(1+r)] (client.vllm_range_ratio; replaces --range-ratio)")] = None
    warmup: Annotated[Optional[int], Override("client.warmup", "warm-up requests, not measured", form=True)] = None
    repeats: Annotated[Optional[int], Override("client.repeats",
                                        "measured runs; metrics get a 95%% interval across them", form=True)] = None
    sweep: Annotated[Optional[dict[str, list[Union[int, float]]]], Override(
        "client.sweep", "KEY=V1,V2,... (concurrency, input_len, output_len, request_rate)", items="sweep")] = None
    base_url: Annotated[Optional[str], Override("client.base_url", "benchmark a server that is already running")] = None
    seed: Annotated[Optional[int], Override("client.seed", "dataset and arrival seed", form=True)] = None
    goodput: Annotated[Optional[dict[str, float]], Override(
        "client.goodput", "SLOs for goodput, as vllm bench serve takes them: ttft:MS tpot:MS e2el:MS",
        items="slo")] = None
    prefix_len: Annotated[Optional[int], Override("client.prefix_len", "tokens of a prefix shared by every prompt, before "
                                           "its input-len tokens (vLLM's --random-prefix-len; default 0)")] = None
    endpoint: Annotated[Optional[Literal["completions", "chat"]], Override(
        "client.endpoint", "the API the load uses (default completions; chat needs text prompts: --tokenizer)")] = None
    tokenizer: Annotated[Optional[str], Override(
        "client.tokenizer", "text prompts through this tokenizer (Hugging Face name or folder, or 'builtin'), as vllm "
        "bench serve sends them; default: the model's, as vLLM (needs transformers; builtin completions: token ids); "
        "'none': token ids")] = None
    vocab_size: Annotated[Optional[int], Override(
        "client.vocab_size", "the model's vocabulary size (client.vocab_size): token-id prompts stay below it when "
        "no tokenizer loads (default: the model folder's config.json)")] = None
    dataset_name: Annotated[Optional[Literal["random", "custom", "sharegpt", "mooncake", "sessions"]], Override(
        "client.dataset_name", "as vllm bench serve: random (default), custom (JSONL: prompt or prompt_token_ids, "
        "output_len, optional timestamp for a trace replay), sharegpt (JSON); multi-turn session replays: mooncake "
        "(AIPerf's trace JSONL), sessions (synthetic: --num-sessions x --session-turns)")] = None
    dataset_path: Annotated[Optional[str], Override("client.dataset_path", "the custom JSONL, ShareGPT JSON or mooncake "
                                                                 "trace JSONL file")] = None
    custom_output_len: Annotated[Optional[int], Override("client.custom_output_len",
                                                  "output tokens of custom lines without output_len")] = None
    sharegpt_output_len: Annotated[Optional[int], Override("client.sharegpt_output_len",
                                                    "fix ShareGPT output lengths (default: the reply's)")] = None
    multi_turn: Annotated[Optional[bool], Override(
        "client.multi_turn", "sharegpt: replay whole conversations as sessions (each human message a turn)",
        off="one request per conversation (the first turn), as vllm bench serve")] = None
    session_mode: Annotated[Optional[Literal["auto", "closed", "open"]], Override(
        "client.session_mode", "session replay: closed (next turn after the answer + its delay), open (at the "
        "recorded timestamps), auto (open when the trace has timestamps; default)")] = None
    session_header: Annotated[Optional[str], Override(
        "client.session_header", "session-affinity header carrying the session id (default X-Session-ID; '' none)",
        metavar="NAME")] = None
    session_block_size: Annotated[Optional[int], Override(
        "client.session_block_size", "tokens per mooncake hash_ids block (default 512, as AIPerf)")] = None
    num_sessions: Annotated[Optional[int], Override(
        "client.num_sessions", "sessions to replay (synthetic: how many; files: at most; default CONC)")] = None
    session_turns: Annotated[Optional[int], Override(
        "client.session_turns", "synthetic sessions: turns per session (default 4; each ISL new tokens, OSL "
        "answer tokens)")] = None
    system_prompt_len: Annotated[Optional[int], Override(
        "client.system_prompt_len", "synthetic sessions: tokens of a system prompt every session shares")] = None
    session_delay: Annotated[Optional[float], Override(
        "client.session_delay", "synthetic sessions: seconds between an answer and the next turn")] = None
    subagents: Annotated[Optional[int], Override(
        "client.subagents", "synthetic sessions: child sessions (sub-agents) each forks after its first turn, "
        "with its context")] = None
    duration: Annotated[Optional[float], Override("client.duration", "send load for S seconds (the dataset cycled) instead "
                                           "of a number of prompts")] = None
    warmup_seconds: Annotated[Optional[float], Override("client.warmup_seconds", "with --duration: requests started in "
                                                 "the first S seconds are not measured")] = None
    cooldown_seconds: Annotated[Optional[float], Override("client.cooldown_seconds",
                                                   "with --duration: nor those started in the last S")] = None
    find_capacity: Annotated[Optional[dict[str, float]], Override(
        "client.find_capacity", "SLO capacity search: the highest concurrency (or --capacity-over request_rate) whose "
        "goodput meets --goodput-target, e.g. ttft:500 tpot:50", items="slo")] = None
    goodput_target: Annotated[Optional[float], Override("client.goodput_target", "share of requests that must meet the "
                                                 "SLOs (default 0.9)")] = None
    capacity_over: Annotated[Optional[Literal["concurrency", "request_rate"]], Override(
        "client.capacity_over", "what the capacity search varies (default concurrency)")] = None
    capacity_max: Annotated[Optional[float], Override("client.capacity_max", "the highest level the capacity search tries "
                                               "(default 1024)")] = None
    capacity_search: Annotated[Optional[Literal["margin", "bisect"]], Override(
        "client.capacity_search", "margin: the next level where the SLO margins (latency over limit at the target "
        "quantile) cross 1, the bracket's ends and undecided levels run again (default); bisect: doubled, then "
        "bisected on pass/fail")] = None
    capacity_steps: Annotated[Optional[int], Override(
        "client.capacity_steps", "most runs of the capacity search, repeated runs included (default 10; the ramp: "
        "most windows)", metavar="N")] = None
    capacity_mode: Annotated[Optional[Literal["search", "ramp"]], Override(
        "client.capacity_mode", "search: a run per level (default); ramp: the same levels in one "
        "continuous run, a window each, then a hold at the highest passing level")] = None
    ramp_window: Annotated[Optional[float], Override("client.ramp_window", "capacity ramp: seconds of load each level "
                                                     "is judged over (default 10)", metavar="S")] = None
    ramp_min_requests: Annotated[Optional[int], Override("client.ramp_min_requests", "capacity ramp: requests a window "
                                                         "needs at least (default 10)", metavar="N")] = None
    ramp_hold: Annotated[Optional[float], Override("client.ramp_hold", "capacity ramp: seconds held at the highest "
                                                   "passing level, measured in windows (default 30; 0: none)",
                                                   metavar="S")] = None
    reset_prefix_cache: Annotated[Optional[bool], Override(
        "client.reset_prefix_cache", "empty the server's prefix cache before each load point (vLLM "
        "/reset_prefix_cache, SGLang /flush_cache, builtin; default: on for sweeps and capacity searches)",
        off="never reset the prefix cache between load points")] = None
    event_loop: Annotated[Optional[Literal["auto", "uvloop", "asyncio"]], Override(
        "client.event_loop", "the load generator's event loop (default auto: asyncio's with its loop turn in C "
        "where built, else uvloop where installed)")] = None
    http_client: Annotated[Optional[Literal["lean", "aiohttp"]], Override(
        "client.http_client", "the load generator's HTTP client (default lean: stamps each read where it "
        "arrives)")] = None
    client_procs: Annotated[Optional[int], Override(
        "client.client_procs", "client processes sharing the load on one clock, results merged (client.client_procs; "
        "default 1; at most the concurrency)", metavar="N")] = None
    torch_profiler: Annotated[Optional[bool], Override(
        "profiler.torch_profiler.enabled", "collect server-side torch traces",
        off="turn off profiling (and its trace analysis) that the YAML enables", form=True)] = None
    tracelens: Annotated[Optional[bool], Override("profiler.tracelens.enabled",
                                           "analyse the traces (implies the profiler)")] = None
    gap_analysis: Annotated[Optional[bool], Override("gap_analysis.enabled", "gap and idle analysis of the traces",
                                              mcp="gap_analysis_enabled")] = None
    # ray: only through a batch, which sets it for Magpie's run_mode: ray points.
    run_mode: Annotated[Optional[Literal["docker", "local", "ray"]], Override(
        "run_mode", "where the server runs", choices=("docker", "local"))] = None
    docker_image: Annotated[Optional[str], Override("docker_image", "server image for --run-mode docker",
                                             dest="bench_docker_image")] = None
    timeout: Annotated[Optional[float], Override("timeout_seconds", "seconds for the whole run (default 3600)",
                                          mcp="timeout_seconds", form=True)] = None
    gpu_arch: Annotated[Optional[str], Override("gpu_arch", "arch for the roofline (H200, MI300X, ... or a JSON file)",
                                         cli=False)] = None

    # ------------------------------------------------------------------ building one
    @classmethod
    def build(cls, values: Mapping[str, Any], where: str = "flags",
              locate: Optional[Any] = None) -> "BenchmarkOverrides":
        """The overrides from a mapping keyed by field name; a ConfigError naming every unknown key
        (with the nearest valid one) and every value of the wrong type. ``where`` prefixes each
        problem ("command line" names the flags); ``locate(key)`` gives a YAML key's file:line."""
        if isinstance(values, BenchmarkOverrides):
            return values
        if not isinstance(values, Mapping):
            raise ConfigError([f"{where}: expected a mapping of overrides (e.g. {{concurrency: 64}}), "
                               f"got {type(values).__name__}"])
        cli = where == "command line"

        def at(key: str) -> str:
            return f"{locate(key)}: " if locate is not None else ""

        problems = [f"{at(k)}{where}: {k}: {unknown_override(str(k))}" for k in values if k not in cls.model_fields]
        if problems:
            raise ConfigError(problems)
        try:
            return cls.model_validate(dict(values), context={"cli": cli})
        except ValidationError as exc:
            out = []
            for e in exc.errors():
                name = str(e["loc"][0]) if e["loc"] else "?"
                label = OVERRIDES[name].flag(name) if cli and name in OVERRIDES else name
                got = values.get(name)
                out.append(f"{at(name)}{where}: {label} {got!r}: {e['msg'].removeprefix('Value error, ')}")
            raise ConfigError(out) from None

    def given(self) -> dict[str, Any]:
        """The overrides given (not None), by field name."""
        return {k: v for k, v in self if v is not None}

    # The command line's item syntaxes, accepted from every front end (a dict is taken as it is).
    @field_validator("sweep", mode="before")
    @classmethod
    def _sweep_items(cls, v: Any, info: ValidationInfo) -> Any:
        return parse_sweep(v) if isinstance(v, (list, tuple)) else v

    @field_validator("goodput", "find_capacity", mode="before")
    @classmethod
    def _slo_items(cls, v: Any, info: ValidationInfo) -> Any:
        if not isinstance(v, (list, tuple)):
            return v
        cli = bool((info.context or {}).get("cli"))
        return parse_goodput(v, ("--" + info.field_name.replace("_", "-")) if cli else str(info.field_name))


def _override_meta() -> dict[str, Override]:
    out = {}
    for name, info in BenchmarkOverrides.model_fields.items():
        meta = next((m for m in info.metadata if isinstance(m, Override)), None)
        if meta is None:
            raise TypeError(f"BenchmarkOverrides.{name}: every field needs its Override(...)")
        out[name] = meta
    return out


# field name -> how it is given and where it lands, in the command line's order
OVERRIDES: dict[str, Override] = _override_meta()


def unknown_override(key: str) -> str:
    """"unknown override; did you mean X?" (or the list of them when nothing is close)."""
    close = difflib.get_close_matches(key, list(OVERRIDES), n=1, cutoff=0.6)
    if close:
        return f"unknown override; did you mean {close[0]}?"
    return f"unknown override; the overrides are {', '.join(OVERRIDES)}"


def config_value(name: str, value: Any) -> Any:
    """The value as the effective config holds it: Magpie's envs are strings (``envs.CONC: "64"``)."""
    return str(value) if OVERRIDES[name].config.startswith("envs.") else value


def mcp_names() -> dict[str, str]:
    """MCP tool argument -> field name (Magpie's MCP names where they differ from the flags')."""
    return {(meta.mcp or name): name for name, meta in OVERRIDES.items()}


def cli_dest(name: str) -> str:
    return OVERRIDES[name].dest or name


def _plain_type(annotation: Any) -> Any:
    """int / float / str / bool / a Literal / dict, under Optional."""
    if get_origin(annotation) is Union:
        args = [a for a in get_args(annotation) if a is not type(None)]
        return args[0] if len(args) == 1 else annotation
    return annotation


def add_cli_flags(group: Any) -> None:
    """One argparse option for each override (the command line's benchmark flags); argparse
    converts the type, ``BenchmarkOverrides.build`` does the rest."""
    for name, meta in OVERRIDES.items():
        if not meta.cli:
            continue
        kind = _plain_type(BenchmarkOverrides.model_fields[name].annotation)
        names = [meta.short, meta.flag(name)] if meta.short else [meta.flag(name)]
        kw: dict[str, Any] = {"help": meta.help, "dest": cli_dest(name)}
        if meta.metavar:
            kw["metavar"] = meta.metavar
        if kind is bool:
            group.add_argument(*names, action="store_true", default=None, **kw)
            if meta.off:
                group.add_argument("--no-" + name.replace("_", "-"), dest=cli_dest(name), action="store_false",
                                   help=meta.off)
        elif meta.items == "sweep":
            group.add_argument(*names, action="append", **kw)
        elif meta.items == "slo":
            group.add_argument(*names, nargs="+", **{"metavar": _SLO, **kw})
        elif get_origin(kind) is Literal:
            group.add_argument(*names, choices=list(meta.choices or get_args(kind)), **kw)
        else:
            group.add_argument(*names, type=kind, **kw)


def from_cli_args(args: argparse.Namespace) -> BenchmarkOverrides:
    """The overrides of a parsed ``magpie benchmark`` command line."""
    return BenchmarkOverrides.build({name: getattr(args, cli_dest(name), None) for name in OVERRIDES},
                                    where="command line")


# ---------------------------------------------------------------------- item syntaxes
def parse_sweep(items: Optional[list[str]]) -> Optional[dict]:
    """``["concurrency=8,16", "input_len=128"]`` -> ``{"concurrency": [8, 16], "input_len": [128]}``."""
    if not items:
        return None
    out: dict[str, list] = {}
    for item in items:
        key, _, values = str(item).partition("=")
        key = key.strip().replace("-", "_")
        try:
            out[key] = [float(v) if "." in v else int(v) for v in values.split(",") if v]
        except ValueError:
            raise ConfigError([f"--sweep {item}: expected KEY=V1,V2,... with numbers"]) from None
        if not out[key]:
            raise ConfigError([f"--sweep {item}: no values"])
    return out


def parse_goodput(items: Optional[list[str]], flag: str = "--goodput") -> Optional[dict]:
    """``["ttft:200", "tpot:50"]`` -> ``{"ttft": 200.0, "tpot": 50.0}`` (SLOs in ms)."""
    if not items:
        return None
    out: dict[str, float] = {}
    for item in items:
        key, sep, value = str(item).partition(":")
        try:
            if not sep:
                raise ValueError
            out[key.strip().lower()] = float(value)
        except ValueError:
            raise ConfigError([f"{flag} {item}: expected KEY:MS (ttft, tpot or e2el, in ms), e.g. ttft:200"]) from None
    return out


def notice_lines(warnings: list[str], overrides: list[dict]) -> list[str]:
    """The lines printed before a run starts: its warnings, then each flag that replaced a value of
    the config file (the records of ``apply_cli_overrides``)."""
    return ([f"warning: {w}" for w in warnings]
            + [f"override: {o['field']}: {o['yaml']!r} -> {o['cli']!r} ({o['flag']})" for o in overrides])


__all__ = ["BenchmarkOverrides", "OVERRIDES", "Override", "add_cli_flags", "config_value", "from_cli_args",
           "mcp_names", "notice_lines", "parse_goodput", "parse_sweep", "unknown_override"]
