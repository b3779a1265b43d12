"""Training: the tiny tri-mode model on its task domain, the self-speculation adapter and its sampler head on a
model's own answers to the chat prompt set, and the data each reads."""
