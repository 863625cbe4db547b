"""The report's modelled section (verispec.costmodel): a run's decode counts priced with a hardware profile, kept
apart from what was measured."""

from __future__ import annotations

from typing import Any

from verispec.bench.metrics import one_token_target_seconds, theoretical_speedup
from verispec.bench.tables import Column, format_table, value_column


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{1e3 * seconds:.{1 if seconds >= 0.01 else 3}f}"  # CPU ~100 ms, GPU < 1 ms


def _ms_pair(row: dict[str, Any], part: str) -> str:
    tokens = row["tokens"] or 1
    return f"{_ms(row[f'measured_{part}'] / tokens)} / {_ms(row[f'modelled_{part}'] / tokens)}"


def render_modelled(results: dict[str, Any], profile: Any, baseline: str, peer_profile: Any = None) -> str:
    """Return the markdown section of modelled times: this run's decode counts priced with `profile`, the
    transformers peers' with `peer_profile` when given (they run their own linear path)."""
    from verispec.bench.peers import PEERS
    from verispec.costmodel import KIND_MODELLED, cost_ratios, modelled_speedup, other_drafter_rounds
    from verispec.variants import parse_method

    cfg = results["config"]
    peers = [m for m in cfg["methods"] if m.split(":")[0] in PEERS]
    rows = modelled_speedup(results["records"], profile, baseline,
                            {m: peer_profile for m in peers} if peer_profile is not None else None)
    alpha = {r["method"]: r.get("alpha") for r in results["aggregate"]}
    for row in rows:  # the SD formula at each method's own γ and at the c, f of the profile that prices it
        priced = peer_profile if peer_profile is not None and row["method"] in peers else profile
        gamma = int(parse_method(row["method"], {row["method"].split(":")[0]}).overrides.get("gamma", cfg["gamma"]))
        traces = [r["trace"] for r in results["records"] if r["method"] == row["method"]]
        model_drafts = {"target", "draft"} <= set(priced.models) and not other_drafter_rounds(traces)
        c, f = cost_ratios(priced, gamma) if model_drafts else (None, None)
        row["profile_theory"] = theoretical_speedup(alpha.get(row["method"]), gamma, c, f)
    c, f = cost_ratios(profile, cfg["gamma"]) if {"target", "draft"} <= set(profile.models) else (None, None)
    target = profile.models.get("target")
    device = cfg.get("device", "cpu")
    run = (cfg["dtype"], device, cfg.get("linear_backend", "torch") if device.startswith("cpu") else "torch")
    # Only a profile measured on this machine and device can be checked against this run's measured times.
    here = (profile.kind != KIND_MODELLED and target is not None and target.device == run[1]
            and profile.machine.get("platform") == results["machine"].get("platform"))
    accelerator = profile.kind == KIND_MODELLED or (target is not None and target.device != "cpu")
    columns: list[Column] = [
        ("method", lambda r: str(r["method"])),
        value_column("measured speedup", "measured_speedup", ".2f", "x"),
        ("modelled ms/token", lambda r: _ms(r["modelled_seconds_per_token"])),
        value_column("modelled speedup", "modelled_speedup", ".2f", "x"),
        value_column("theoretical speedup at profile c, f", "profile_theory", ".2f", "x"),
    ]
    if here:
        columns[1:1] = [("measured ms/token", lambda r: _ms(r["measured_seconds_per_token"]))]
        columns += [value_column("modelled / measured", "model_over_measured", ".3f")]
        columns += [(f"{part} ms/token measured / modelled", lambda r, p=part: _ms_pair(r, p))
                    for part in ("target", "draft", "verify", "other")]
    title = ("Modelled (measured profile) vs measured" if here else "Modelled (accelerator profile)" if accelerator
             else "Modelled (profile of another machine)")
    lines = [f"## {title}", "",
             f"**Modelled, not measured.** Profile: {profile.description}. Each decode's recorded counts (target "
             "forwards with their token counts, draft forwards, rounds) are priced with the profile's forward costs "
             "t(k), context slope and per-round overheads (verispec/costmodel.py)"
             + (f"; c = {c:.3f}, f(γ+1) = {f:.2f}." if c is not None else ".")]
    t1_run = one_token_target_seconds([r for r in results["records"] if r["method"] == baseline]) if here else None
    if t1_run is not None:
        t1_profile = target.forward_seconds(1, target.context)
        lines.append(f"Machine speed: this run's own 1-token target forwards (`{baseline}`'s decode rounds) took "
                     f"{_ms(t1_run)} ms on average, the profile's {_ms(t1_profile)} ms ({t1_run / t1_profile:.2f}x). "
                     "A machine that runs slower or faster than when it was profiled moves every modelled / "
                     "measured ratio below by about that factor.")
    if here and (target.dtype, target.device, target.linear_backend) != run:
        lines.append(f"Warning: the profile was measured with {target.dtype} on {target.device} (linear backend "
                     f"{target.linear_backend}), the run used {run[0]} on {run[1]} (linear backend {run[2]}).")
    if peers and peer_profile is not None:
        peer_target = peer_profile.models.get("target")
        lines.append(f"The transformers peers ({', '.join(peers)}) are priced with a second profile: "
                     f"{peer_profile.description}.")
        peer_run = cfg.get("peer_linear_backend", "torch") if device.startswith("cpu") else "torch"
        if peer_target is not None and peer_target.linear_backend != peer_run:
            lines.append(f"Warning: the peer profile's linear backend is {peer_target.linear_backend}, the peers "
                         f"ran with {peer_run}.")
    elif peers and here:
        lines.append(f"The transformers peers ({', '.join(peers)}) ran with their own linears "
                     f"({cfg.get('peer_linear_backend', 'torch')}) but are priced with this profile: pass a profile "
                     f"of that path (`verispec report --peer-profile`) to model them.")
    return "\n".join([*lines, "", format_table(rows, columns)])
