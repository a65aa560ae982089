"""Safety models with random weights, built offline: for tests (tiny) and for measuring the cost
of the checks (`size="base"`: the real architectures, BERT-base as in detoxify's original model and
ViT-base as in common NSFW classifiers; speed does not depend on the weights' values).

Never used to serve: random weights refuse or pass at random.
"""

from __future__ import annotations

from pathlib import Path

DETOXIFY_CLASSES = ["toxic", "severe_toxic", "obscene", "threat", "insult", "identity_hate"]
CORPUS = [
    "a lighthouse on a cliff at dawn", "a red fox in the snow", "portrait of an old sailor",
    "you are a stupid idiot", "the quick brown fox jumps over the lazy dog", "hello world",
]


def make_detoxify_checkpoint(out_dir: str | Path, size: str = "tiny", seed: int = 0,
                             corpus: list[str] = ()) -> Path:
    """Writes config.json + tokenizer files into `out_dir` and `detoxify.ckpt` (detoxify's format)
    whose model type names `out_dir` itself, so that Detoxify(checkpoint=...,
    huggingface_config_path=out_dir) loads with no network. Returns the checkpoint path."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    # `corpus`: text whose words should be whole tokens, so sequence lengths are like a real vocabulary's.
    tokenizer = _wordpiece_tokenizer(CORPUS + list(corpus), max_length=128 if size == "tiny" else 512)
    tokenizer.save_pretrained(out)
    dims = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                max_position_embeddings=128) if size == "tiny" else {}  # {} is BERT-base
    # A wide initialisation so that scores differ between prompts instead of all sitting near 0.5.
    config = BertConfig(vocab_size=len(tokenizer), num_labels=len(DETOXIFY_CLASSES),
                        initializer_range=1.0 if size == "tiny" else 0.02, **dims)
    torch.manual_seed(seed)
    model = BertForSequenceClassification(config).eval()
    config.save_pretrained(out)
    ckpt = out / "detoxify.ckpt"
    torch.save({
        "config": {
            "arch": {"args": {"model_type": str(out), "model_name": "BertForSequenceClassification",
                              "tokenizer_name": "BertTokenizer", "num_classes": len(DETOXIFY_CLASSES)}},
            "dataset": {"args": {"classes": DETOXIFY_CLASSES}},
        },
        "state_dict": model.state_dict(),
    }, ckpt)
    return ckpt


def make_vit_classifier(out_dir: str | Path, size: str = "tiny", labels=("normal", "nsfw"),
                        seed: int = 0) -> Path:
    """A ViT image classifier with its image processor, saved with save_pretrained."""
    import torch
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

    out = Path(out_dir)
    dims = dict(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                intermediate_size=64) if size == "tiny" else {}  # {} is ViT-base/16 at 224
    config = ViTConfig(id2label=dict(enumerate(labels)), label2id={k: i for i, k in enumerate(labels)}, **dims)
    torch.manual_seed(seed)
    ViTForImageClassification(config).eval().save_pretrained(out)
    ViTImageProcessor(size={"height": config.image_size, "width": config.image_size}).save_pretrained(out)
    return out


def bench_overrides(models: Path) -> list[str]:
    """Worker config overrides for base-size detoxify and ViT with random weights (built in
    `models`), thresholds that flag nothing: their cost, not their verdicts, is what a benchmark
    needs."""
    ckpt = make_detoxify_checkpoint(models / "detoxify", size="base")
    vit = make_vit_classifier(models / "vit", size="base")
    return ["safety.text.backend=detoxify", f"safety.text.detoxify.checkpoint={ckpt}",
            f"safety.text.detoxify.huggingface_config_path={Path(ckpt).parent}",
            "safety.text.detoxify.model_type=original", "safety.text.detoxify.thresholds={ toxicity = 1.0 }",
            "safety.image.backend=hf", f"safety.image.hf.model={vit}", "safety.image.hf.threshold=1.0"]


def _wordpiece_tokenizer(corpus: list[str], max_length: int):
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import BertTokenizerFast

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok.train_from_iterator(corpus, trainers.WordPieceTrainer(vocab_size=1000, special_tokens=specials))
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)])
    return BertTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                             sep_token="[SEP]", mask_token="[MASK]", model_max_length=max_length)
