"""A tiny random-weight gpt-oss, made offline: the model real engines serve in the tests.

``python tests/real/model.py DIR`` writes a Hugging Face folder (``GptOssForCausalLM``,
hidden 64, 2 layers, 4 experts; ~77 MB) whose tokenizer is o200k_harmony: the
o200k_base ranks from harmonykit's offline vocabulary, through transformers'
``TikTokenConverter``, with Harmony's special tokens at their ids. ``--gguf`` also
converts it for llama.cpp with the converter of a llama.cpp source tree.

The weights are noise, so the text is noise: the tests push it with ``logit_bias``
to write Harmony's control tokens where they do not belong, or hold it to valid
Harmony with guided decoding.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

# The gpt-oss split pattern (o200k), as the real tokenizer.json has it.
PATTERN = "|".join([
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"\p{N}{1,3}",
    r" ?[^\s\p{L}\p{N}]+[\r\n/]*",
    r"\s*[\r\n]+",
    r"\s+(?!\S)",
    r"\s+",
])
VOCAB_SIZE = 201088
EOS = [200002, 200012]  # <|return|>, <|call|>
CHAT_TEMPLATE = "{% for m in messages %}<|start|>{{ m['role'] }}<|message|>{{ m['content'] }}<|end|>" \
                "{% endfor %}{% if add_generation_prompt %}<|start|>assistant{% endif %}"


def make(folder: Path) -> Path:
    """Write the model to ``folder`` (skipped when it is already there); returns the folder."""
    if (folder / "done").is_file():
        return folder
    import torch
    from transformers import GptOssConfig, GptOssForCausalLM, PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    from harmonykit.tokens import SPECIAL_TOKENS
    from harmonykit.vocab import export_vocabulary

    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    config = GptOssConfig(
        vocab_size=VOCAB_SIZE, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, num_local_experts=4,
        num_experts_per_tok=2, max_position_embeddings=4096, sliding_window=128,
        layer_types=["sliding_attention", "full_attention"], eos_token_id=EOS, pad_token_id=199999,
        bos_token_id=199998, tie_word_embeddings=False,
    )
    model = GptOssForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(folder, safe_serialization=True)
    # The real model's generation config: vLLM ends a turn on any of these.
    (folder / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 199998, "eos_token_id": [200002, 199999, 200012], "pad_token_id": 199999}))

    with tempfile.TemporaryDirectory() as tmp:
        vocab = export_vocabulary(tmp)
        specials = sorted((i, n) for n, i in SPECIAL_TOKENS.items() if i < VOCAB_SIZE)
        backend = TikTokenConverter(vocab_file=str(vocab), pattern=PATTERN).converted()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend)
    # Added in id order from 199998 up, so each lands at its own id; then named.
    tok.add_special_tokens({"additional_special_tokens": [n for _, n in specials]})
    tok.add_special_tokens({"bos_token": "<|startoftext|>", "eos_token": "<|return|>",
                            "pad_token": "<|endoftext|>"})
    for i, name in specials:
        got = tok.convert_tokens_to_ids(name)
        if got != i:
            raise RuntimeError(f"special token {name} landed at {got}, not {i}")
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(folder)
    (folder / "done").write_text("ok\n")
    return folder


def make_gguf(folder: Path, llama_cpp: Path, out: Path) -> Path:
    """Convert ``folder`` to GGUF (f32, small enough) with ``llama_cpp``'s converter."""
    if out.is_file():
        return out
    env = {**os.environ, "PYTHONPATH": str(llama_cpp / "gguf-py"), "HF_HUB_OFFLINE": "1"}
    tmp = out.with_suffix(".part")
    subprocess.run([sys.executable, str(llama_cpp / "convert_hf_to_gguf.py"), str(folder),
                    "--outfile", str(tmp), "--outtype", "f32"], check=True, env=env,
                   stdout=subprocess.DEVNULL, timeout=1800)
    tmp.rename(out)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--gguf", type=Path, metavar="LLAMA_CPP_DIR",
                    help="also write model.gguf with this llama.cpp tree's converter")
    args = ap.parse_args()
    make(args.folder)
    if args.gguf:
        make_gguf(args.folder, args.gguf, args.folder / "model.gguf")


if __name__ == "__main__":
    main()
