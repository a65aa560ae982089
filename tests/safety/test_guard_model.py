"""The guard-model backend wired for real: transformers loads a tiny random Llama and its tokenizer
(built here, saved to a directory) through `safety.text.backend = "guard-model"`, the chat template
is applied, one forward pass scores "unsafe" against "safe", and a refusal reads its codes from a
greedy answer. Random weights cannot say what a real guard model would: the verdicts are forced
through the model's last norm, so the test checks the wiring, not the judgement."""

from __future__ import annotations

import pytest
import torch

from safety.config import GuardModelConfig, SafetyConfig, TextCheckConfig
from safety.guard import Guard
from safety.guard_model import GuardModelCheck, parse_codes
from safety.text import build_text_check
from safety.verdicts import SafetyLoadError

WORDS = ["safe", "unsafe", "S1", "S4", "S10", "S12", ",", "User:", "Agent:", "a", "lighthouse", "on", "cliff"]
TEMPLATE = ("{% for m in messages %}User: {{ m['content'] if m['content'] is string else m['content'][0]['text'] }}"
            "\n{% endfor %}{% if add_generation_prompt %}Agent:{% endif %}")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    folder = tmp_path_factory.mktemp("guard-model")
    vocab = {w: i for i, w in enumerate(["<unk>", "<s>", "</s>", "<pad>"] + WORDS)}
    raw = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                  pad_token="<pad>", chat_template=TEMPLATE)
    tok.save_pretrained(folder)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      bos_token_id=1, eos_token_id=2, pad_token_id=3)
    LlamaForCausalLM(cfg).save_pretrained(folder)
    return folder


def forced(check: GuardModelCheck, first: str, then: str | None = None) -> None:
    """The model made to answer `first` and then `then` over and over: the last norm's output is
    replaced by a one-hot vector (dimension 0 for the scoring pass and the answer's first token,
    1 after), and the output layer maps dimension 0 to `first`, 1 to `then`."""
    tok, model = check._tok, check._model
    with torch.no_grad():
        model.lm_head.weight.zero_()
        model.lm_head.weight[tok.convert_tokens_to_ids(first), 0] = 10.0
        if then:
            model.lm_head.weight[tok.convert_tokens_to_ids(then), 1] = 10.0
    calls = []

    def one_hot(module, args, out):
        calls.append(1)
        h = torch.zeros_like(out)
        h[..., 0 if len(calls) <= 2 or not then else 1] = 1.0
        return h

    model.model.norm.register_forward_hook(one_hot)


def test_a_prompt_the_model_calls_safe_passes(model_dir):
    check = build_text_check(TextCheckConfig(backend="guard-model",
                                             guard_model=GuardModelConfig(model=str(model_dir), dtype="float32"),
                                             device="cpu"))
    assert isinstance(check, GuardModelCheck) and str(model_dir) in check.placement
    forced(check, "safe")
    [v] = check.check(["a lighthouse on a cliff"])
    assert not v.refused and v.scores["unsafe"] < 0.5


def test_a_prompt_the_model_calls_unsafe_is_refused_and_named(model_dir):
    check = GuardModelCheck(GuardModelConfig(model=str(model_dir), dtype="float32"), "cpu")
    forced(check, "unsafe", "S4")
    verdicts = check.check(["a lighthouse on a cliff", "on a cliff"])
    assert [v.refused for v in verdicts] == [True, True]
    # the code is read from what the model wrote ("unsafe S4 S4 ..."), and named as the policy names it
    assert [(v.category, v.score > 0.99) for v in verdicts] == [("sexual_minors", True)] * 2
    assert "S4" in verdicts[0].label and verdicts[0].backend == "guard-model"


def test_an_answer_without_a_code_refuses_as_other(model_dir):
    check = GuardModelCheck(GuardModelConfig(model=str(model_dir), dtype="float32"), "cpu")
    forced(check, "unsafe")
    [v] = check.check(["a lighthouse"])
    assert v.refused and v.category == "other" and "no category given" in v.label


def test_the_answer_codes_map_onto_the_policy():
    assert parse_codes("unsafe\nS4,S12") == ["S4", "S12"]
    assert parse_codes("unsafe\nS10 S10") == ["S10"]
    assert parse_codes("safe") == []
    cats = GuardModelConfig().categories
    assert [cats[c] for c in ("S1", "S4", "S10", "S11", "S12")] == ["violence", "sexual_minors", "hate",
                                                                    "self_harm", "sexual"]


def test_the_guard_runs_it_after_the_lists_and_self_tests_it(model_dir):
    cfg = SafetyConfig(text=TextCheckConfig(backend="guard-model", device="cpu",
                                            guard_model=GuardModelConfig(model=str(model_dir), dtype="float32")),
                       image={"backend": "off"})
    guard = Guard.load(cfg)  # the self-test ran one prompt through the model
    assert "guard-model" in guard.describe()
    forced(guard.text_check, "unsafe", "S12")
    v = guard.screen_prompt("a lighthouse on a cliff")
    assert v.refused and v.backend == "guard-model" and v.policy == guard.policy_version


def test_a_model_that_cannot_load_names_the_field(tmp_path):
    with pytest.raises(SafetyLoadError, match="safety.text.guard_model.model"):
        GuardModelCheck(GuardModelConfig(model=str(tmp_path / "nothing-here")), "cpu")
