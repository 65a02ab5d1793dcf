"""Text prompts: the built-in byte tokenizer through vLLM's random-dataset procedure, and the
errors a Hugging Face tokenizer gives when it cannot be loaded."""

import sys

import pytest

from engine.bench.dataset import sample_random_requests
from engine.bench.tokenizers import BuiltinTokenizer, TokenizerError, load_tokenizer
from engine.serve.tokenizer import encode


def test_builtin_tokenizer_gives_printable_text_of_exact_length():
    reqs = sample_random_requests(20, input_len=48, output_len=8, range_ratio=0.5, seed=3,
                                  tokenizer=load_tokenizer("builtin"))
    for r in reqs:
        assert isinstance(r.prompt, str) and r.prompt.isprintable() and r.prompt.isascii()
        # what the built-in server will count: its BOS plus one token per byte
        assert len(encode(r.prompt)) == r.prompt_len + 1
    assert len({r.prompt_len for r in reqs}) > 1  # the range ratio still spreads the lengths
    assert reqs[0].prompt != reqs[1].prompt


def test_text_and_token_id_prompts_draw_the_same_lengths():
    tok = BuiltinTokenizer()
    text = sample_random_requests(8, input_len=32, output_len=16, range_ratio=0.25, seed=1, tokenizer=tok)
    ids = sample_random_requests(8, input_len=32, output_len=16, range_ratio=0.25, seed=1,
                                 vocab_size=tok.vocab_size, special_ids=tok.all_special_ids, num_special_tokens=1)
    assert [r.output_len for r in text] == [r.output_len for r in ids]
    assert [r.prompt_len for r in text] == [r.prompt_len for r in ids]
    assert [bytes(r.prompt) .decode() for r in ids] == [r.prompt for r in text]  # round trip is exact


def test_hugging_face_tokenizer_without_transformers_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # import fails as if not installed
    with pytest.raises(TokenizerError, match=r"'org/model'.*needs the transformers package"):
        load_tokenizer("org/model")


def test_hugging_face_tokenizer_that_cannot_be_found(tmp_path):
    pytest.importorskip("transformers")
    with pytest.raises(TokenizerError, match="could not be loaded"):
        load_tokenizer(str(tmp_path / "no-such-tokenizer"))


def test_folder_vocab_size_reads_config_json(tmp_path):
    import json
    from engine.bench.tokenizers import folder_vocab_size
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 358}))
    assert folder_vocab_size(str(tmp_path)) == 358
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"vocab_size": 262144}}))
    assert folder_vocab_size(str(tmp_path)) == 262144  # multimodal configs keep it under text_config
    (tmp_path / "config.json").write_text("{not json")
    assert folder_vocab_size(str(tmp_path)) is None
    assert folder_vocab_size("org/hub-name") is None and folder_vocab_size("") is None


def test_a_folder_naming_the_generic_fast_class_loads_without_importing_torch(tmp_path):
    """A local tokenizer whose tokenizer_config.json names PreTrainedTokenizerFast (TokenizersBackend
    in transformers 5) loads as that class directly, in a process that never imports torch (what
    AutoTokenizer's configuration classes do), and encodes as AutoTokenizer's does; a folder naming a
    model's own class still goes through AutoTokenizer."""
    pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    import json
    import subprocess
    from transformers import AutoTokenizer, PreTrainedTokenizerFast
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "</s>"], show_progress=False,
                                             initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["the red cat sat on the blue mat"] * 50, trainer)
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>").save_pretrained(tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] in ("PreTrainedTokenizerFast", "TokenizersBackend")
    code = ("import sys, json; from engine.bench.tokenizers import load_tokenizer; "
            f"t = load_tokenizer({str(tmp_path)!r}); "
            "print(json.dumps([t.encode('the red cat'), t.all_special_ids, 'torch' in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    ids, special, torch_imported = json.loads(out.strip().splitlines()[-1])
    want = AutoTokenizer.from_pretrained(str(tmp_path))
    assert ids == want.encode("the red cat") and special == want.all_special_ids
    assert torch_imported is False
    config["tokenizer_class"] = "LlamaTokenizerFast"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    from engine.bench.tokenizers import _plain_fast_class
    assert not _plain_fast_class(str(tmp_path)) and _plain_fast_class(str(tmp_path / "missing")) is False
