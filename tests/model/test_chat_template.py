"""Chat templates for vocabularies other than the packaged SmolLM2's (tests/model/test_smollm2.py
covers ChatML): a Llama-3-style tokenizer.json, built here, whose post-processor adds BOS."""
import pytest

from kvwire.model.tokenizer import Tokenizer

SPECIALS = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]


def llama3_style(tmp_path, bos_in_post_processor: bool) -> Tokenizer:
    from tokenizers import AddedToken, decoders, models, pre_tokenizers, processors
    from tokenizers import Tokenizer as HFTokenizer

    backend = HFTokenizer(models.BPE(vocab={c: i for i, c in enumerate("abcdefghijklmnopqrstuvwxyzĠĊ")}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    bos = backend.token_to_id("<|begin_of_text|>")
    if bos_in_post_processor:
        backend.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                                               special_tokens=[("<|begin_of_text|>", bos)])
    path = tmp_path / "tokenizer.json"
    backend.save(str(path))
    return Tokenizer.from_file(path, bos_token_id=bos, eos_token_ids=(backend.token_to_id("<|eot_id|>"),))


@pytest.mark.parametrize("bos_in_post_processor", [True, False])
def test_a_llama3_chat_prompt_starts_with_exactly_one_bos(tmp_path, bos_in_post_processor):
    tok = llama3_style(tmp_path, bos_in_post_processor)
    assert tok.add_bos is bos_in_post_processor
    ids = tok.encode(tok.apply_chat_template("hi", system="be brief"))
    assert ids[0] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1, ids[:4]
    assert tok.decode(ids).endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")


def test_the_default_system_prompt_is_a_literal_not_template_code():
    from kvwire.model.tokenizer import default_system_prompt
    code = "{{ '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    literal = "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM<|im_end|>\\n' }}"
    assert default_system_prompt(code) is None
    assert default_system_prompt(code + "{% else %}" + literal) == "You are a helpful AI assistant named SmolLM"
    tools = "{{ '<|im_start|>system\n' + tools_text }}{% for t in tools %}{{ t }}{% endfor %}"    # no end of its own
    assert default_system_prompt(tools + "{% else %}" + literal) == "You are a helpful AI assistant named SmolLM"
    braces = "{{ '<|im_start|>system\nAnswer in JSON: {\"answer\": ...}<|im_end|>\n' }}"
    assert default_system_prompt(braces) == 'Answer in JSON: {"answer": ...}'
