"""Draft proposals: K i.i.d. paths of length γ from the draft model, one forward per depth for all paths.

With K = 1 this is plain autoregressive drafting. With K > 1 the K paths are fed as a tree after the committed
sequence (tree attention), so one draft forward per depth serves all paths (docs/algorithms.md §2.1, "Drafting");
paths that share a prefix share its row, so a depth feeds one token per distinct prefix.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from verispec.models.protocol import CausalLM
from verispec.processors import RoundProcessors, RowOffsets
from verispec.sampling import KeyedNoise, SamplingConfig, draw, greedy_tokens, process_logits
from verispec.verify.tree import PrefixTree

__all__ = ["DraftBlock", "PrefixTree", "StopRule", "draft_paths", "merge_paths"]


@dataclass
class DraftBlock:
    """K draft paths of equal length γ' ≤ γ with their draft conditionals."""

    tokens: list[list[int]]  # [K][γ'] draft tokens of each path
    # [K, γ', V] float64: q[k, i] = q(·| committed + tokens[k][:i]); None where the round's verifier matches tokens
    # only and no law was made (keyed draws, greedy matching: `draft_paths`' `laws`)
    q: torch.Tensor | None
    positions: list[list[int]]  # [K][γ'-1] draft-cache position of tokens[k][i] (the last token is never fed)
    forwards: int  # draft forward passes made
    fed: int  # tokens those passes processed
    scores: list[float] = field(default_factory=list)  # [γ'] stop-rule scores of each drafted token (SPRINTER)
    accepted_by_rule: list[bool] = field(default_factory=list)  # [γ'] the stop rule's decision on each token
    hiddens: list[torch.Tensor] = field(default_factory=list)  # [γ'] the hidden state each token was scored on
    drafter: str = "model"  # which drafter proposed the block ("none" when it drafts nothing)
    # The K paths are fixed candidates with a point-mass q (n-gram lookup), not i.i.d. draws from q: multi-path
    # methods then verify them with the candidate-tree rule (docs/algorithms.md §6.1)
    deterministic: bool = False
    # The paths merged by common prefix as the draft model grew it while feeding them; None: none grown (lookup and
    # empty blocks). Read through `tree`.
    grown_tree: PrefixTree | None = field(default=None, repr=False)

    @property
    def tree(self) -> PrefixTree:
        """Return the paths' prefix tree, the one the target's pass and the multi-path verifiers read: the draft's
        own, or one built from `tokens` where none was grown or the tokens were changed after drafting."""
        if self.grown_tree is None or self.grown_tree.paths() != self.tokens:
            self.grown_tree = PrefixTree.of(self.tokens)
        return self.grown_tree

    @property
    def length(self) -> int:
        """Return γ', the common length of the paths."""
        return len(self.tokens[0]) if self.tokens else 0

    def as_tensor(self) -> torch.Tensor:
        """Return the draft tokens as a LongTensor `[K, γ']`."""
        return torch.tensor(self.tokens, dtype=torch.long).view(len(self.tokens), self.length)


class StopRule(Protocol):
    """Decides, token by token, whether single-path drafting goes on (SPRINTER's learned verifier, §3.1; the draft's
    confidence, `verispec.drafters.confidence`)."""

    uses_hidden: bool  # whether `score` reads the hidden state (else the draft's forwards need not return it)

    def score(self, hidden: torch.Tensor | None, q_row: torch.Tensor, token: int, position: int) -> float:
        """Return a score for the drafted `token` at 1-based `position` in the run (`hidden`: None unless
        `uses_hidden`)."""
        ...

    def accepts(self, score: float) -> bool:
        """Return whether drafting continues after a token with this score."""
        ...

    def accept_mask(self, hidden: torch.Tensor | None, q_row: torch.Tensor, position: int) -> torch.Tensor:
        """Return `[V]` float64: 1 where drafting would continue had token v been drawn at this position, else 0."""
        ...


def draft_paths(
    drafter: CausalLM | None,
    tokens: list[int],
    n_paths: int,
    gamma: int,
    sampling: SamplingConfig,
    generator: torch.Generator,
    eos_token_ids: frozenset[int],
    vocab_size: int,
    stop_rule: StopRule | None = None,
    keep_hidden: bool = False,
    processors: RoundProcessors | None = None,
    noise: KeyedNoise | None = None,
    laws: bool = True,
) -> DraftBlock:
    """Return `n_paths` i.i.d. draft paths of length ≤ `gamma` continuing `tokens`.

    Drafting stops early once every path holds an EOS: nothing after an EOS can be kept, and a rule that looks
    only at drafted tokens keeps every verifier lossless (§1.4, "Variable γ"). With a `stop_rule` (one path
    only), drafting also stops at the first token the rule rejects, scored on the hidden state that produced
    its q (§3.1) or on q alone; that token ends the block. The hidden state that produced each token's q is kept in
    `DraftBlock.hiddens` with a stop rule (it scores them) or with `keep_hidden` (one path: training data).
    `processors`: the round's logit processors; a path's row at depth i counts its first i tokens as generated, as
    the target's row at the same position does. `noise`: draw by keyed races (`verispec.verify.keyed`; one path),
    the token at depth i on the noise of its position in the sequence, len(tokens) + i. `laws`: False where the
    round's verifier matches tokens only (keyed draws, or greedy sampling verified by matching; one path, no stop
    rule): each token is then chosen from the draft's logits as its law would choose it (`KeyedNoise.choose`, the
    first argmax), and the block's q is None, saving a float64 law per drafted token.
    """
    assert stop_rule is None or n_paths == 1, "a stop rule drafts a single path"
    assert noise is None or n_paths == 1, "keyed draws draft a single path (paths on one noise would be one path)"

    laws = laws or stop_rule is not None  # a stop rule scores each token's q
    assert laws or n_paths == 1, "tokens chosen without their laws are matched on one path"

    def pick(law: torch.Tensor | None, logits: torch.Tensor, offsets: RowOffsets | None, depth: int) -> int:
        """Return a path's token at `depth` from its row: its `logits` `[1, V]` (one path: with the row's processor
        `offsets`) or its law."""
        if noise is not None:
            return noise.choose(logits[0], len(tokens) + depth, sampling, offsets)
        if law is None:  # greedy and matched: the token its point mass would be on
            return int(greedy_tokens(logits, offsets)[0, 0])
        return draw(law, sampling, generator)

    assert not keep_hidden or n_paths == 1, "hidden states are kept for a single path"
    keep_hidden = keep_hidden or (stop_rule is not None and stop_rule.uses_hidden)
    paths: list[list[int]] = [[] for _ in range(n_paths)]
    positions: list[list[int]] = [[] for _ in range(n_paths)]
    if drafter is None or gamma == 0:
        return DraftBlock(paths, torch.empty(n_paths, 0, vocab_size, dtype=torch.float64), positions, 0, 0)
    new = tokens[drafter.cache_length :]  # the committed tokens the draft cache lacks (at least one)
    out = drafter.forward(new, n_logits=1, return_hidden=keep_hidden)
    # Each depth's laws are written into q's own rows as they are drawn from, not stacked at the end: a copy of
    # K·γ rows of the vocabulary (4.8 MB for one path of 4), whose cache lines the draft's forwards have evicted.
    q = torch.empty(n_paths, gamma, out.logits.shape[-1], dtype=torch.float64, device=out.logits.device) \
        if laws else None
    offsets = processors.rows([[]]) if processors is not None else None
    q_root = process_logits(out.logits, sampling, q[:1, 0], offsets) if q is not None else None  # [1, V]
    if q is not None and n_paths > 1:
        q[1:, 0] = q_root
    forwards, fed = 1, len(new)
    for path in paths:
        path.append(pick(None if q_root is None else q_root[0], out.logits, offsets, 0))
    tree = PrefixTree(node_of=[[] for _ in range(n_paths)])  # the round's one tree, grown as the paths are drawn
    fresh = tree.grow([path[-1] for path in paths])  # the nodes the last draws added: what the next forward feeds
    scores: list[float] = []
    hiddens: list[torch.Tensor] = []
    hidden = out.hidden[0] if keep_hidden else None
    if hidden is not None:
        hiddens.append(hidden)
    if stop_rule is not None:
        scores.append(stop_rule.score(hidden, q_root[0], paths[0][0], 1))
    for depth in range(1, gamma):
        if all(any(t in eos_token_ids for t in path) for path in paths):
            break
        if stop_rule is not None and not stop_rule.accepts(scores[-1]):
            break
        start = drafter.cache_length
        # Paths with the same prefix have the same next law: the tree's new nodes are the distinct prefixes (i.i.d.
        # draws from a confident draft often coincide), each fed once, and every path takes its node's row and
        # cache position. rows[j]: a path through new node j; row_of[k]: path k's row (new nodes are numbered on).
        ends = [nodes[-1] for nodes in tree.node_of]
        rows = [ends.index(node) for node in fresh]
        row_of = [end - fresh[0] for end in ends]
        if n_paths == 1:
            out = drafter.forward([tree.tokens[fresh[0]]], n_logits=1, return_hidden=keep_hidden)  # [1, V]
        else:
            parents = [positions[k][-1] if positions[k] else start - 1 for k in rows]  # each prefix's last token
            out = drafter.forward([tree.tokens[node] for node in fresh], n_logits=len(rows),
                                  parents=parents)  # [rows, V]
        forwards, fed = forwards + 1, fed + len(rows)
        offsets = processors.rows([paths[k] for k in rows]) if processors is not None else None  # row j: rows[j]
        q_depth = None
        if q is not None and len(rows) == n_paths:  # row k is path k's: the laws go straight into q
            q_depth = process_logits(out.logits, sampling, q[:, depth], offsets)  # [K, V]
        elif q is not None:
            q_depth = q[:, depth]
            q_depth.copy_(process_logits(out.logits, sampling, offsets=offsets).index_select(
                0, torch.tensor(row_of, device=q.device)))
        for k, path in enumerate(paths):
            positions[k].append(start + row_of[k])
            row = out.logits[row_of[k] : row_of[k] + 1]
            path.append(pick(None if q_depth is None else q_depth[k], row, offsets if n_paths == 1 else None, depth))
        fresh = tree.grow([path[-1] for path in paths])
        hidden = out.hidden[0] if keep_hidden else None
        if hidden is not None:
            hiddens.append(hidden)
        if stop_rule is not None:
            scores.append(stop_rule.score(hidden, q_depth[0], paths[0][-1], depth + 1))
    decisions = [stop_rule.accepts(score) for score in scores] if stop_rule is not None else []
    drafted = forwards  # one depth per forward; fewer than γ where drafting stopped early
    if q is not None:
        q = q[:, :drafted] if n_paths == 1 or drafted == gamma else q[:, :drafted].contiguous()
    return DraftBlock(paths, q, positions, forwards, fed, scores, decisions, hiddens, grown_tree=tree)


def merge_paths(paths: list[list[int]]) -> PrefixTree:
    """Return the prefix tree of `paths` (identical prefixes share nodes; duplicate paths share all of them)."""
    return PrefixTree.of(paths)
