"""Verification of drafts: which draft tokens to keep, and the token that follows them.

Two rules, both AcceptRule-shaped (engine.backend), chosen by rule_for(params):

- greedy (temperature 0): keep drafts while each equals the model's penalised argmax; then emit that argmax. The
  output is greedy decoding's, token for token.
- exact speculative sampling (Leviathan et al. 2023, "Fast Inference from Transformers via Speculative Decoding"):
  draft x_i, proposed with probability q_i(x_i), is kept with probability min(1, p_i(x_i) / q_i(x_i)), where p_i is
  the model's sampling distribution (engine.sampling.sampling_probs: penalties, temperature, top-k/p, min-p) given
  everything before it. The first rejected position draws instead from norm(max(0, p_i - q_i)); when every draft is
  kept, one more token is drawn from p_d. Each emitted token then has exactly the distribution plain sampling gives.

  Deterministic drafts (n-gram lookup, greedy MTP drafting: the drafter's choice is a function of the context, so q_i
  is one-hot at x_i) reduce this to: keep x_i with probability p_i(x_i); on rejection draw from p_i with x_i removed
  and renormalised. Only a SampledDraft, whose tokens were drawn from the probabilities it carries, uses the general
  rule; a Draft's logits are informational (greedy MTP drafts carry them) and never stand in for q.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from engine.backend import AcceptRule, Draft, TokenSequence, accept_choices
from engine.sampling import SamplingParams, draw, keep_or_resample, sample, sampling_probs


@dataclass(slots=True)
class SampledDraft(Draft):
    """Drafts drawn at random: probs[i] ([d, V]) is the distribution tokens[i] was drawn from (q in Leviathan)."""

    probs: np.ndarray | None = None

    def truncated(self, num: int) -> SampledDraft:
        """The first num drafts, with their distributions."""
        logits = None if self.logits is None else self.logits[:num]
        probs = None if self.probs is None else self.probs[:num]
        return SampledDraft(self.tokens[:num], logits, probs)


def accept_or_resample(p: np.ndarray, x: int, q: np.ndarray | None, rng: np.random.Generator) -> tuple[bool, int]:
    """One position of speculative sampling: (kept?, token). q None means x was proposed deterministically."""
    # p, q: [V] probability vectors
    q_x = 1.0 if q is None else float(q[x])
    assert q_x > 0, "a sampled draft token must have probability > 0 under the distribution it was drawn from"
    if rng.random() * q_x < p[x]:  # u < p(x) / q(x), without dividing by a tiny q(x)
        return True, x
    if q is None:
        residual = p.copy()
        residual[x] = 0.0
    else:
        residual = np.maximum(p - q, 0.0)
    if residual.sum() <= 0.0:
        # only reachable through rounding when p is (almost) q: then rejection has probability ~0, keep x
        return True, x
    return False, draw(residual, rng)


def keep_or_draw(logits: np.ndarray, params: SamplingParams, x: int, rng: np.random.Generator,
                 history: Sequence[int] = (), prompt: Sequence[int] = ()) -> tuple[bool, int]:
    """One position of speculative sampling for a draft x proposed deterministically: (kept?, token), without forming
    p where the float32 weights can stand for it (sampling.keep_or_resample), else from the float64 distribution."""
    # logits: [V]
    step = keep_or_resample(logits, params, x, rng, history=history, prompt=prompt)
    if step is None:
        step = accept_or_resample(sampling_probs(logits, params, history=history, prompt=prompt), x, None, rng)
    return step


def greedy_accept(draft: Draft, logits: np.ndarray, seq: TokenSequence, params: SamplingParams) -> list[int]:
    """Keep drafts while they equal the penalised argmax; end with the argmax after them (1..d+1 tokens)."""
    # logits: [1 + d, V]
    out: list[int] = []
    for i in range(len(draft.tokens) + 1):
        token = sample(logits[i], params, history=_history(seq, out), prompt=seq.prompt)  # greedy: the argmax
        out.append(token)
        if i == len(draft.tokens) or token != draft.tokens[i]:
            break
    return out


def speculative_accept(draft: Draft, logits: np.ndarray, seq: TokenSequence, params: SamplingParams) -> list[int]:
    """Exact speculative sampling over the drafts (see the module docstring); returns 1..d+1 tokens."""
    # logits: [1 + d, V]
    probs = draft.probs if isinstance(draft, SampledDraft) else None
    out: list[int] = []
    for i, x in enumerate(draft.tokens):
        history = _history(seq, out)
        if probs is None:
            kept, token = keep_or_draw(logits[i], params, x, seq.rng, history, seq.prompt)
        else:
            p = sampling_probs(logits[i], params, history=history, prompt=seq.prompt)
            kept, token = accept_or_resample(p, x, probs[i], seq.rng)
        out.append(token)
        if not kept:
            return out
    # every draft kept: the token after them comes from the model alone
    out.append(sample(logits[len(draft.tokens)], params, seq.rng, history=_history(seq, out), prompt=seq.prompt))
    return out


# Both rules may take each row's token as the backend chose it where the logits are (Backend.verify_choose: the
# same arithmetic on the device, penalties included, for deterministic drafts).
greedy_accept.on_choices = accept_choices
speculative_accept.on_choices = accept_choices


def _history(seq: TokenSequence, new: Sequence[int]) -> list[int]:
    """Generated tokens as plain sampling would see them at this position (penalties look at them)."""
    return seq.generated + list(new)


def rule_for(params: SamplingParams) -> AcceptRule:
    """The verification rule for params: greedy at temperature 0, exact speculative sampling otherwise."""
    return greedy_accept if params.is_greedy else speculative_accept


def with_logit_bias(rule: AcceptRule, bias: np.ndarray) -> AcceptRule:
    """A rule that adds bias ([V], OpenAI's logit_bias) to every row of the model's logits before verifying."""

    def biased(draft: Draft, logits: np.ndarray, seq: TokenSequence, params: SamplingParams) -> list[int]:
        """The inner rule on biased logits."""
        # logits: [1 + d, V]; the bias is part of the target distribution, so verification stays exact
        return rule(draft, logits + bias[None, :], seq, params)

    return biased
