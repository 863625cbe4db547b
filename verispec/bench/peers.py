"""Peers: transformers' own decoding on the same pair, timed and counted like verispec's methods.

* `hf-generate`: `model.generate` of the target (transformers' autoregressive decoding, the `ar` peer);
* `hf-assisted`: `model.generate(assistant_model=draft)`, transformers' assisted generation / speculative sampling,
  with a constant draft length γ and no confidence threshold (so the draft always proposes γ tokens, as `sd` does).
* `hf-lookup`: `model.generate(prompt_lookup_num_tokens=γ)`, transformers' prompt lookup decoding (n-gram matches
  of up to its default 2 tokens; the peer of `--drafter ngram`). Its rounds count as drafted the tokens fed beyond
  the committed ones (no draft model runs).

All go through the public objects only: `Decoder.model(role)` gives the transformers model, and forward hooks
(public PyTorch API) count the calls and the tokens each processed and time each forward. The rounds of the
returned `Trace` are rebuilt from what the target's forwards see: round i starts with the target cache holding L_i
tokens and feeds n_i tokens, d_i of them draft tokens (the draft forwards since the previous target forward; one per
draft token), so the committed sequence then has S_i = L_i + n_i - d_i tokens, and round i emitted S_{i+1} - S_i.

Time split: `time_target` / `time_draft` are the hooked forwards only (for verispec's methods `time_draft` also
holds the draft's sampling); transformers' logits processing and verification fall into `time_other`.

Configuration note (transformers 5.24): `AssistedCandidateGenerator` reads `num_assistant_tokens`,
`num_assistant_tokens_schedule` and `assistant_confidence_threshold` from the *assistant's* `generation_config`,
not from the arguments of `generate`; we set them there for the call (and restore them), and pass them to
`generate` too. The model forward takes the KV cache as `cache=` (not `past_key_values=`).
"""

from __future__ import annotations

import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from verispec.api import Decoder
from verispec.config import DecodeConfig
from verispec.errors import ConfigError
from verispec.limits import check_context
from verispec.sampling import SamplingConfig
from verispec.trace import RoundTrace, Trace

PEERS = {
    "hf-generate": "transformers' model.generate on the target (the `ar` peer)",
    "hf-assisted": "transformers' assisted generation, model.generate(assistant_model=draft), constant γ",
    "hf-lookup": "transformers' prompt lookup decoding, model.generate(prompt_lookup_num_tokens=γ)",
}


@dataclass
class PeerGeneration:
    """A peer's result, shaped like `verispec.Generation` (same `to_dict` keys) so runners treat both alike."""

    text: str
    tokens: list[int]  # the generated token ids (EOS included when it ended the output)
    prompt_tokens: int
    stopped_at_eos: bool
    config: dict[str, Any]  # the peer's settings (method, gamma, sampling, max_new_tokens, seed)
    trace: Trace

    def to_dict(self) -> dict[str, Any]:
        """Return the generation, its configuration and the trace as a JSON-able dict."""
        return {
            "text": self.text, "tokens": self.tokens, "prompt_tokens": self.prompt_tokens,
            "stopped_at_eos": self.stopped_at_eos, "config": self.config, "trace": self.trace.to_dict(),
        }


class _ForwardLog:
    """Forward hooks on transformers models; one event per call, in call order: role, cache length before the
    call, tokens fed, seconds."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int, int, float]] = []
        self._handles: list[Any] = []
        self._sync = lambda: None

    def watch(self, model: Any, role: str) -> None:
        """Record every forward of `model` under `role`."""
        if next(model.parameters()).is_cuda:
            self._sync = torch.cuda.synchronize  # time the kernels, not their launch

        def pre(module: Any, args: tuple, kwargs: dict) -> None:
            ids = kwargs.get("input_ids", args[0] if args else None)  # [1, T]
            cache = kwargs.get("cache")
            self._pending = (role, cache.get_seq_length() if cache is not None else 0, int(ids.shape[-1]))
            self._sync()
            self._start = time.perf_counter()

        def post(module: Any, args: tuple, kwargs: dict, output: Any) -> None:
            self._sync()
            self.events.append((*self._pending, time.perf_counter() - self._start))

        self._handles += [model.register_forward_pre_hook(pre, with_kwargs=True),
                          model.register_forward_hook(post, with_kwargs=True)]

    def close(self) -> None:
        """Remove the hooks."""
        for handle in self._handles:
            handle.remove()

    def rounds(self) -> tuple[list[tuple[int, int, float]], list[tuple[int, float]]]:
        """Return the target calls (cache length, fed, seconds) and, per target call, the draft forwards made
        since the previous one (count, seconds)."""
        target, per_round, count, seconds = [], [], 0, 0.0
        for role, cache, fed, elapsed in self.events:
            if role == "draft":
                count, seconds = count + 1, seconds + elapsed
            else:
                target.append((cache, fed, elapsed))
                per_round.append((count, seconds))
                count, seconds = 0, 0.0
        return target, per_round


@contextmanager
def _assistant_settings(model: Any, gamma: int):
    """Set the assistant's draft length γ (constant schedule, threshold 0) for the call; restore afterwards."""
    config = model.generation_config
    keys = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")
    saved = {key: getattr(config, key, None) for key in keys}
    config.num_assistant_tokens, config.num_assistant_tokens_schedule = gamma, "constant"
    config.assistant_confidence_threshold = 0.0
    try:
        yield
    finally:
        for key, value in saved.items():
            setattr(config, key, value)


TINY_TEMPERATURE = 1e-30


def sampling_kwargs(sampling: SamplingConfig) -> dict[str, Any]:
    """Return `generate` arguments equivalent to verispec's sampling (temperature 0 = greedy).

    Everything is explicit: transformers fills unset values from the model's `generation_config`, and chat models
    ship their own temperature / top-k / top-p / repetition penalty there.
    """
    common = {"repetition_penalty": 1.0, "no_repeat_ngram_size": 0, "typical_p": 1.0}
    # Below TINY_TEMPERATURE, transformers' float32 logits / T overflow (NaN after softmax); verispec samples the
    # T -> 0 limit there (`process_logits`), which is greedy decoding up to exact ties.
    if sampling.greedy or sampling.temperature < TINY_TEMPERATURE:  # warpers unused (transformers warns if passed)
        return {"do_sample": False, **common}
    return {"do_sample": True, "temperature": float(sampling.temperature), "top_k": sampling.top_k,
            "top_p": float(sampling.top_p), **common}


def rounds_from_calls(
    target_calls: list[tuple[int, int, float]],
    draft_per_round: list[tuple[int, float]],
    prompt_tokens: int,
    generated: int,
) -> list[RoundTrace]:
    """Return one `RoundTrace` per target forward, rebuilt as the module docstring says.

    `draft_per_round[i]` = (draft forwards, seconds) before target forward i. Accepted = emitted - 1 (the last
    token of a round is the target's correction or bonus), capped at the drafted count; a final round cut by EOS or
    by max_new_tokens may count one accepted token fewer than the verifier kept.
    """
    pairs = list(zip(target_calls, draft_per_round, strict=True))
    starts = [cache + fed - drafted for (cache, fed, _), (drafted, _) in pairs]
    starts.append(prompt_tokens + generated)
    rounds = []
    for i, ((_, fed, seconds), (drafted, draft_seconds)) in enumerate(pairs):
        emitted = starts[i + 1] - starts[i]
        accepted = min(drafted, max(emitted - 1, 0))
        rounds.append(RoundTrace(drafted, accepted, emitted, fed, time_draft=draft_seconds, time_decode=seconds))
    return rounds


def peer_generate(
    decoder: Decoder,
    prompt: str,
    method: str,
    config: DecodeConfig,
    chat_template: bool = True,
) -> PeerGeneration:
    """Decode `prompt` with peer `method` ("hf-generate", "hf-assisted" or "hf-lookup") under `config`'s γ, sampling,
    max_new_tokens and seed (its method is verispec's, not the peer's: ignored); return a `PeerGeneration`."""
    gamma, sampling, max_new_tokens, seed = config.gamma, config.sampling, config.max_new_tokens, config.seed
    if method not in PEERS:
        raise ConfigError(f"unknown peer {method!r}; choose one of: {', '.join(PEERS)}")
    target = decoder.model("target")
    draft = decoder.model("draft") if method == "hf-assisted" else None
    prompt_ids = decoder.encode_prompt(prompt, chat_template)
    check_context(len(prompt_ids), max_new_tokens, target, draft)
    eos = sorted(decoder.eos_token_ids("target"))
    ids = torch.tensor([prompt_ids], dtype=torch.long, device=target.device)  # [1, P]
    kwargs: dict[str, Any] = dict(
        input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, min_new_tokens=0,
        eos_token_id=eos or None, pad_token_id=eos[0] if eos else None, **sampling_kwargs(sampling),
    )
    log = _ForwardLog()
    log.watch(target.model, "target")
    settings = nullcontext()
    if method == "hf-lookup":
        kwargs |= dict(prompt_lookup_num_tokens=gamma)
    if draft is not None:
        log.watch(draft.model, "draft")
        settings = _assistant_settings(draft.model, gamma)
        kwargs |= dict(assistant_model=draft.model, num_assistant_tokens=gamma,
                       num_assistant_tokens_schedule="constant", assistant_confidence_threshold=0.0)
    try:
        # transformers samples from the global RNG and takes no generator: fork it, so the caller's state is kept.
        with torch.random.fork_rng(devices=[]), torch.inference_mode(), settings:
            torch.manual_seed(seed)
            start = time.perf_counter()
            output = target.model.generate(**kwargs)  # [1, P + generated]
            total = time.perf_counter() - start
    finally:
        log.close()
    tokens = output[0, len(prompt_ids):].tolist()
    target_calls, per_round = log.rounds()
    if method == "hf-lookup":
        # No draft forwards to count: a round's candidates are the tokens fed beyond the committed ones the target
        # cache lacked, the whole prompt in the first round, then one (transformers crops the cache to all but the
        # last committed token after each verification).
        per_round = [(fed - (len(prompt_ids) if i == 0 else 1), 0.0) for i, (_, fed, _) in enumerate(target_calls)]
    draft_calls = [e[1:] for e in log.events if e[0] == "draft"]
    trace = Trace(
        rounds=rounds_from_calls(target_calls, per_round, len(prompt_ids), len(tokens)),
        target_calls=len(target_calls), target_tokens=sum(c[1] for c in target_calls),
        draft_calls=len(draft_calls), draft_tokens=sum(c[1] for c in draft_calls),
        time_target=sum(c[2] for c in target_calls), time_draft=sum(c[2] for c in draft_calls),
        time_total=total, prefill_tokens=len(prompt_ids),
    )
    config = {"method": method, "gamma": gamma, "max_new_tokens": max_new_tokens, "seed": seed,
              "sampling": {"temperature": sampling.temperature, "top_k": sampling.top_k, "top_p": sampling.top_p}}
    text = decoder.tokenizer.decode(tokens, skip_special_tokens=True)
    stopped = bool(tokens) and tokens[-1] in set(eos)
    return PeerGeneration(text, tokens, len(prompt_ids), stopped, config, trace)
