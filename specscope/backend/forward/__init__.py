"""The forward layer (model ← forward ← engine): `plan` (a forward's `ForwardPlan`, the backends' `run(plan)`
protocol, the `Eager` backend) and the backends besides the model's own modules.

- `fused_step`: short causal chunks (decode steps, few-row verifies and drafts) in one C call (kernels/cpu_decode.c).
- `invariant`: the batch-invariant torch forward (any device): several plans in one forward, each row bitwise what
  it is alone. `choice` picks the runtime's backend of the two (`--forward auto|fused|torch`).
- `folded`: SpecFold's folded verify of a branch tree, by backend: the Triton kernel pipeline (`KernelFoldedForward`),
  the packed float32 CPU path (`packed`, with kernels/cpu_fold.c); their contract is `fold_contract` (the float64
  oracle they are tested against is tests/support/fold_oracle.py).

`kernels/` holds the kernels themselves (Triton ops and their PyTorch twins, the C sources and their build) and
imports nothing from here.
"""
