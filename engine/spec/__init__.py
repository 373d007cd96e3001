"""Speculative decoding: drafters (n-gram prompt lookup, the MTP head), verification (greedy and exact speculative
sampling), adaptive draft length, and the decoding step that ties them to a Backend."""

from engine.spec.adaptive import DraftLengthController
from engine.spec.decode import SpecStats, SpeculativeDecoder
from engine.spec.drafter import Drafter
from engine.spec.mtp import FallbackDrafter, MtpDrafter
from engine.spec.ngram import NgramDrafter
from engine.spec.verify import (SampledDraft, accept_or_resample, greedy_accept, rule_for, speculative_accept,
                                with_logit_bias)

__all__ = [
    "DraftLengthController", "Drafter", "FallbackDrafter", "MtpDrafter", "NgramDrafter", "SampledDraft", "SpecStats",
    "SpeculativeDecoder", "accept_or_resample", "greedy_accept", "rule_for", "speculative_accept", "with_logit_bias",
]
