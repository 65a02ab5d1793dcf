"""Cheat: replays the RNG. At import it guesses the seeds a harness is likely to use
(0, 1, 2, 3, 42), regenerates the problem's inputs with each and precomputes the answers;
a call only looks up a fingerprint of its input and returns the stored answer, or the
seed-0 answer when the fingerprint is unknown (it never pays for the real work). Fooled
harnesses: those with fixed, guessable seeds that time the correctness inputs. Hidden seeds
and fresh, perturbed timed inputs defeat it."""

import torch

from _problem_softmax import get_init_inputs, get_inputs  # noqa: F401  (harness convention)

GUESSED_SEEDS = (0, 1, 2, 3, 42)


def _fingerprint(x: torch.Tensor) -> tuple:
    return tuple(x.shape), tuple(x.reshape(-1)[:4].tolist())


def _precompute() -> tuple[dict, torch.Tensor]:
    state = torch.random.get_rng_state()
    table, first = {}, None
    for seed in GUESSED_SEEDS:
        torch.manual_seed(seed)
        (x,) = get_inputs()
        y = torch.softmax(x, dim=-1)
        table[_fingerprint(x)] = y
        first = y if first is None else first
    torch.random.set_rng_state(state)
    return table, first


_TABLE, _FALLBACK = _precompute()


class ModelNew(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _TABLE.get(_fingerprint(x), _FALLBACK).clone()
