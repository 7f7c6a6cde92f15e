"""Local assets for torchtitan's debug configs, built offline (no hub).

    python -m torchtpu.titan.assets DIR [--docs N] [--vocab V]

writes, under DIR (torchtitan's defaults resolve ``./tests/assets`` from the
run directory, so ``DIR=./tests/assets`` needs no path flags):

* ``tokenizer/``: a byte-level BPE trained with the ``tokenizers`` library on
  the generated text (``tokenizer.json``), with ``<|begin_of_text|>`` /
  ``<|end_of_text|>`` and a ``tokenizer_config.json`` naming them (what
  torchtitan's HuggingFaceTokenizer reads). Vocabulary <= 2048, the debug
  models' vocab size.
* FLUX's assets (``flux/``, ``cc12m_test/``: tiny T5 and CLIP encoders with their
  tokenizers, random autoencoders, image-caption pairs): ``torchtpu.titan.flux_assets``;
  ``--no-flux`` skips them, ``--flux-test-only`` skips the 168 MB flux-debug autoencoder.
* ``c4_test/data.json``: JSON lines of ``{"text", "timestamp", "url"}`` (the
  shape of torchtitan's ``c4_test`` dataset, loaded with
  ``datasets.load_dataset(DIR/c4_test, split="train")``).

The text is generated deterministically from a fixed seed and a small word
list, so every machine builds the same files.
"""
from __future__ import annotations

import argparse
import json
import os
import random

BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"

_WORDS = (
    "the a an of to in and is was for on with as by at from that this it be are were which "
    "or have has had not but all can will one two three more most other some such time year "
    "people way day man woman child world life hand part place case week company system program "
    "question work government number night point home water room mother area money story fact "
    "month lot right study book eye job word business issue side kind head house service friend "
    "father power hour game line end member law car city community name president team minute "
    "idea kid body information back parent face others level office door health person art war "
    "history party result change morning reason research girl guy moment air teacher force "
    "education small large new old good great high long little own big different important "
    "make know take see come think look want give use find tell ask seem feel try leave call "
    "train model tensor device compile graph layer weight gradient loss step batch token"
).split()


def _doc(rng: random.Random) -> str:
    sentences = []
    for _ in range(rng.randint(2, 12)):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 18))]
        if rng.random() < 0.2:
            words.insert(rng.randrange(len(words)), str(rng.randint(1, 2026)))
        s = " ".join(words)
        sentences.append(s[0].upper() + s[1:] + rng.choice(".!?."))
    return " ".join(sentences)


def write_dataset(path: str, n_docs: int, seed: int = 0, mirror: bool = False) -> list[str]:
    """mirror: the second half of the documents repeats the first, so that 2 data-parallel
    ranks (torchtitan shards the documents contiguously by rank) read the same stream."""
    rng = random.Random(seed)
    os.makedirs(path, exist_ok=True)
    texts: list[str] = []
    half = n_docs // 2
    with open(os.path.join(path, "data.json"), "w") as f:
        for i in range(n_docs):
            text = texts[i - half] if mirror and i >= half else _doc(rng)
            texts.append(text)
            day = 1 + i % 28
            f.write(json.dumps({"text": text, "timestamp": f"2019-04-{day:02d}T10:{i % 60:02d}:00Z",
                                "url": f"https://example.com/doc/{i}"}) + "\n")
    return texts


def write_tokenizer(path: str, texts: list[str], vocab_size: int) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[BOS, EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    os.makedirs(path, exist_ok=True)
    tok.save(os.path.join(path, "tokenizer.json"))
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": BOS, "eos_token": EOS, "add_bos_token": True, "add_eos_token": False,
                   "model_max_length": 131072, "tokenizer_class": "PreTrainedTokenizerFast"}, f, indent=1)
    return tok.get_vocab_size()


def build(root: str, n_docs: int = 2000, vocab_size: int = 1024, mirror: bool = False) -> dict:
    texts = write_dataset(os.path.join(root, "c4_test"), n_docs, mirror=mirror)
    v = write_tokenizer(os.path.join(root, "tokenizer"), texts, vocab_size)
    return {"root": os.path.abspath(root), "docs": n_docs, "vocab": v}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dir", nargs="?", default="./tests/assets",
                   help="where to write tokenizer/ and c4_test/ (default ./tests/assets)")
    p.add_argument("--docs", type=int, default=2000)
    p.add_argument("--vocab", type=int, default=1024, help="BPE vocabulary size (<= 2048 for the debug models)")
    p.add_argument("--mirror", action="store_true",
                   help="second half of the documents = the first (2 data-parallel ranks read the same data)")
    p.add_argument("--no-flux", action="store_true", help="skip FLUX's encoders, autoencoders and images")
    p.add_argument("--flux-test-only", action="store_true",
                   help="FLUX assets for flux_testmodel / flux_dev_dryrun only (no 168 MB flux-debug autoencoder)")
    a = p.parse_args(argv)
    info = build(a.dir, a.docs, a.vocab, a.mirror)
    print(f"wrote {info['root']}/tokenizer (vocab {info['vocab']}) and {info['root']}/c4_test "
          f"({info['docs']} documents)")
    if not a.no_flux:
        import importlib.util

        if importlib.util.find_spec("torchtitan") is None:
            print("FLUX assets skipped: they need torchtitan (pip install 'torchtpu[titan]')")
            return
        from torchtpu.titan import flux_assets

        f = flux_assets.build(a.dir, full_autoencoder=not a.flux_test_only)
        print(f"wrote {info['root']}/flux (T5 vocab {f['t5_vocab']}, CLIP vocab {f['clip_vocab']}, "
              f"autoencoders {f.get('ae_params', 0) + f['ae_test_params']} parameters) and "
              f"{info['root']}/cc12m_test ({f['images']} images)")


if __name__ == "__main__":
    main()
