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
