"""Local assets for torchtitan's FLUX trainer, built offline (no hub).

Written under ``DIR/flux`` and ``DIR/cc12m_test`` by ``python -m torchtpu.titan.assets DIR``
(``DIR`` defaults to ``./tests/assets``, where the registry's FLUX configs look):

* ``flux/t5/``: a T5 encoder (``T5EncoderModel``, ``d_model`` 4096 as T5-v1.1-XXL's, so that
  FLUX's ``txt_in`` (4096 -> hidden) takes it unchanged; one layer, 2 heads of 8, FFN 16) with
  random weights, and its tokenizer (transformers' ``T5Tokenizer``: a unigram vocabulary of the
  captions' words, ``<pad>`` 0, ``</s>`` 1, ``<unk>`` 2), saved with ``save_pretrained``.
* ``flux/clip/``: a CLIP text encoder (``CLIPTextModel``, hidden 768 as CLIP-L's, whose pooled
  output is FLUX's ``vector_in``; one layer) and its tokenizer (``CLIPTokenizer``: byte-level BPE
  with ``</w>`` word ends, merges for the captions' words). The path contains "clip": torchtitan
  tells the two encoders apart by that (``models/flux/tokenizer.py``, ``hf_embedder.py``).
* ``flux/ae.safetensors``: the autoencoder of ``flux-debug``/``flux-dev`` (FLUX's layout, ch 128,
  channel multipliers 1, 2, 4, 4, 16 latent channels), random, stored in bf16 (168 MB); and
  ``flux/ae_test.safetensors``: the small autoencoder of the CPU-sized ``flux_testmodel`` (ch 32).
* ``cc12m_test/shard-000000.tar``: a webdataset shard of image-caption pairs (``KEY.jpg``,
  ``KEY.txt``: torchtitan's ``cc12m-test`` layout). Each image is a coloured shape on a coloured
  background, 256 x 256, and its caption says which ("a red circle on a blue background"), so
  there is something to learn.

Everything is generated from fixed seeds: every machine writes the same files.
"""
from __future__ import annotations

import io
import json
import os
import random
import tarfile

COLORS = {"red": (220, 40, 40), "green": (40, 180, 60), "blue": (40, 70, 220), "yellow": (240, 220, 40),
          "white": (245, 245, 245), "black": (15, 15, 15), "purple": (140, 50, 170), "orange": (250, 140, 30)}
SHAPES = ("circle", "square", "triangle", "stripe")
_FILLER = "a an on the of with background small large picture photo image in centre left right top bottom".split()

T5_DIM, CLIP_DIM = 4096, 768


def _caption_words() -> list[str]:
    return sorted(set(COLORS) | set(SHAPES) | set(_FILLER))


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table (what byte-level BPE vocabularies use)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) \
        + list(range(ord("\xae"), ord("\xff") + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def write_t5(path: str, seed: int = 0) -> int:
    import torch
    from transformers import T5Config, T5EncoderModel, T5Tokenizer

    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -2.0)]
    pieces += [("\u2581" + w, -1.0) for w in _caption_words()]
    pieces += [(c, -5.0) for c in "abcdefghijklmnopqrstuvwxyz0123456789.,!?'-"]
    tok = T5Tokenizer(vocab=pieces, extra_ids=0)
    os.makedirs(path, exist_ok=True)
    tok.save_pretrained(path)
    cfg = T5Config(vocab_size=len(tok), d_model=T5_DIM, d_kv=8, d_ff=16, num_layers=1, num_heads=2,
                   relative_attention_num_buckets=8, feed_forward_proj="gated-gelu",
                   pad_token_id=0, eos_token_id=1, decoder_start_token_id=0, tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = T5EncoderModel(cfg)
    model.save_pretrained(path)
    return len(tok)


def write_clip(path: str, seed: int = 0) -> int:
    import torch
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    b2u = _bytes_to_unicode()
    specials = ["<|startoftext|>", "<|endoftext|>"]
    vocab: dict[str, int] = {}
    for ch in b2u.values():
        vocab.setdefault(ch, len(vocab))
    for ch in b2u.values():
        vocab.setdefault(ch + "</w>", len(vocab))
    merges: list[tuple[str, str]] = []
    for word in _caption_words():
        # merge left to right: w o r d</w> -> wo r d</w> -> wor d</w> -> word</w>
        sym = list(word[:-1]) + [word[-1] + "</w>"]
        cur = sym[0]
        for nxt in sym[1:]:
            m = (cur, nxt)
            if m not in merges:
                merges.append(m)
            cur = cur + nxt
            vocab.setdefault(cur, len(vocab))
    for s in specials:
        vocab[s] = len(vocab)
    tok = CLIPTokenizer(vocab=vocab, merges=merges)
    os.makedirs(path, exist_ok=True)
    tok.save_pretrained(path)
    cfg = CLIPTextConfig(vocab_size=len(vocab), hidden_size=CLIP_DIM, intermediate_size=32,
                         projection_dim=CLIP_DIM, num_hidden_layers=1, num_attention_heads=2,
                         max_position_embeddings=77, bos_token_id=vocab[specials[0]],
                         eos_token_id=vocab[specials[1]], pad_token_id=vocab[specials[1]])
    torch.manual_seed(seed)
    model = CLIPTextModel(cfg)
    model.save_pretrained(path)
    return len(vocab)


def write_autoencoder(path: str, ae_config, dtype=None, seed: int = 0) -> int:
    """A random autoencoder in FLUX's checkpoint layout (torchtitan's AutoEncoder's state dict,
    the names of black-forest-labs' ae.safetensors)."""
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(seed)
    ae = ae_config.build()
    sd = {k: v.detach().to(dtype or v.dtype).contiguous() for k, v in ae.state_dict().items()}
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    save_file(sd, path)
    return sum(v.numel() for v in sd.values())


def _image(rng: random.Random, size: int):
    from PIL import Image, ImageDraw

    bg, fg = rng.sample(sorted(COLORS), 2)
    shape = rng.choice(SHAPES)
    img = Image.new("RGB", (size, size), COLORS[bg])
    d = ImageDraw.Draw(img)
    r = rng.randint(size // 6, size // 3)
    cx, cy = rng.randint(r, size - r), rng.randint(r, size - r)
    if shape == "circle":
        d.ellipse([cx - r, cy - r, cx + r, cy + r], fill=COLORS[fg])
    elif shape == "square":
        d.rectangle([cx - r, cy - r, cx + r, cy + r], fill=COLORS[fg])
    elif shape == "triangle":
        d.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=COLORS[fg])
    else:
        d.rectangle([0, cy - r // 3, size, cy + r // 3], fill=COLORS[fg])
    where = "left" if cx < size / 3 else "right" if cx > 2 * size / 3 else "centre"
    size_word = "large" if r > size / 4 else "small"
    caption = f"a {size_word} {fg} {shape} on the {where} of a {bg} background"
    return img, caption


def write_cc12m_test(path: str, n: int = 32, size: int = 256, seed: int = 0) -> int:
    rng = random.Random(seed)
    os.makedirs(path, exist_ok=True)
    with tarfile.open(os.path.join(path, "shard-000000.tar"), "w") as tar:
        for i in range(n):
            img, caption = _image(rng, size)
            buf = io.BytesIO()
            img.save(buf, format="JPEG", quality=95)
            for ext, data in (("jpg", buf.getvalue()), ("txt", caption.encode())):
                info = tarfile.TarInfo(f"{i:06d}.{ext}")
                info.size, info.mtime = len(data), 0
                tar.addfile(info, io.BytesIO(data))
    return n


def build(root: str, full_autoencoder: bool = True, n_images: int = 32) -> dict:
    """Write every FLUX asset under ROOT (see the module docstring); full_autoencoder=False skips
    the 168 MB flux-debug/flux-dev autoencoder (the CPU-sized test config does not read it)."""
    import torch

    from torchtpu.titan import flux_configs

    flux = os.path.join(root, "flux")
    info = {"t5_vocab": write_t5(os.path.join(flux, "t5")),
            "clip_vocab": write_clip(os.path.join(flux, "clip")),
            "images": write_cc12m_test(os.path.join(root, "cc12m_test"), n_images)}
    info["ae_test_params"] = write_autoencoder(os.path.join(flux, "ae_test.safetensors"),
                                               flux_configs.test_autoencoder())
    if full_autoencoder:
        from torchtitan.models.flux import flux_configs as titan_flux

        info["ae_params"] = write_autoencoder(os.path.join(flux, "ae.safetensors"),
                                              titan_flux["flux-debug"]().autoencoder, torch.bfloat16)
    with open(os.path.join(flux, "assets.json"), "w") as f:
        json.dump(info, f, indent=1)
    return info
