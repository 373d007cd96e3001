"""The reference forward pass of every supported architecture over T tokens at once, on a ModelState.

A pass computes without committing: attention layers write K/V past the committed length, DeltaNet layers return
their new states beside the old ones. commit(state, pass, n) then makes the first n tokens part of the sequence.
That is how a verify pass over 1 + d tokens is rolled back to its accepted prefix without recomputing anything.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from engine.backend import restrict_draft_logits
from engine.reference import ops
from engine.reference.qwen35 import deltanet_layer, empty_deltanet_state, mtp_block
from engine.reference.state import DeltaNetState, KVCache, LayerState, ModelState, PendingPass
from engine.reference.transformer import attention_layer
from engine.reference.weights import ReferenceWeights

if TYPE_CHECKING:
    from engine.model.config import ModelConfig

ChooseToken = Callable[[np.ndarray], int]


def argmax_token(logits: np.ndarray) -> int:
    """Greedy choice: the highest logit (lowest id on ties)."""
    return int(np.argmax(logits))


class ReferenceModel:
    """A model's config and float32 weights, with the forward pass, the output head and the MTP head."""

    def __init__(self, cfg: ModelConfig, weights: ReferenceWeights, use_mtp: bool = True):
        if len(weights.layers) != cfg.num_layers:
            raise ValueError(f"{len(weights.layers)} layers of weights for a {cfg.num_layers}-layer config")
        self.cfg, self.weights = cfg, weights
        # the MTP head runs only where the file has one; without it the model cannot draft for itself
        self.has_mtp = use_mtp and cfg.num_nextn_layers > 0 and len(weights.nextn) > 0

    def new_state(self) -> ModelState:
        """The state of an empty sequence."""
        cfg = self.cfg
        layers: list[LayerState] = [
            KVCache.empty(cfg.num_kv_heads, cfg.head_dim) if kind == "attention" else empty_deltanet_state(cfg)
            for kind in cfg.layer_kinds
        ]
        mtp = KVCache.empty(cfg.num_kv_heads, cfg.head_dim) if self.has_mtp else None
        return ModelState(layers, mtp, np.zeros(cfg.hidden_size, np.float32))

    def embed(self, tokens: list[int]) -> np.ndarray:
        """Token embeddings, with a clear error for ids outside the vocabulary."""
        # -> [T, H]
        ids = np.asarray(tokens, dtype=np.int64)
        bad = ids[(ids < 0) | (ids >= self.weights.token_embd.shape[0])]
        if bad.size:
            raise ValueError(f"token id {int(bad[0])} is outside the vocabulary of {self.weights.token_embd.shape[0]}")
        return self.weights.token_embd[ids]

    def forward(self, state: ModelState, tokens: list[int], keep_steps: bool) -> PendingPass:
        """Run T tokens at positions state.num_tokens.. through the trunk (and the MTP head's cache), uncommitted.

        keep_steps=True (verify) keeps every token's DeltaNet state, so any prefix can be committed;
        keep_steps=False (prefill) uses the chunked DeltaNet form and can only commit all T tokens.
        """
        start = state.num_tokens
        x = self.embed(tokens)  # [T, H]
        pending = PendingPass(start=start, tokens=list(tokens), hidden=x)
        for i, (kind, w) in enumerate(zip(self.cfg.layer_kinds, self.weights.layers, strict=True)):
            layer = state.layers[i]
            if kind == "attention":
                assert isinstance(layer, KVCache)
                x = attention_layer(x, w, self.cfg, layer, start)
            else:
                assert isinstance(layer, DeltaNetState)
                x, pending.deltanet[i] = deltanet_layer(x, w, self.cfg, layer, keep_steps)
        pending.hidden = ops.rms_norm(x, self.weights.output_norm, self.cfg.rms_eps)
        if self.has_mtp:
            self._mtp_catch_up(state, pending)
        return pending

    def _mtp_catch_up(self, state: ModelState, pending: PendingPass) -> None:
        """Feed the MTP cache the pairs (token p, trunk hidden of p - 1) of this pass, as llama.cpp does."""
        assert state.mtp is not None
        previous = np.concatenate([state.last_hidden[None], pending.hidden[:-1]], axis=0)  # [T, H]
        embeddings = self.weights.mtp_embeddings()[np.asarray(pending.tokens)]
        mtp_block(embeddings, previous, self.weights.nextn[0], self.cfg, state.mtp, pending.start)

    def logits(self, hidden: np.ndarray) -> np.ndarray:
        """The output head: logits of each output-normed hidden state."""
        # hidden: [T, H] -> [T, V]
        return ops.matmul(hidden, self.weights.output)

    def commit(self, state: ModelState, pending: PendingPass, n: int) -> None:
        """Make the first n tokens of a pass part of the sequence; the rest of it is forgotten."""
        num_tokens = len(pending.tokens)
        if not 1 <= n <= num_tokens:
            raise ValueError(f"cannot commit {n} of {num_tokens} tokens")
        assert pending.start == state.num_tokens, "a pass can only be committed onto the state it started from"
        for i, layer in enumerate(state.layers):
            if isinstance(layer, KVCache):
                layer.length = pending.start + n
            else:
                steps = pending.deltanet[i]
                layer.conv, layer.ssm = steps.conv_after(n), steps.ssm_after(n)
        if state.mtp is not None:
            state.mtp.length = pending.start + n
        state.last_hidden = pending.hidden[n - 1].copy()
        state.num_tokens = pending.start + n

    def draft(
        self, state: ModelState, token: int, num_draft: int, choose: ChooseToken = argmax_token,
        vocab: int | None = None,
    ) -> tuple[list[int], np.ndarray]:
        """Draft num_draft tokens after `token` (the pending token at position num_tokens) with the MTP head.

        Step i runs the MTP block on (token_i, hidden_i) at position num_tokens + i, where hidden_0 is the trunk's
        hidden of the last committed token and hidden_i (i > 0) is the MTP block's own output of step i - 1.
        Its K/V go past the committed length, so the state is unchanged. vocab: draft from the first `vocab` ids only
        (engine/backend.py DRAFT_VOCAB_ENV; their logits past it -inf). Returns (tokens, logits [d, V]).
        """
        if not self.has_mtp:
            raise ValueError("this model has no MTP head to draft with")
        assert state.mtp is not None
        hidden, drafted, all_logits = state.last_hidden[None], [], []
        for i in range(num_draft):
            embedding = self.weights.mtp_embeddings()[[token]]
            hidden = mtp_block(embedding, hidden, self.weights.nextn[0], self.cfg, state.mtp, state.num_tokens + i)
            logits = ops.matmul(hidden, self.weights.mtp_output())[0]
            if vocab is not None:
                logits = restrict_draft_logits(logits, vocab)
            token = choose(logits)
            drafted.append(token)
            all_logits.append(logits)
        vocab = self.weights.mtp_output().shape[0]
        return drafted, np.stack(all_logits) if all_logits else np.zeros((0, vocab), np.float32)
