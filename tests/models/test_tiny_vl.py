"""`model.path: tiny-random-vl`: a tiny random Qwen3-VL built offline with its image processor, the Qwen3 tokenizer's
vision tokens and the project's Qwen3-VL chat template; `mrope_positions` against the model's own `get_rope_index`."""
from __future__ import annotations

import base64
import hashlib

import pytest
import torch

from rlfactory.envs.tools.digits_image import render_png
from rlfactory.models.loading import load_policy, load_tokenizer
from rlfactory.models.vision import is_vision_model, mrope_positions, vision_of
from rlfactory.recipe.schema import Recipe
from rlfactory.tools.types import ToolImage


def image_of(text: str, scale: int = 3) -> ToolImage:
    from rlfactory.tools.images import ImageLimits, decode_image

    return decode_image(base64.b64encode(render_png(text, scale)).decode(), "image/png", ImageLimits())


@pytest.fixture(scope="module")
def vl_recipe(tmp_path_factory) -> Recipe:
    root = tmp_path_factory.mktemp("vl")
    (root / "train.jsonl").write_text('{"prompt": "hi", "answer": "1"}\n')
    return Recipe.model_validate({"model": {"path": "tiny-random-vl"},
                                  "data": {"train_file": str(root / "train.jsonl")}})


def test_tiny_random_vl_builds_offline_with_its_processor(vl_recipe, qwen_tokenizer):
    tok = load_tokenizer(vl_recipe)
    model = load_policy(vl_recipe, "cpu")
    vision = vision_of(tok)
    assert is_vision_model(model) and vision is not None
    assert vision_of(qwen_tokenizer) is None and qwen_tokenizer.chat_template != tok.chat_template  # shared one kept
    assert vision.image_token_id == tok.convert_tokens_to_ids("<|image_pad|>") == model.config.image_token_id
    assert sum(p.numel() for p in model.parameters()) < 25e6
    image = image_of("42")
    text = tok.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "read it"}]}],
        tokenize=False, add_generation_prompt=True)
    assert text == ("<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>read it<|im_end|>\n"
                    "<|im_start|>assistant\n")
    n = vision.num_tokens(image)
    ids = tok.encode(text, add_special_tokens=False)
    at = ids.index(vision.image_token_id)
    ids = ids[:at] + [vision.image_token_id] * n + ids[at + 1:]
    pixels, grid = vision.pixel_inputs([image])
    assert int(grid.prod()) // 4 == n
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids]), pixel_values=pixels, image_grid_thw=grid,
                       mm_token_type_ids=(torch.tensor([ids]) == vision.image_token_id).int()).logits
        blank = model(input_ids=torch.tensor([ids]), pixel_values=torch.zeros_like(pixels), image_grid_thw=grid,
                      mm_token_type_ids=(torch.tensor([ids]) == vision.image_token_id).int()).logits
    assert logits.shape == (1, len(ids), model.config.text_config.vocab_size)
    assert not torch.allclose(logits[0, -1], blank[0, -1])  # the picture reaches the prediction


def test_mrope_positions_match_the_models_rope_index(vl_recipe):
    tok = load_tokenizer(vl_recipe)
    model = load_policy(vl_recipe, "cpu")
    vision = vision_of(tok)
    images = [image_of("7"), image_of("123456", scale=4), image_of("9" * 20, scale=2)]
    grids = [vision.grid(im) for im in images]
    pad = vision.image_token_id
    ids: list[int] = [1, 2, 3]
    for g in grids:
        ids += [vision.vision_start_id] + [pad] * (g[0] * g[1] * g[2] // 4) + [vision.vision_end_id, 5, 6]
    ours = mrope_positions(ids, grids, pad, vision.merge_size)
    t = torch.tensor([ids])
    theirs, delta = model.model.get_rope_index(t, mm_token_type_ids=(t == pad).int(),
                                               image_grid_thw=torch.tensor(grids))
    assert torch.equal(ours, theirs[:, 0]) and len(set(grids)) == 3
    assert int(ours.max()) + 1 - len(ids) == int(delta)
    with pytest.raises(ValueError, match="images given"):
        mrope_positions(ids, grids + [grids[0]], pad, vision.merge_size)
    assert image_of("7").sha256 == hashlib.sha256(render_png("7")).hexdigest()


def test_the_pixel_cache_stays_within_its_bytes(vl_recipe, monkeypatch):
    import rlfactory.models.vision as vision_module

    vision = vision_of(load_tokenizer(vl_recipe))
    one = vision.pixel_inputs([image_of("1")])[0]
    monkeypatch.setattr(vision_module, "PIXEL_CACHE_BYTES", 2 * one.numel() * one.element_size())
    for text in ("2", "3", "4", "5"):
        vision.grid(image_of(text))
    assert len(vision._cache) == 2 and vision._cached_bytes <= vision_module.PIXEL_CACHE_BYTES
    assert torch.equal(vision.pixel_inputs([image_of("1")])[0], one)  # evicted, processed again: the same pixels


async def test_a_qwen3_vl_model_folder_loads_with_its_processor_and_generates_with_pictures(vl_recipe, tmp_path):
    """`model.path` to a local Qwen3-VL folder (config, weights, tokenizer, preprocessor_config.json), as a user
    points at a downloaded checkpoint: loaded offline, its image processor read from the folder."""
    from rlfactory.rollout.chat import ChatFormat
    from rlfactory.rollout.engines.hf import HFEngine
    from rlfactory.rollout.engines.protocol import SamplingParams
    from rlfactory.rollout.images import prompt_with_images

    tok = load_tokenizer(vl_recipe)
    model = load_policy(vl_recipe, "cpu")
    folder = tmp_path / "qwen3-vl-tiny"
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    vision_of(tok).image_processor.save_pretrained(folder)
    recipe = vl_recipe.model_copy(update={"model": vl_recipe.model.model_copy(update={"path": str(folder)})})
    loaded_tok, loaded = load_tokenizer(recipe), load_policy(recipe, "cpu")
    assert is_vision_model(loaded) and vision_of(loaded_tok) is not None
    assert "<|image_pad|>" in loaded_tok.chat_template
    chat = ChatFormat(loaded_tok)
    task = {"prompt": "What number?", "images": [{"data_b64": image_of("42").data_b64}]}
    messages, shown = prompt_with_images(chat, chat.prompt_messages(task["prompt"]), task)
    ids = chat.prompt_ids(messages, shown)
    assert chat.vision.num_tokens(shown[0]) == vision_of(tok).num_tokens(shown[0])
    outs = []
    for m, v in ((model, vision_of(tok)), (loaded, chat.vision)):
        engine = HFEngine(m, pad_token_id=151643, eos_token_ids=[], vision=v)
        try:
            outs.append(await engine.generate(ids, SamplingParams(temperature=0.0, max_new_tokens=6), images=shown))
        finally:
            await engine.close()
    assert outs[0].token_ids == outs[1].token_ids  # the folder holds the same policy
