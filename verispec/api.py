"""The public Python API: `Decoder` keeps a model pair loaded; `generate` is the one-call convenience."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from verispec.drafters import uses_draft_model
from verispec.engine import DecodeConfig, Engine
from verispec.errors import ConfigError, IncompatibleModelsError
from verispec.methods import get_method
from verispec.models.fastpath import check_linear_backend
from verispec.models.hf import HFCausalLM, parse_dtype
from verispec.models.loading import DEFAULT_LINEAR_BACKEND, load_model
from verispec.sampling import SamplingConfig
from verispec.trace import Trace


@dataclass
class Generation:
    """The result of one `generate` call."""

    text: str  # the generated text (special tokens such as EOS removed)
    tokens: list[int]  # the generated token ids (EOS included when it ended the output)
    prompt_tokens: int  # length of the encoded prompt (after the chat template)
    stopped_at_eos: bool
    config: DecodeConfig
    trace: Trace

    def to_dict(self) -> dict[str, Any]:
        """Return the generation, its configuration and the whole trace as a JSON-able dict."""
        return {
            "text": self.text,
            "tokens": self.tokens,
            "prompt_tokens": self.prompt_tokens,
            "stopped_at_eos": self.stopped_at_eos,
            "config": asdict(self.config),
            "trace": self.trace.to_dict(),
        }


def check_compatible(target: HFCausalLM, draft: HFCausalLM) -> None:
    """Raise IncompatibleModelsError unless draft and target share the vocabulary and the tokenizer."""
    if target.vocab_size != draft.vocab_size:
        raise IncompatibleModelsError(
            f"draft and target have different vocabularies: target {target.name!r} has {target.vocab_size} "
            f"output tokens, draft {draft.name!r} has {draft.vocab_size}; speculative decoding needs one vocabulary"
        )
    if target.tokenizer is not None and draft.tokenizer is not None:
        if target.tokenizer.get_vocab() != draft.tokenizer.get_vocab():
            raise IncompatibleModelsError(
                f"draft {draft.name!r} and target {target.name!r} use different tokenizers (their token-to-id "
                f"maps differ); speculative decoding needs the same tokenizer"
            )


class Decoder:
    """A draft/target pair kept loaded for many generations. Models load lazily, on first use.

    `target`/`draft`: None or "default" for the embedded Qwen2.5-Coder pair, a hub id, a local folder, a .gguf
    file, or an already built `HFCausalLM`.
    """

    def __init__(
        self,
        target: str | HFCausalLM | None = None,
        draft: str | HFCausalLM | None = None,
        dtype: str | torch.dtype = "float32",
        device: str = "cpu",
        verifier: str | Any = None,
        linear_backend: str = DEFAULT_LINEAR_BACKEND,
        draft_dtype: str | torch.dtype | None = None,
    ) -> None:
        parse_dtype(dtype)  # fail on a bad dtype now, not after minutes of loading
        if draft_dtype is not None:
            parse_dtype(draft_dtype)
        check_linear_backend(linear_backend)
        self.dtype, self.device, self.linear_backend = dtype, device, linear_backend
        # The draft may run in a cheaper dtype: every lossless method keeps the target's law whatever q is.
        self.draft_dtype = draft_dtype if draft_dtype is not None else dtype
        self._verifier_spec = verifier  # a LearnedVerifier file path (loaded on first use) or object
        self._specs = {"target": target, "draft": draft}
        self._models: dict[str, HFCausalLM] = {
            role: spec for role, spec in self._specs.items() if isinstance(spec, HFCausalLM)
        }
        self._reduced_drafts: dict[int, HFCausalLM] = {}  # draft_vocab N -> the draft with a head of N tokens
        if len(self._models) == 2:
            check_compatible(self._models["target"], self._models["draft"])

    def model(self, role: str) -> HFCausalLM:
        """Return the loaded model for `role` ("target" or "draft"), loading it on first use."""
        if role not in self._models:
            spec = self._specs[role]
            dtype = self.draft_dtype if role == "draft" else self.dtype
            self._models[role] = load_model(spec, role, dtype=dtype, device=self.device,
                                            linear_backend=self.linear_backend)
            other = "draft" if role == "target" else "target"
            if other in self._models:
                check_compatible(self._models["target"], self._models["draft"])
        return self._models[role]

    def reduced_draft(self, n: int) -> HFCausalLM:
        """Return the draft model with its output layer sliced to N = `n` tokens (`verispec.drafters.vocab`), loaded
        on first use: a copy of its own, since the slicing happens before the weights are packed."""
        if n not in self._reduced_drafts:
            spec = self._specs["draft"]
            if isinstance(spec, HFCausalLM):
                if spec.draft_vocab != n:
                    raise ConfigError(f"draft_vocab={n} needs the draft given by name or folder (its head is sliced "
                                      f"at load), or an HFCausalLM built with vocab_ids of {n} tokens")
                model = spec
            else:
                model = load_model(spec, "draft", dtype=self.draft_dtype, device=self.device,
                                   linear_backend=self.linear_backend, draft_vocab=n)
            if "target" in self._models:
                check_compatible(self._models["target"], model)
            self._reduced_drafts[n] = model
        return self._reduced_drafts[n]

    def verifier(self) -> Any:
        """Return SPRINTER's learned verifier, loaded (and checked against the draft model) on first use."""
        if self._verifier_spec is None:
            raise ConfigError("SPRINTER methods need a learned verifier: pass verifier=FILE (CLI: --verifier FILE)")
        if isinstance(self._verifier_spec, (str, Path)):
            from verispec.learned import LearnedVerifier

            draft = self.model("draft")
            self._verifier_spec = LearnedVerifier.load(
                self._verifier_spec, expected_draft=draft.name, expected_hidden_size=draft.model.config.hidden_size
            )
        return self._verifier_spec

    @property
    def tokenizer(self) -> Any:
        """Return the tokenizer (the target's; the draft's when only the draft is used)."""
        role = "target" if "target" in self._models or "draft" not in self._models else "draft"
        return self.model(role).tokenizer

    def encode_prompt(self, prompt: str, chat_template: bool = True) -> list[int]:
        """Return the prompt's token ids, through the tokenizer's chat template when it has one."""
        if not isinstance(prompt, str) or not prompt.strip():
            raise ConfigError("the prompt is empty: give some text to continue")
        tokenizer = self.tokenizer
        if chat_template and getattr(tokenizer, "chat_template", None):
            ids = tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True
            )
            if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # some versions return a BatchEncoding
                ids = ids["input_ids"]
            return list(ids)
        return list(tokenizer(prompt, add_special_tokens=False)["input_ids"])

    def eos_token_ids(self, role: str) -> set[int]:
        """Return the token ids that end generation: the tokenizer's EOS and the model's generation EOS ids."""
        model = self.model(role)
        ids = set()
        if model.tokenizer is not None and model.tokenizer.eos_token_id is not None:
            ids.add(int(model.tokenizer.eos_token_id))
        generation_config = getattr(model.model, "generation_config", None)
        configured = getattr(generation_config, "eos_token_id", None)
        if configured is not None:
            ids.update([configured] if isinstance(configured, int) else configured)
        return ids

    def generate(
        self,
        prompt: str,
        method: str = DecodeConfig.method,
        gamma: int = DecodeConfig.gamma,
        temperature: float = SamplingConfig.temperature,
        top_k: int = SamplingConfig.top_k,
        top_p: float = SamplingConfig.top_p,
        max_new_tokens: int = DecodeConfig.max_new_tokens,
        seed: int = DecodeConfig.seed,
        chat_template: bool = True,
        paths: int = DecodeConfig.paths,
        cap: int = DecodeConfig.cap,
        tau: float | None = DecodeConfig.tau,
        drafter: str = DecodeConfig.drafter,
        ngram_min: int = DecodeConfig.ngram_min,
        ngram_max: int = DecodeConfig.ngram_max,
        draft_vocab: int | None = DecodeConfig.draft_vocab,
    ) -> Generation:
        """Decode `prompt` with `method` (drafting with `drafter`); return the text, the token ids and the trace."""
        sampling = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p)
        config = DecodeConfig(
            method=method, gamma=gamma, max_new_tokens=max_new_tokens, sampling=sampling, seed=seed, paths=paths,
            cap=cap, tau=tau, drafter=drafter, ngram_min=ngram_min, ngram_max=ngram_max, draft_vocab=draft_vocab,
        )
        if not isinstance(prompt, str) or not prompt.strip():
            raise ConfigError("the prompt is empty: give some text to continue")
        spec = get_method(method)
        roles = {spec.decoder} | ({"draft"} if spec.speculative and uses_draft_model(drafter) else set())
        models = {role: self.model(role) if role == "target" or draft_vocab is None else self.reduced_draft(draft_vocab)
                  for role in sorted(roles, reverse=True)}  # target first
        prompt_ids = self.encode_prompt(prompt, chat_template)
        verifier = self.verifier() if spec.learned_stop else None
        engine = Engine(models.get("target"), models.get("draft"), self.eos_token_ids(spec.decoder), verifier)
        out = engine.decode(prompt_ids, config)
        text = self.tokenizer.decode(out.tokens, skip_special_tokens=True)
        return Generation(text, out.tokens, len(prompt_ids), out.stopped_at_eos, config, out.trace)


_DECODERS: dict[tuple, Decoder] = {}


def generate(
    prompt: str,
    method: str = DecodeConfig.method,
    target: str | None = None,
    draft: str | None = None,
    gamma: int = DecodeConfig.gamma,
    temperature: float = SamplingConfig.temperature,
    top_k: int = SamplingConfig.top_k,
    top_p: float = SamplingConfig.top_p,
    max_new_tokens: int = DecodeConfig.max_new_tokens,
    seed: int = DecodeConfig.seed,
    chat_template: bool = True,
    dtype: str = "float32",
    device: str = "cpu",
    paths: int = DecodeConfig.paths,
    cap: int = DecodeConfig.cap,
    tau: float | None = DecodeConfig.tau,
    verifier: str | None = None,
    linear_backend: str = DEFAULT_LINEAR_BACKEND,
    draft_dtype: str | None = None,
    drafter: str = DecodeConfig.drafter,
    ngram_min: int = DecodeConfig.ngram_min,
    ngram_max: int = DecodeConfig.ngram_max,
    draft_vocab: int | None = DecodeConfig.draft_vocab,
) -> Generation:
    """Decode `prompt` with `method` on the given (default: embedded) pair; return a `Generation`.

    Models stay loaded between calls with the same target, draft, dtype and device.
    """
    key = (target, draft, dtype, device, verifier, linear_backend, draft_dtype)
    if key not in _DECODERS:
        _DECODERS[key] = Decoder(target, draft, dtype=dtype, device=device, verifier=verifier,
                                 linear_backend=linear_backend, draft_dtype=draft_dtype)
    return _DECODERS[key].generate(
        prompt, method=method, gamma=gamma, temperature=temperature, top_k=top_k, top_p=top_p,
        max_new_tokens=max_new_tokens, seed=seed, chat_template=chat_template, paths=paths, cap=cap, tau=tau,
        drafter=drafter, ngram_min=ngram_min, ngram_max=ngram_max, draft_vocab=draft_vocab,
    )
