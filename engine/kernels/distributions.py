"""The distributions a problem's correctness inputs are redrawn from, by name and description:
torch-free, so describing a plan or a report does not import torch (the redrawing itself is
engine.kernels.input_variants, in the harness's worker)."""

# The distributions every problem's first main set is redrawn from, in this order. A problem
# whose inputs must keep a structure beyond their sign and range (sorted, positive-definite,
# normalised rows) sets INPUT_DISTRIBUTIONS = () in its inputs module.
DISTRIBUTIONS = ("uniform", "pareto")
DESCRIPTIONS = {
    "problem": "the problem's own get_inputs()",
    "uniform": "uniform between each tensor's own minimum and maximum",
    "pareto": "heavy-tailed (Pareto, alpha 1.5), with each tensor's sign, and within [min, max] for values in [0, 1]",
}
