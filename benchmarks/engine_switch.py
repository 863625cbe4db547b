"""One engine switch on and off, paired on the same prompts: the thread rule, verispec's decoder loop, its in-place
KV cache, fused projections, or int4.

`--switch thread-rule`: with the draft in llama.cpp and the target in torch, both thread pools share the cores; the
engine keeps torch at one thread outside the target's forwards so that no OpenMP worker spins while llama.cpp
computes (`verispec.models.threads`). Off: `verispec.engine.shared_cores` replaced by a pass-through.
`--switch decoder-loop`: the target runs on verispec's decoder loop (`verispec.models.lean`); off: on transformers'
forward (`HFCausalLM.set_decoder_loop(False)`).
`--switch kv-cache`: the decoder loop writes its KV cache in place (`verispec.models.kv_cache`); off: it appends to
transformers' DynamicCache by concatenation.
`--switch fused-projections`: on the int4 backend the decoder loop runs q/k/v and gate/up as one kernel call each
(`verispec.models.fused`, bit-identical); off: one call per layer.
`--switch int4`: the target on the int4 linear backend (its 4-bit GGUF layers in 4 bits, verispec.models.int4);
off: on int8. Two decoders are loaded; their numerics differ, so the arms may write different tokens (counted).

Each prompt is decoded with the switch on and off, alternating which arm goes first from prompt to prompt; the
script prints the ratio of total time per token with a 95% percentile-bootstrap interval over prompts, per run
(`ar`, or `sd` with the named drafter). Both arms must write the same tokens (checked).

    .venv/bin/python benchmarks/engine_switch.py --switch thread-rule [--prompts 10] [--offset 20] \
        [--runs model hybrid] [--out results/thread-sharing.json]
    .venv/bin/python benchmarks/engine_switch.py --switch decoder-loop --runs ar model hybrid \
        --out results/decoder-loop.json

HumanEval problems (or `--source` prompts) from position `--offset` of the seed-0 order (the main llama.cpp runs
use positions 0-19 of HumanEval); int8 target (`--linear-backend` chooses for every switch but int4), llama.cpp
draft (needs `make peers`; `--draft default` takes the torch draft on the same backend), T = 0, γ = 4, 128 new
tokens.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

import verispec.engine
from verispec.api import Decoder
from verispec.bench.files import write_atomically
from verispec.prompt_sets import load_prompts
from verispec.stats import paired_speedup

ARMS = ("on", "off")


@contextlib.contextmanager
def _no_rule(*models: Any) -> Iterator[tuple[Any, ...]]:
    yield models


def switch_setter(switch: str, decoder: Decoder) -> Callable[[bool], None]:
    """Return a function that turns `switch` on (True) or off (False)."""
    if switch == "thread-rule":
        rule = verispec.engine.shared_cores

        def set_rule(on: bool) -> None:
            verispec.engine.shared_cores = rule if on else _no_rule

        return set_rule
    if switch == "decoder-loop":
        return decoder.model("target").set_decoder_loop
    if switch == "kv-cache":
        return lambda on: decoder.model("target").set_decoder_loop(True, in_place_cache=on)
    if switch == "fused-projections":
        def set_fused(on: bool) -> None:
            for role in ("target", "draft"):
                model = decoder.model(role)
                if hasattr(model, "set_decoder_loop"):  # a torch model (not llama.cpp)
                    model.set_decoder_loop(True, fuse=on)

        return set_fused
    return lambda on: None  # int4: the arms are two decoders


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--switch", required=True,
                        choices=["thread-rule", "decoder-loop", "kv-cache", "fused-projections", "int4"])
    parser.add_argument("--linear-backend", default="int8", choices=["int8", "int4"],
                        help="the target's linears (not for --switch int4, whose arms are int4 and int8)")
    parser.add_argument("--prompts", type=int, default=10)
    parser.add_argument("--source", default="humaneval", help="the prompt set (as `verispec bench --prompts`)")
    parser.add_argument("--category", nargs="+", default=None, help="only these categories of the prompt set")
    parser.add_argument("--offset", type=int, default=20)
    parser.add_argument("--runs", nargs="+", default=["model", "hybrid"],
                        help="ar, or a drafter for sd (model, ngram, hybrid)")
    parser.add_argument("--draft", default="llamacpp:default", help="the draft model (as `verispec bench --draft`)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=None, help="results JSON (default results/SWITCH.json)")
    args = parser.parse_args()
    out_path = Path(args.out or f"results/{args.switch}.json")
    torch.set_num_threads(args.threads)
    decoder = Decoder(None, args.draft, linear_backend="int8" if args.switch == "int4" else args.linear_backend)
    decoders = {"on": Decoder(None, args.draft, linear_backend="int4"), "off": decoder} \
        if args.switch == "int4" else {"on": decoder, "off": decoder}
    prompts = load_prompts(args.source, category=args.category, limit=args.prompts, seed=0, offset=args.offset)
    for d in {id(d): d for d in decoders.values()}.values():  # load and warm up
        d.generate("def f(x):", method="sd", gamma=4, max_new_tokens=8, temperature=0)
    set_switch = switch_setter(args.switch, decoder)
    differing = 0
    records: list[dict[str, Any]] = []
    for run in args.runs:
        settings = {"method": "ar"} if run == "ar" else {"method": "sd", "gamma": 4, "drafter": run}
        for i, prompt in enumerate(prompts):
            tokens = {}
            for arm in ARMS if i % 2 == 0 else ARMS[::-1]:
                set_switch(arm == "on")
                start = time.perf_counter()
                out = decoders[arm].generate(prompt.text, max_new_tokens=128, temperature=0, **settings)
                seconds = time.perf_counter() - start
                tokens[arm] = out.tokens
                records.append({"run": run, "prompt": i, "arm": arm, "seconds": seconds,
                                "tokens": len(out.tokens), "draft_calls": out.trace.draft_calls,
                                "target_calls": out.trace.target_calls})
                print(f"{run:7s} prompt {i:2d} {arm:3s} {seconds / len(out.tokens) * 1e3:6.1f} ms/token", flush=True)
            if tokens["on"] != tokens["off"]:
                if args.switch != "int4":
                    raise SystemExit(f"the two arms wrote different tokens on prompt {i} ({run})")
                differing += 1
    set_switch(True)
    summary = []
    for run in args.runs:
        pairs = {arm: [(r["seconds"], r["tokens"]) for r in records if r["run"] == run and r["arm"] == arm]
                 for arm in ARMS}
        speedup, interval = paired_speedup(pairs["off"], pairs["on"], 2000, 0)
        ms = {arm: sum(s for s, _ in pairs[arm]) / sum(n for _, n in pairs[arm]) * 1e3 for arm in ARMS}
        summary.append({"run": run, "ms_per_token_on": ms["on"], "ms_per_token_off": ms["off"],
                        "speedup_of_switch": speedup, "ci95": interval})
        low, high = interval if interval is not None else (float("nan"), float("nan"))
        print(f"{run}: {args.switch} on {ms['on']:.1f} ms/token, off {ms['off']:.1f}: on runs {speedup:.3f}x "
              f"[{low:.3f}, {high:.3f}] over {len(pairs['on'])} prompts")
    if args.switch == "int4":
        print(f"the arms wrote different tokens on {differing} of {len(prompts) * len(args.runs)} decodes")
    payload = {"settings": vars(args), "linear_kernels": {arm: d.linear_kernels() for arm, d in decoders.items()},
               "summary": summary, "differing_decodes": differing, "records": records}
    write_atomically(out_path, json.dumps(payload, indent=1, default=list) + "\n")
    print(f"wrote {out_path}")


if __name__ == "__main__":
    main()
