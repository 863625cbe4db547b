"""The public Python API: `Decoder` keeps a model pair loaded; `generate` is the one-call convenience."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from verispec.drafters import uses_draft_model
from verispec.engine import DecodeConfig, Engine
from verispec.errors import ConfigError
from verispec.inputs import check_prompt
from verispec.limits import check_context
from verispec.logprobs import TokenLogprob
from verispec.methods import get_method
from verispec.models.hf import HFCausalLM
from verispec.models.pair import check_compatible, encode_prompt, eos_token_ids
from verispec.models.protocol import CausalLM
from verispec.models.spec import MODEL_SETTINGS, ROLES, ModelSpec
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
    verifier: dict[str, Any] | None = None  # SPRINTER's verifier file and threshold, for methods that have one
    # one per token with `logprobs=k` (verispec.logprobs: its log-probability and the k likeliest tokens), else None
    logprobs: list[TokenLogprob] | None = None

    def to_dict(self) -> dict[str, Any]:
        """Return the generation, its configuration and the whole trace as a JSON-able dict."""
        return {
            "text": self.text,
            "tokens": self.tokens,
            "prompt_tokens": self.prompt_tokens,
            "stopped_at_eos": self.stopped_at_eos,
            "config": asdict(self.config),
            "trace": self.trace.to_dict(),
        } | ({"verifier": self.verifier} if self.verifier is not None else {}) | (
            {"logprobs": [asdict(entry) for entry in self.logprobs]} if self.logprobs is not None else {})


class Decoder:
    """A draft/target pair kept loaded for many generations. Models load lazily, on first use.

    `target`: a `ModelSpec` (the whole choice of models), or the target model as `ModelSpec.target` takes it
    (None or "default" for the embedded Qwen2.5-Coder pair, a hub id, a local folder, a .gguf file, or an already
    built `HFCausalLM`); `draft` likewise; `settings`: ModelSpec's other fields by name (dtype, device, ...), over
    the spec's when `target` is one. An unknown name is a ConfigError listing the valid ones.
    """

    def __init__(
        self,
        target: ModelSpec | str | HFCausalLM | None = None,
        draft: str | HFCausalLM | None = None,
        **settings: Any,
    ) -> None:
        if isinstance(target, ModelSpec):
            models = target.with_settings(**settings, **({} if draft is None else {"draft": draft}))
        else:
            models = ModelSpec().with_settings(target=target, draft=draft, **settings)
        if isinstance(models.verifier, (str, Path)):
            from verispec.learned import LearnedVerifier

            LearnedVerifier.load(models.verifier)  # the file itself; whether it fits the draft is checked once loaded
        self.models = models
        self._verifier_spec = models.verifier  # a LearnedVerifier file path (loaded on first use) or object
        self._verifier_file: str | None = None  # the file it came from, once loaded
        self._models: dict[str, HFCausalLM] = {
            role: model for role in ROLES if isinstance(model := getattr(models, role), HFCausalLM)
        }
        self._reduced_drafts: dict[int, HFCausalLM] = {}  # draft_vocab N -> the draft with a head of N tokens
        if len(self._models) == 2:
            check_compatible(self._models["target"], self._models["draft"])

    def model(self, role: str) -> HFCausalLM:
        """Return the loaded model for `role` ("target" or "draft"), loading it on first use."""
        if role not in self._models:
            self._models[role] = self.models.load(role)
            other = "draft" if role == "target" else "target"
            if other in self._models:
                check_compatible(self._models["target"], self._models["draft"])
        return self._models[role]

    def build_prompt_copies(self) -> None:
        """Build now, for every loaded model, what its first long prompt would otherwise build (the prompt copies of
        a model loaded straight from its GGUF, `verispec.models.gguf_layers.build_prompt_copies`): for timed runs
        and servers, whose first long prompt must not pay for it."""
        from verispec.models.gguf_layers import build_prompt_copies

        for model in self._models.values():
            if isinstance(model, HFCausalLM):
                build_prompt_copies(model.model)

    def loaded_models(self) -> dict[str, HFCausalLM]:
        """Return the models loaded so far, by role ("target", "draft")."""
        return dict(self._models)

    def linear_kernels(self) -> dict[str, str]:
        """Return, per loaded model ("target", "draft"), which linear kernels and weight types it runs (and, for a
        transformers model, which decoder loop)."""
        def describe(model: CausalLM) -> str:
            return model.linear_kernel + (f"; {model.decoder_loop}" if model.decoder_loop else "")

        return {role: describe(model) for role, model in self._models.items()}

    def reduced_draft(self, n: int) -> HFCausalLM:
        """Return the draft model with its output layer sliced to N = `n` tokens (`verispec.models.vocab`), loaded
        on first use: a copy of its own, since the slicing happens before the weights are packed."""
        if n not in self._reduced_drafts:
            spec = self.models.draft
            if isinstance(spec, HFCausalLM) and spec.draft_vocab != n:
                raise ConfigError(f"draft_vocab={n} needs the draft given by name or folder (its head is sliced "
                                  f"at load), or an HFCausalLM built with vocab_ids of {n} tokens", field="draft_vocab")
            model = self.models.load("draft", draft_vocab=n)
            if "target" in self._models:
                check_compatible(self._models["target"], model)
            self._reduced_drafts[n] = model
        return self._reduced_drafts[n]

    def verifier(self) -> Any:
        """Return SPRINTER's learned verifier, loaded (and checked against the draft model) on first use: the file
        given, else the one verispec ships for the draft model (`verispec.learned.verifier.PACKAGED_DIR`)."""
        if self._verifier_spec is None or isinstance(self._verifier_spec, (str, Path)):
            from verispec.learned.verifier import LearnedVerifier, packaged_verifier_path

            draft = self.model("draft")
            hidden_size = draft.hidden_size
            if hidden_size is None:
                raise ConfigError(f"SPRINTER's verifier reads the draft's hidden states, and the draft {draft.name!r} "
                                  f"({draft.linear_kernel}) gives none: use a torch draft")
            path = self._verifier_spec or packaged_verifier_path(draft.name)
            if path is None:
                raise ConfigError(f"SPRINTER methods need a learned verifier for the draft {draft.name!r}, and none "
                                  f"ships for it: train one (`verispec verifier collect`, then `train`) and pass "
                                  f"verifier=FILE (CLI: --verifier FILE)")
            self._verifier_spec = LearnedVerifier.load(path, expected_draft=draft.name,
                                                       expected_hidden_size=hidden_size)
            self._verifier_file = str(path)
        return self._verifier_spec

    def verifier_used(self, config: DecodeConfig) -> dict[str, Any] | None:
        """Return which verifier file and threshold a decode with `config` runs (None for a method without one)."""
        if not get_method(config.method).learned_stop:
            return None
        verifier = self.verifier()
        threshold = verifier.threshold if config.tau is None else config.tau
        return {"file": self._verifier_file, "threshold": threshold,
                "features": verifier.features, "draft_model": verifier.draft_model}

    @property
    def tokenizer(self) -> Any:
        """Return the tokenizer (the target's; the draft's when only the draft is used)."""
        role = "target" if "target" in self._models or "draft" not in self._models else "draft"
        return self.model(role).tokenizer

    def encode_prompt(self, prompt: str, chat_template: bool = True) -> list[int]:
        """Return the prompt's token ids, through the tokenizer's chat template when it has one."""
        check_prompt(prompt)  # before the tokenizer loads the models
        return encode_prompt(self.tokenizer, prompt, chat_template)

    def eos_token_ids(self, role: str) -> set[int]:
        """Return the token ids that end generation: the tokenizer's EOS and the model's generation EOS ids."""
        return eos_token_ids(self.model(role))

    def engine(self, config: str | DecodeConfig, views: Mapping[str, CausalLM] | None = None,
               load: Callable[[], int] | None = None) -> Engine:
        """Return an `Engine` over the models a decode with `config` (or a method's name, with the default drafter)
        needs, loaded on first use, for decoding token ids. `views`: per role, a model to run in place of the loaded
        one (a server slot's view of it with a cache of its own, `verispec.models.batched.SlotLM`); `load`: how many
        sequences share its passes (`Engine`)."""
        spec = get_method(config if isinstance(config, str) else config.method)
        models = self.models_for(config)
        if views is not None:
            models = {role: views[role] for role in models}
        verifier = self.verifier() if spec.learned_stop else None
        return Engine(models.get("target"), models.get("draft"), self.eos_token_ids(spec.decoder), verifier, load)

    def models_for(self, config: str | DecodeConfig) -> dict[str, HFCausalLM]:
        """Return the models a decode with `config` (or a method's name) runs, by role ("target", "draft"), loading
        them on first use: no draft model for a lookup-only drafter; a sliced draft under `draft_vocab`."""
        config = DecodeConfig(method=config) if isinstance(config, str) else config
        spec = get_method(config.method)
        roles = {spec.decoder} | ({"draft"} if spec.speculative and uses_draft_model(config.drafter) else set())
        vocab = config.draft_vocab
        return {role: self.model(role) if role == "target" or vocab is None else self.reduced_draft(vocab)
                for role in sorted(roles, reverse=True)}  # target first

    def generate(
        self,
        prompt: str,
        config: DecodeConfig | None = None,
        *,
        chat_template: bool = True,
        stop_text: Callable[[str], bool] | None = None,
        **settings: Any,
    ) -> Generation:
        """Decode `prompt` with `config` (default: `DecodeConfig()`) changed by `settings`; return the text, the
        token ids and the trace.

        `settings` are what `DecodeConfig.with_settings` takes: its field names (method, gamma, paths, drafter,
        ...), the sampling settings by name (temperature, top_k, top_p) and the lossy rules' knobs
        (typical_epsilon, ...); a setting of another name is a ConfigError naming it. `chat_template`: encode the
        prompt through the tokenizer's chat template; `stop_text`: asked after each round with the text so far, a
        true answer ends the decode there.
        """
        config = resolve_config(config, settings)
        check_prompt(prompt)
        models = self.models_for(config)
        prompt_ids = self.encode_prompt(prompt, chat_template)
        check_context(len(prompt_ids), config.max_new_tokens, models.get("target"), models.get("draft"))
        engine = self.engine(config)
        on_commit = None
        if stop_text is not None:
            new: list[int] = []

            def on_commit(committed: list[int]) -> bool:  # asked each round with the text generated so far
                new.extend(committed)
                return stop_text(self.tokenizer.decode(new, skip_special_tokens=True))
        out = engine.decode(prompt_ids, config, on_commit)
        text = self.tokenizer.decode(out.tokens, skip_special_tokens=True)
        return Generation(text, out.tokens, len(prompt_ids), out.stopped_at_eos, config, out.trace,
                          self.verifier_used(config), out.logprobs)


def resolve_config(config: DecodeConfig | None, settings: Mapping[str, Any]) -> DecodeConfig:
    """Return `config` (None: the defaults) with `settings` applied by `DecodeConfig.with_settings`."""
    if config is not None and not isinstance(config, DecodeConfig):
        raise ConfigError(f"config must be a DecodeConfig, got {type(config).__name__} {config!r}; give settings by "
                          f"name, e.g. generate(prompt, method='sd', gamma=4)")
    return (config or DecodeConfig()).with_settings(**settings)


_DECODERS: dict[ModelSpec, Decoder] = {}


def generate(
    prompt: str,
    config: DecodeConfig | None = None,
    *,
    models: ModelSpec | None = None,
    chat_template: bool = True,
    **settings: Any,
) -> Generation:
    """Decode `prompt` with `config` changed by `settings` (as `Decoder.generate`) on the pair `models` (default: the
    embedded pair) changed by the `settings` named as ModelSpec's fields (target, draft, dtype, device, ...); return
    a `Generation`.

    Models stay loaded between calls with the same models and settings.
    """
    model_settings = {name: settings.pop(name) for name in MODEL_SETTINGS if name in settings}
    config = resolve_config(config, settings)  # a bad setting fails before minutes of loading
    spec = (models or ModelSpec()).with_settings(**model_settings)
    if spec not in _DECODERS:
        _DECODERS[spec] = Decoder(spec)
    return _DECODERS[spec].generate(prompt, config, chat_template=chat_template)
