"""A tiny vision-language model (Qwen2-VL architecture) and its processor, built in code: no hub, no download.

The model is a randomly initialised `Qwen2VLForConditionalGeneration` (2 text layers of width 32, a vision tower of
depth 1 and width 16, ~50k parameters); the processor is a `Qwen2VLProcessor` with a character-level tokenizer that
knows Qwen2-VL's special tokens and TRL's Qwen2.5-VL chat template. A 28x28 image becomes 4 patches of 14x14, merged
into one `<|image_pad|>` token, so a prompt is 85 tokens and a GRPO step of 8 rows runs in well under a second on CPU.

    model, processor = build_tiny_vlm(seed=0)
    dataset = colour_dataset(8)  # conversational prompts with an `image` column
    GRPOTrainer(model, [contains_colour_letter], args=..., train_dataset=dataset, processing_class=processor)
"""

from __future__ import annotations

from pathlib import Path

import torch
import trl
from datasets import Dataset
from PIL import Image
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    PreTrainedTokenizerFast,
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
    Qwen2VLProcessor,
)
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

SPECIAL_TOKENS = (
    "<|endoftext|>",  # pad
    "<|im_start|>",
    "<|im_end|>",  # eos: ends the assistant turn
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
CHARACTERS = "0123456789" + "abcdefghijklmnopqrstuvwxyz" + "ABCDEFGHIJKLMNOPQRSTUVWXYZ" + " \n.,:;?!'\"-+*/=()[]{}_<>|"
CHAT_TEMPLATE = (Path(trl.__file__).parent / "chat_templates" / "qwen2_5_vl.jinja").read_text()

IMAGE_SIZE = 28
"""Side of the test images: 2x2 patches of 14 pixels, merged (2x2) into a single image token."""

COLOURS = {
    "red": (255, 0, 0),
    "green": (0, 255, 0),
    "blue": (0, 0, 255),
    "yellow": (255, 255, 0),
    "cyan": (0, 255, 255),
    "magenta": (255, 0, 255),
    "white": (255, 255, 255),
    "black": (0, 0, 0),
}


def _byte_level(char: str) -> str:
    """GPT-2's byte-to-unicode map for a single-byte character (what `ByteLevel` turns it into)."""
    code = ord(char)
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    if code in printable:
        return char
    return chr(256 + sum(1 for byte in range(code) if byte not in printable))


def build_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character of `CHARACTERS`, plus Qwen2-VL's special tokens (pad 0, `<|im_end|>` as eos)."""
    tokens = [*SPECIAL_TOKENS, "<unk>", *(_byte_level(char) for char in CHARACTERS)]
    vocab = {token: index for index, token in enumerate(tokens)}
    assert len(vocab) == len(tokens), "duplicate characters"
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(pattern=Regex("."), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<|endoftext|>",
        eos_token="<|im_end|>",
        unk_token="<unk>",
        model_max_length=512,
        clean_up_tokenization_spaces=False,
        padding_side="left",
    )
    # Special tokens are matched whole before the character split (the chat template writes them as text).
    tokenizer.add_special_tokens({"additional_special_tokens": list(SPECIAL_TOKENS[1:])})
    return tokenizer


class TinyQwen2VLProcessor(Qwen2VLProcessor):
    """`Qwen2VLProcessor` without its video processor: that class needs torchvision, which is not installed here (the
    base processor checks every sub-processor's class, and `BaseVideoProcessor` is missing without torchvision)."""

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        super().__init__(image_processor, tokenizer, None, chat_template=chat_template, **kwargs)


def build_processor() -> Qwen2VLProcessor:
    """Qwen2-VL's processor around `build_tokenizer`: a 28x28 image gives 4 patches and 1 image token."""
    image_processor = Qwen2VLImageProcessorPil(
        min_pixels=IMAGE_SIZE * IMAGE_SIZE,
        max_pixels=IMAGE_SIZE * IMAGE_SIZE,
        patch_size=14,
        temporal_patch_size=2,
        merge_size=2,
    )
    return TinyQwen2VLProcessor(
        image_processor=image_processor, tokenizer=build_tokenizer(), chat_template=CHAT_TEMPLATE
    )


def build_tiny_vlm(processor: Qwen2VLProcessor | None = None, *, seed: int = 0):
    """A randomly initialised tiny `Qwen2VLForConditionalGeneration` (deterministic for `seed`) and its processor."""
    processor = processor or build_processor()
    tokenizer = processor.tokenizer
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in SPECIAL_TOKENS}
    text_config = dict(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=512,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    vision_config = dict(
        depth=1,
        embed_dim=16,
        hidden_size=32,  # the merger projects into the text model's width
        num_heads=2,
        mlp_ratio=2,
        patch_size=14,
        spatial_merge_size=2,
        temporal_patch_size=2,
        in_channels=3,
    )
    config = Qwen2VLConfig(
        text_config=text_config,
        vision_config=vision_config,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2VLForConditionalGeneration(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = None
    return model, processor


def colour_image(colour: str, size: int = IMAGE_SIZE) -> Image.Image:
    return Image.new("RGB", (size, size), COLOURS[colour])


def colour_dataset(num_rows: int, *, column: str = "image") -> Dataset:
    """Conversational prompts asking for the image's colour; row i shows colour i (cycling), in `image` or `images`."""
    names = list(COLOURS)
    colours = [names[i % len(names)] for i in range(num_rows)]
    images = [colour_image(colour) for colour in colours]
    return Dataset.from_dict(
        {
            "prompt": [[{"role": "user", "content": "What colour is the image?"}] for _ in colours],
            column: images if column == "image" else [[image] for image in images],
            "colour": colours,
        }
    )


def image_colour(image) -> str:
    """The colour name of a solid-colour image (a PIL image, or a datasets-decoded one)."""
    rgb = image.convert("RGB").getpixel((0, 0))
    return next(name for name, value in COLOURS.items() if value == tuple(rgb))


def colour_reward(text: str, colour: str) -> float:
    """1.0 when `text` holds a letter of `colour`'s name (either case): a random tiny model scores ~1 time in 3."""
    return 1.0 if set(text.lower()) & set(colour) else 0.0


def contains_colour_letter(completions, image=None, images=None, **kwargs):
    """TRL reward function: [`colour_reward`] of each completion for its own image's colour (`image` or `images`)."""
    if image is None:
        image = [row[0] for row in images]
    texts = [c if isinstance(c, str) else c[0]["content"] for c in completions]
    return [colour_reward(text, image_colour(img)) for text, img in zip(texts, image)]


def colour_fingerprint(completions, image=None, images=None, **kwargs):
    """
    A second reward (give it weight 0) that records what it was scored on: the colour of the row's image (index times
    1024) plus a hash of the completion text (below 1024). An integer below 2**24, so exact in float32 reward tensors.
    """
    if image is None:
        image = [row[0] for row in images]
    texts = [c if isinstance(c, str) else c[0]["content"] for c in completions]
    return [float(fingerprint(text, image_colour(img))) for text, img in zip(texts, image)]


def fingerprint(text: str, colour: str) -> int:
    return list(COLOURS).index(colour) * 1024 + sum((i + 1) * ord(ch) for i, ch in enumerate(text)) % 1021


def recording(trainer_class):
    """
    A subclass of `trainer_class` (GRPOTrainer or AdaGRPOTrainer) that records, as plain data:

    - `generated`: every row the model generated (each sampling round's rows with AdaGRPOTrainer), with the colour of
      the image it was generated from, its completion ids, and whether the pixel values the model saw are its images';
    - `handed_over` (AdaGRPOTrainer): per generation batch, the kept rows `_generate` hands to TRL's loss on this
      process: image colour, completion ids and text, the rewards computed in the rounds, the image tokens in its
      prompt;
    - `recorded`: per generation batch, the tensors TRL's loss receives (`_generate_and_score_completions`' output);
    - `pools`: per generation batch, the pool size of each prompt (AdaGRPOTrainer).
    """

    class Recording(trainer_class):
        def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, **kwargs):
            completion_ids, logprobs = super()._generate_single_turn(
                prompt_ids, images, multimodal_fields, num_generations, **kwargs
            )
            flat = [image for row in images for image in row]
            seen = self.processing_class.image_processor(images=flat, return_tensors="pt")["pixel_values"]
            self.__dict__.setdefault("generated", []).append(
                {
                    "rows": [
                        [image_colour(row[0]), list(ids)] for row, ids in zip(images, completion_ids, strict=True)
                    ],
                    "pixels_match": torch.equal(torch.as_tensor(multimodal_fields["pixel_values"]).cpu(), seen),
                }
            )
            return completion_ids, logprobs

        def _generate(self, prompts):
            kept = getattr(self, "_ada_pending", None) is not None
            output = super()._generate(prompts)
            if kept:  # the kept rows handed to TRL's loss on this process
                prompt_ids, completion_ids, _, completions, _, _, images, _ = output
                rewards = self._ada_pending.rewards  # every process's kept rows, process-major
                start = self.accelerator.process_index * len(completion_ids)
                image_token = self.model.config.image_token_id
                self.__dict__.setdefault("handed_over", []).append(
                    [
                        {
                            "colour": image_colour(images[i][0]) if images and images[i] else None,
                            "num_images": len(images[i]) if images and images[i] else 0,
                            "image_tokens": list(prompt_ids[i]).count(image_token),
                            "completion_ids": list(completion_ids[i]),
                            "text": completions[i][0]["content"],
                            "rewards": rewards[start + i].tolist(),
                        }
                        for i in range(len(completion_ids))
                    ]
                )
            return output

        def _generate_and_score_completions(self, inputs):
            output = super()._generate_and_score_completions(inputs)
            keys = ("completion_ids", "completion_mask", "advantages", "pixel_values", "image_grid_thw")
            record = {key: output[key].detach().cpu().clone() for key in (*keys, "mm_token_type_ids") if key in output}
            record["num_images"] = output.get("num_images")
            self.__dict__.setdefault("recorded", []).append(record)
            return output

        def _log_selection(self, selection):
            self.__dict__.setdefault("pools", []).append([len(pool) for pool in selection.pools])
            super()._log_selection(selection)

    return Recording


def kept_row_problems(generated: list[dict], handed_over: list[list[dict]], image_processor=None, recorded=None):
    """
    Everything wrong with the kept rows (an empty list when they line up): each kept row must be a completion the model
    generated from that row's own image, carry that one image (one image token in its prompt), and carry the rewards
    its own completion and image score ([`colour_reward`], and [`colour_fingerprint`] as second reward when there is
    one). With `recorded` (this process's `recording(...).recorded`) and the image processor, the pixel values and grid
    TRL's loss received must be, row by row, those of the kept rows' images. `generated` may merge several processes'
    records (a kept row may have been generated on another process).
    """
    problems = [f"generation call {k}: pixel values are not its images'" for k, g in enumerate(generated)]
    problems = [p for p, g in zip(problems, generated) if not g["pixels_match"]]
    colours_of = {}
    for call in generated:
        for colour, ids in call["rows"]:
            colours_of.setdefault(tuple(ids), set()).add(colour)
    for step, rows in enumerate(handed_over):
        for i, row in enumerate(rows):
            where = f"step {step} row {i} ({row['colour']}, {row['text']!r})"
            if row["num_images"] != 1 or row["image_tokens"] != 1:
                problems.append(f"{where}: {row['num_images']} images, {row['image_tokens']} image tokens")
            if row["colour"] not in colours_of.get(tuple(row["completion_ids"]), ()):
                problems.append(f"{where}: generated from {colours_of.get(tuple(row['completion_ids']))}")
            expected = [colour_reward(row["text"], row["colour"])]
            if len(row["rewards"]) == 2:
                expected.append(float(fingerprint(row["text"], row["colour"])))
            if row["rewards"] != expected:
                problems.append(f"{where}: rewards {row['rewards']} != {expected}")
        if recorded is not None:
            record = recorded[step]
            images = [colour_image(row["colour"]) for row in rows]
            pixels = image_processor(images=images, return_tensors="pt")
            if not torch.equal(record["pixel_values"], pixels["pixel_values"]):
                problems.append(f"step {step}: the loss's pixel values are not the kept rows' images")
            if not torch.equal(record["image_grid_thw"], pixels["image_grid_thw"]):
                problems.append(f"step {step}: the loss's image grids are not the kept rows'")
            ids = [row["completion_ids"] for row in rows]
            got = [r[m.bool()].tolist() for r, m in zip(record["completion_ids"], record["completion_mask"])]
            # A truncated completion is masked out (mask_truncated_completions): compare the terminated ones.
            if any(g and g != i for g, i in zip(got, ids)) or len(got) != len(ids):
                problems.append(f"step {step}: the loss's completions are not the kept rows'")
    return problems
