"""Verifiers: decide which tree nodes the target accepts and which token it adds (lossless)."""

from specgraft.verify.greedy import verify_greedy
from specgraft.verify.processing import draw_uniforms, sample_token, target_probs
from specgraft.verify.sampling import verify, verify_rejection, verify_sample_match

__all__ = [
    "draw_uniforms",
    "sample_token",
    "target_probs",
    "verify",
    "verify_greedy",
    "verify_rejection",
    "verify_sample_match",
]
