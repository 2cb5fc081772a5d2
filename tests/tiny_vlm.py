"""A tiny random Idefics3 (the architecture of SmolVLM) saved as a Hugging Face folder,
as the vision-language path's tests build it in-process: a 2-layer Llama text decoder (hidden 64)
over the byte-level BPE of tests/helpers.py plus the processor's image tokens (trained a little on
its training text, as tests/tiny.py's models, so that copied drafts get accepted), a 2-layer vision
transformer on 32-pixel frames (patch 8, pixel shuffle 2: 4 decoder rows a frame), and the
processor (longest edge 96, frames of 32: up to 3 x 3 tiles and the global image).
"""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer
from transformers import Idefics3Config, Idefics3ForConditionalGeneration, LlamaConfig, PreTrainedTokenizerFast
from transformers.models.idefics3.configuration_idefics3 import Idefics3VisionConfig
from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil
from transformers.models.idefics3.processing_idefics3 import Idefics3Processor

from tests.helpers import EOS, tiny_tokenizer
from tests.tiny import memorize

IMAGE_TOKENS = ["<fake_token_around_image>", "<image>", "<global-img>"] + [
    f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)
]
FRAME = 32  # the vision encoder's input side
LONGEST_EDGE = 96  # the processor's resize target: up to 3 x 3 tiles


def tiny_vlm_folder(out: Path, seed: int = 0) -> Path:
    """Write the tiny model, its tokenizer and processor to ``out`` (save_pretrained); returns ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    base = Tokenizer.from_file(str(tiny_tokenizer(out / "base-tokenizer.json")))
    base.add_special_tokens(IMAGE_TOKENS)
    base.save(str(out / "tokenizer.json"))
    (out / "base-tokenizer.json").unlink()
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(out / "tokenizer.json"), eos_token=EOS,
                                        extra_special_tokens={"image_token": "<image>"})
    image_token_id = tokenizer.convert_tokens_to_ids("<image>")
    torch.manual_seed(seed)
    text = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                       eos_token_id=tokenizer.eos_token_id)
    vision = Idefics3VisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                                 image_size=FRAME, patch_size=8)
    config = Idefics3Config(text_config=text.to_dict(), vision_config=vision.to_dict(), scale_factor=2,
                           image_token_id=image_token_id)
    model = memorize(Idefics3ForConditionalGeneration(config), tokenizer, steps=300)  # copied drafts get accepted
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(out)
    processor = Idefics3Processor(
        image_processor=Idefics3ImageProcessorPil(size={"longest_edge": LONGEST_EDGE},
                                                 max_image_size={"longest_edge": FRAME}),
        tokenizer=tokenizer,
        image_seq_len=(FRAME // 8) ** 2 // 4,
    )
    processor.save_pretrained(out)
    return out

