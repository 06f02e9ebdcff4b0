"""The tokenizer every pipeline built in code uses: Qwen2's fast tokenizer over the 256 byte symbols
(no merges) with Qwen3's special tokens and chat template, so it needs no download and its ids are a
subset of any Qwen3 vocabulary."""
from __future__ import annotations

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>")
# Qwen3's chat template, reduced to what the pipeline uses (it asks for enable_thinking=False).
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}")


def byte_level_tokenizer():
    """A Qwen2 fast tokenizer over the 256 byte symbols (no merges) and Qwen3's special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import Qwen2TokenizerFast

    vocab = {symbol: i for i, symbol in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab.update({token: len(vocab) + i for i, token in enumerate(SPECIAL_TOKENS)})
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = Qwen2TokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   unk_token=None, additional_special_tokens=list(SPECIAL_TOKENS[1:]))
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer
