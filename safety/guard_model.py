"""A safety classifier of the Llama Guard kind as the prompt check (`safety.text.backend =
"guard-model"`), run after the policy lists on rank 0's GPU or CPU.

Llama Guard 3 (1B and 8B) reads a conversation through its chat template, which lists its hazard
categories, and answers "safe", or "unsafe" and the codes of the categories broken ("S4,S12"). The
check reads the probability of "unsafe" as the first answer token (one forward pass for a batch:
Meta's model card suggests this score for a threshold of one's own), and only for a refused prompt
the codes, from a few greedy tokens more. The codes map onto the policy's categories
(`safety.text.guard_model.categories`): a refusal names the policy's category, as a list refusal
does. A code the mapping does not name refuses as "other".

Loaded with transformers from a Hub id or a local directory (`HF_HUB_OFFLINE=1` honoured); the
weights of Llama Guard 3 are gated on the Hub: accept the licence, download once, point `model`
at the directory.
"""

from __future__ import annotations

import re

from safety.config import GuardModelConfig
from safety.device import on_stream, own_stream, weights_mb
from safety.verdicts import SafetyLoadError, Verdict

_CODES = re.compile(r"\bS(\d{1,2})\b")


def parse_codes(text: str) -> list[str]:
    """The category codes in an answer ("unsafe\\nS4,S12" -> ["S4", "S12"]), in order, once each."""
    return list(dict.fromkeys(f"S{n}" for n in _CODES.findall(text)))


class GuardModelCheck:
    name = "guard-model"

    def __init__(self, cfg: GuardModelConfig, device: str) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        try:
            self._tok = AutoTokenizer.from_pretrained(cfg.model, revision=cfg.revision)
            self._model = AutoModelForCausalLM.from_pretrained(
                cfg.model, revision=cfg.revision, torch_dtype=getattr(torch, cfg.dtype)).to(device).eval()
        except Exception as e:
            raise SafetyLoadError(f"safety.text.guard_model.model: cannot load {cfg.model!r}: "
                                  f"{type(e).__name__}: {e}") from e
        if self._tok.chat_template is None:
            raise SafetyLoadError(f"safety.text.guard_model.model: {cfg.model!r} has no chat template; a guard "
                                  "model reads the conversation through its own")
        self._safe, self._unsafe = (self._first_token(w, cfg.model) for w in ("safe", "unsafe"))
        if self._tok.pad_token_id is None:
            self._tok.pad_token = self._tok.eos_token
        self._tok.padding_side = "left"  # the answer's first token is predicted at the last position
        self._device = device
        self._stream = own_stream(device)
        self._cfg = cfg
        self.placement = f"{cfg.model} on {device} ({cfg.dtype}), {weights_mb(self._model):.1f} MiB"

    def _first_token(self, word: str, model: str) -> int:
        ids = self._tok.encode(word, add_special_tokens=False)
        if not ids:
            raise SafetyLoadError(f"safety.text.guard_model.model: {model!r}: its tokenizer has no token for {word!r}")
        return ids[0]

    def _conversation(self, prompt: str) -> str:
        messages = [{"role": "user", "content": prompt}]
        try:
            return self._tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        except Exception:  # Llama Guard 3 1B's template takes a list of typed parts
            messages = [{"role": "user", "content": [{"type": "text", "text": prompt}]}]
            return self._tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def check(self, prompts: list[str]) -> list[Verdict]:
        import torch

        if not prompts:
            return []
        batch = self._tok([self._conversation(p) for p in prompts], return_tensors="pt", padding=True,
                          add_special_tokens=False)
        with torch.inference_mode(), on_stream(self._stream):
            batch = batch.to(self._device)
            logits = self._model(**batch).logits[:, -1, :].float()
            pair = torch.stack([logits[:, self._safe], logits[:, self._unsafe]], dim=1)
            p_unsafe = torch.softmax(pair, dim=1)[:, 1].tolist()
            refused = [i for i, p in enumerate(p_unsafe) if p >= self._cfg.threshold]
            answers = self._answers(batch, refused) if refused else {}
        out = []
        for i, p in enumerate(p_unsafe):
            scores = {"unsafe": round(p, 4)}
            if i not in answers:
                out.append(Verdict(False, self.name, scores))
                continue
            codes = parse_codes(answers[i])
            mapped = [self._cfg.categories.get(c, "other") for c in codes] or ["other"]
            out.append(Verdict(True, self.name, scores, mapped[0], p,
                               label=f"{mapped[0].replace('_', ' ')} ({', '.join(codes) or 'no category given'})"))
        return out

    def _answers(self, batch, rows: list[int]) -> dict[int, str]:
        """The answers of the refused prompts, a few greedy tokens each, for their category codes."""
        sub = {k: v[rows] for k, v in batch.items()}
        gen = self._model.generate(**sub, max_new_tokens=self._cfg.answer_tokens, do_sample=False,
                                   pad_token_id=self._tok.pad_token_id)
        texts = self._tok.batch_decode(gen[:, sub["input_ids"].shape[1]:], skip_special_tokens=True)
        return dict(zip(rows, texts))
