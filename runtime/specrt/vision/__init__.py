"""Image input for vision-language models (SmolVLM / Idefics3), torch-free: numpy and Pillow only.

    config = ImagePreprocess.from_hf(folder)
    tokens = ImageTokens.from_hf(folder)
    image = prepare_image("cat.png", config)            # PreparedImage: pixel_values [frames, 3, side, side]
    prompt = expand_prompt("<image>What is this?", [image], tokens)

specrt.vision.encoder runs an artifact's encoder graph (frames -> the decoder's image rows) and
specrt.vision.inputs joins the two for SpecModel (``generate(prompt, images=[...])``).
"""

from specrt.vision.preprocess import (
    ImagePreprocess,
    ImageTokens,
    PreparedImage,
    expand_prompt,
    load_image,
    prepare_image,
)

__all__ = ["ImagePreprocess", "ImageTokens", "PreparedImage", "expand_prompt", "load_image", "prepare_image"]
