"""A round's passes over the models, for the decode loop (`verispec.engine`) and the measurements built on it:
reading a prompt, the decoder's one pass over a drafted block (`score_block`: a prefix tree when K > 1, with the
processed law of every path position), and rolling both caches back to the committed tokens (`roll_back`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import cached_property

import torch

from verispec.drafting import DraftBlock, PrefixTree
from verispec.logprobs import TokenLogprob, log_laws, token_logprobs
from verispec.models.protocol import CausalLM
from verispec.processors import RoundProcessors, RowOffsets, tree_prefixes
from verispec.sampling import SamplingConfig, adjust_logits, greedy_tokens, process_logits, race, race_scores
from verispec.trace import Trace
from verispec.verify import PathLaws


@dataclass
class ScoredBlock:
    """A drafted block and the decoder's one pass over it (`score_block`)."""

    block: DraftBlock
    tree: PrefixTree  # the block's paths merged by common prefix: the nodes the pass fed
    logits: torch.Tensor  # [N+1, V] the decoder's logits at the root (last committed token) and at each tree node
    fed: int  # tokens the pass processed: the committed tokens the cache lacked, then the tree nodes
    sampling: SamplingConfig
    offsets: RowOffsets | None = None  # the logit processors' offsets of the N+1 rows; None: no processor set

    @cached_property
    def p(self) -> torch.Tensor:
        """Return the processed law (float64) sampled from at every path position, `[K, γ'+1, V]` (computed on
        first use, so that the loop times it as verification, not as the decoder's pass)."""
        return self.per_path(self._process(self.logits, None, None))

    @cached_property
    def laws(self) -> PathLaws:
        """Return the same law as `p`, each node's row processed on first read (for verifiers that read few rows)."""
        if "p" in self.__dict__:  # already processed: hand out its rows
            return PathLaws.of(self.p)
        return PathLaws(lambda nodes, out: self._process(node_logits(self.logits, nodes), out, nodes),
                        path_nodes(self.tree), self.logits.shape[-1])

    def greedy_choices(self, path: int = 0) -> list[int]:
        """Return the token greedy sampling takes at each row of `path` (γ'+1 ids): the first argmax of each row's
        logits with the processors' offsets, the token its point-mass law `p` would put all its mass on, without
        making that float64 law."""
        nodes = list(range(self.logits.shape[0])) if self.tree.is_chain else path_nodes(self.tree)[path].tolist()
        rows = node_logits(self.logits, nodes)
        return greedy_tokens(rows, self._offsets(nodes)).view(-1).tolist()

    def race_choice(self, row: int, gumbel: torch.Tensor) -> int:
        """Return the token a keyed draw takes at row `row` of path 0 (a chain: keyed draws draft one path) on the
        noise `gumbel` of its position: the race over that row's log-weights (`race_scores`), no law made."""
        return race(race_scores(self.logits[row : row + 1], self.sampling, self._offsets([row])).view(-1), gumbel)

    def gate_law(self) -> torch.Tensor:
        """Return the lossy gates' law p̃ of every row, `[N+1, V]` float64: the softmax at temperature 1, without
        top-k / top-p, of the logits with the logit processors applied (a banned token is banned for a gate too)."""
        return torch.softmax(adjust_logits(self.logits, self.offsets).to(torch.float64), dim=-1)

    def logprobs(self, path: int, tokens: list[int], k: int) -> list[TokenLogprob]:
        """Return the log-probabilities of `tokens`, the first tokens emitted on `path` (its kept prefix, then the
        extra token), each from the row it was verified against: row i of the path for token i (`verispec.logprobs`)."""
        if not self.sampling.greedy and "p" in self.__dict__:  # the very law the round used
            return token_logprobs(self.p[path, : len(tokens)].log(), tokens, k)
        nodes = path_nodes(self.tree)[path, : len(tokens)].tolist()
        return token_logprobs(log_laws(node_logits(self.logits, nodes), self.sampling, self._offsets(nodes)), tokens, k)

    def _offsets(self, nodes: list[int]) -> RowOffsets | None:
        return None if self.offsets is None else self.offsets.select(nodes)

    def _process(self, logits: torch.Tensor, out: torch.Tensor | None, nodes: list[int] | None) -> torch.Tensor:
        """Return `process_logits` of the rows `nodes` (None: all N+1), with their offsets only when a processor
        is set: the call without processors stays the one it was."""
        if self.offsets is None:
            return process_logits(logits, self.sampling, out)
        offsets = self.offsets if nodes is None else self.offsets.select(nodes)
        return process_logits(logits, self.sampling, out, offsets)

    def per_path(self, node_rows: torch.Tensor) -> torch.Tensor:
        """Return rows `[N+1, ...]` of the root and the tree nodes laid out per path, `[K, γ'+1, ...]`."""
        return path_rows(node_rows, self.tree)


def score_block(decoder: CausalLM, tokens: list[int], block: DraftBlock, sampling: SamplingConfig,
                processors: RoundProcessors | None = None) -> ScoredBlock:
    """Run the decoder once over the committed `tokens` its cache lacks plus the draft paths of `block`; return
    the logits with, through `.p`, the processed law `[K, γ'+1, V]` (row i of path k: after its first i tokens).
    `processors`: the round's logit processors; each tree node's row counts the drafted tokens up to it.

    The cache must lack at least the last committed token (the root's logits); `roll_back` restores that."""
    logits, tree, fed = tree_pass(decoder, tokens, block)
    offsets = processors.rows(tree_prefixes(tree.tokens, tree.parents)) if processors is not None else None
    return ScoredBlock(block, tree, logits, fed, sampling, offsets)


def roll_back(decoder: CausalLM, draft_model: CausalLM | None, base: int, scored: ScoredBlock, path: int,
              accepted: int) -> None:
    """Roll both caches back to the committed tokens they saw: the first `base` (the tokens before the block),
    then the first `accepted` draft tokens of `path`. A draft model that drafted nothing is left as it was."""
    tree = scored.tree
    _keep(decoder, base, [base + node for node in tree.node_of[path][:accepted]], tree.is_chain)
    if draft_model is not None and scored.block.forwards:
        _keep(draft_model, base, scored.block.positions[path][:accepted], tree.is_chain)


def _keep(model: CausalLM, base: int, kept: list[int], chain: bool) -> None:
    """Keep the first `base` cached tokens and then the cache positions `kept` (one path)."""
    if chain:  # the path follows the prefix contiguously: rolling back is moving a length
        model.truncate(min(model.cache_length, base + len(kept)))
    else:
        model.keep(list(range(min(base, model.cache_length))) + kept)


def read_prompt(models: list[tuple[CausalLM, str]], tokens: list[int], chunk: int, trace: Trace) -> None:
    """Feed each of `models` (with its role, "target" or "draft", for the trace's counts) all but the last of the
    prompt `tokens`, in passes of at most `chunk` tokens; the first round then reads the last prompt token with
    its block, as it reads any round's.

    Why: a batched server runs a long prompt's pass beside the other sequences' rounds; read whole, it stalls them
    for the whole prompt, read in chunks they go on between its chunks (`verispec.serve.batched`). On the row-exact
    paths (int4, int8) a chunk of at most the decode kernels' rows (`prompt_rows`) gives every position the bits
    of one-token passes, so the tokens are the same for any such chunk; a longer prompt read whole runs other
    kernels (attention over the whole prompt at once; prompt copies where the host makes them). So a decode reads
    its prompt the same way alone and in a batch only with the same setting."""
    fed = len(tokens) - 1
    for model, role in models:
        t0 = time.perf_counter()
        calls = 0
        for begin in range(0, fed, chunk):
            model.forward(tokens[begin : min(begin + chunk, fed)], n_logits=1)
            calls += 1
        seconds = time.perf_counter() - t0
        if role == "draft":
            trace.draft_calls, trace.draft_tokens = trace.draft_calls + calls, trace.draft_tokens + fed
            trace.time_draft += seconds
        else:
            trace.target_calls, trace.target_tokens = trace.target_calls + calls, trace.target_tokens + fed
            trace.time_target += seconds


def tree_pass(decoder: CausalLM, tokens: list[int], block: DraftBlock) -> tuple[torch.Tensor, PrefixTree, int]:
    """Run one decoder pass over the committed `tokens` its cache lacks plus the draft paths of `block`, merged into
    a prefix tree (tree attention unless the tree is a chain); return (logits `[N+1, V]`: the root, then each tree
    node; the tree; the number of tokens fed). The cache must lack at least the last committed token."""
    base = len(tokens)
    tree = block.tree  # the one the draft grew (or built from a lookup's candidates)
    new = tokens[decoder.cache_length :]
    prompt_rows = decoder.prompt_rows
    if prompt_rows is not None and len(new) > 1 and tree.tokens and len(new) + len(tree.tokens) > prompt_rows:
        # This decoder runs forwards over more than `prompt_rows` tokens on other kernels than decode passes (a
        # prompt's attention, and prompt copies where the host makes them): read the committed tokens alone, as `ar`
        # reads its prompt, so that the block's positions (and the cache entries kept from them) come from the
        # kernels `ar` computes them with.
        root = decoder.forward(new, n_logits=1).logits
        parents = None if tree.is_chain else [base - 1 if parent < 0 else base + parent for parent in tree.parents]
        nodes = decoder.forward(tree.tokens, n_logits=len(tree.tokens), parents=parents).logits
        return torch.cat([root, nodes]), tree, len(new) + len(tree.tokens)
    parents = None
    if not tree.is_chain:
        parents = list(range(base - len(new) - 1, base - 1))  # the committed tokens continue the chain
        parents += [base - 1 if parent < 0 else base + parent for parent in tree.parents]
    logits = decoder.forward(new + tree.tokens, n_logits=len(tree.tokens) + 1, parents=parents).logits
    return logits, tree, len(new) + len(tree.tokens)


def node_logits(logits: torch.Tensor, nodes: list[int]) -> torch.Tensor:
    """Return the rows `nodes` of `logits` `[N+1, V]`: a view where they are consecutive (GBV reads one node at a
    time, and processing widens the rows to float64 anyway, so a gathered copy would be a wasted pass)."""
    if nodes == list(range(nodes[0], nodes[0] + len(nodes))):
        return logits[nodes[0] : nodes[0] + len(nodes)]
    return logits.index_select(0, torch.tensor(nodes, device=logits.device))


def path_nodes(tree: PrefixTree) -> torch.Tensor:
    """Return `[K, γ'+1]` long: which of the rows `[N+1, ...]` (the root, then the tree nodes) is row i of path k,
    the node after its first i tokens."""
    return torch.tensor([[0] + [1 + node for node in nodes] for nodes in tree.node_of])


def path_rows(node_rows: torch.Tensor, tree: PrefixTree) -> torch.Tensor:
    """Return the rows `[N+1, ...]` of the root and the tree nodes (from `tree_pass`) laid out per path,
    `[K, γ'+1, ...]`: row i of path k is the node after its first i tokens (the multi-path contract)."""
    if tree.is_chain:
        return node_rows.unsqueeze(0)  # the nodes are the path, in order
    rows = path_nodes(tree)  # [K, γ'+1]
    # index_select, not node_rows[rows]: the same copy, measured 2.8x faster on 15 rows of 151,936 float64
    return torch.index_select(node_rows, 0, rows.view(-1).to(node_rows.device)).view(*rows.shape, *node_rows.shape[1:])
